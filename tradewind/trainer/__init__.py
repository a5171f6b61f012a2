"""Trainer: the models, the optimizers, and the loop that trains, checkpoints, samples and exports them.

This layer executes runs: from a `TrainConfig` (`tradewind.runs`, which describes a run without JAX) to a finished
run folder: the registered models (`Llama`, `GPT2`), the optimizers and schedules, the pure train and eval
steps, the device mesh, the loop that writes `metrics.jsonl`, TensorBoard events, checkpoints and
`summary.json`, resume, sampling, Hugging Face export/import and the profiler. It may import only
`tradewind.core`, `tradewind.cluster`, `tradewind.data` and `tradewind.runs` (plus JAX, flax, optax and orbax).

Entry points: jobs call `tradewind.trainer.start:train_job` (and the sampling and profiling jobs' callables);
`python -m tradewind.trainer RUN_DIR` trains a run folder by hand; `python -m tradewind.trainer.cli export ...`
is `tradewind export`.
"""

from __future__ import annotations

from tradewind.core import lazy_getattr

# Every name loads on first use (PEP 562): a job's entry module (`start`, `compile`, `sample_worker`) and
# `tradewind --help` (which imports `tradewind.trainer.cli`) import this package before JAX may start.
_LAZY = {
    "train": "tradewind.trainer.loop",
    "run_steps": "tradewind.trainer.loop",
    "setup_training": "tradewind.trainer.setup",
    "TrainSetup": "tradewind.trainer.setup",
    "evaluate": "tradewind.trainer.setup",
    "TrainState": "tradewind.trainer.state",
    "build_mesh": "tradewind.trainer.sharding",
    "Llama": "tradewind.trainer.models",
    "GPT2": "tradewind.trainer.models",
    "build_model": "tradewind.trainer.models",
    "count_params": "tradewind.trainer.models",
    "OPTIMIZERS": "tradewind.trainer.optimizer",
    "register_optimizer": "tradewind.trainer.optimizer",
    "build_optimizer": "tradewind.trainer.optimizer",
    "build_schedule": "tradewind.trainer.optimizer",
    "Checkpointer": "tradewind.trainer.orbax_checkpoint",
    "read_checkpoint": "tradewind.trainer.checkpoint",
    "load_run_model": "tradewind.trainer.restore",
    "sample_run": "tradewind.trainer.sample",
    "sample_tokens": "tradewind.trainer.sample",
    "export_hf": "tradewind.trainer.export",
    "load_hf_params": "tradewind.trainer.hf",
    "profile_training": "tradewind.trainer.profile",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = list(_LAZY)
