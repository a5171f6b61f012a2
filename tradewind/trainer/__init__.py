"""Trainer: the models, the optimizers, and the loop that trains, checkpoints, samples and exports them.

This layer owns everything from a `TrainConfig` to a finished run folder: the config schema and presets,
the registered models (`Llama`, `GPT2`), the optimizers and schedules, the pure train and eval steps, the
device mesh, the loop that writes `metrics.jsonl`, TensorBoard events, checkpoints and `summary.json`,
resume, sampling, Hugging Face export/import and the profiler. It may import only `tradewind.core`,
`tradewind.cluster` and `tradewind.data` (plus JAX, flax, optax and orbax).

Entry points: jobs call `tradewind.trainer.start:train_job` (and the sampling and profiling jobs' callables);
`python -m tradewind.trainer RUN_DIR` trains a run folder by hand; `python -m tradewind.trainer.cli export ...`
is `tradewind export`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tradewind.core import lazy_getattr

if TYPE_CHECKING:
    from tradewind.trainer.batches import RunData, open_run_data, with_dataset_vocabulary
    from tradewind.trainer.checkpoint import Checkpointer, read_checkpoint
    from tradewind.trainer.config import (
        CheckpointConfig,
        DistributedConfig,
        LoraConfig,
        MeshConfig,
        OptimizerConfig,
        TrainConfig,
        read_train_config,
    )
    from tradewind.trainer.flops import MemoryEstimate, peak_flops, training_memory
    from tradewind.trainer.hf import check_matches_hf, export_hf, load_hf_params, model_for_init_from
    from tradewind.trainer.jobs import (
        PROFILE_CALLABLE,
        SAMPLE_CALLABLE,
        TRAIN_CALLABLE,
        ProfileJob,
        ProfileOptions,
        SampleJob,
        SampleOptions,
        TrainJob,
    )
    from tradewind.trainer.layout import RunLayout
    from tradewind.trainer.loop import run_steps, train
    from tradewind.trainer.metrics import MetricRow, ProfileSummary, TrainSummary, read_metrics, read_summary
    from tradewind.trainer.models import GPT2, Llama, build_model, count_params
    from tradewind.trainer.models.base import PRESETS
    from tradewind.trainer.models.configs import (
        ARCHITECTURES,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        ModelConfig,
        Qwen2Config,
        Qwen3Config,
        model_config,
    )
    from tradewind.trainer.optimizer import OPTIMIZERS, build_optimizer, build_schedule, register_optimizer
    from tradewind.trainer.profile import profile_training
    from tradewind.trainer.record import LedgerEntry, RunRecord, job_end_callback, read_record, write_record
    from tradewind.trainer.restore import load_run_model
    from tradewind.trainer.sample import sample_run, sample_tokens
    from tradewind.trainer.setup import TrainSetup, evaluate, setup_training
    from tradewind.trainer.sharding import build_mesh
    from tradewind.trainer.state import TrainState

# Every name loads on first use (PEP 562): the CLI and MCP server import this package without JAX, and
# `tradewind --help` (which imports `tradewind.trainer.cli`) without numpy or pydantic models.
_LAZY = {
    "RunData": "tradewind.trainer.batches",
    "open_run_data": "tradewind.trainer.batches",
    "with_dataset_vocabulary": "tradewind.trainer.batches",
    "ARCHITECTURES": "tradewind.trainer.models.configs",
    "PRESETS": "tradewind.trainer.models.base",
    "GPT2Config": "tradewind.trainer.models.configs",
    "LlamaConfig": "tradewind.trainer.models.configs",
    "MistralConfig": "tradewind.trainer.models.configs",
    "Qwen2Config": "tradewind.trainer.models.configs",
    "Qwen3Config": "tradewind.trainer.models.configs",
    "model_config": "tradewind.trainer.models.configs",
    "CheckpointConfig": "tradewind.trainer.config",
    "DistributedConfig": "tradewind.trainer.config",
    "LoraConfig": "tradewind.trainer.config",
    "MeshConfig": "tradewind.trainer.config",
    "ModelConfig": "tradewind.trainer.models.configs",
    "OptimizerConfig": "tradewind.trainer.config",
    "TrainConfig": "tradewind.trainer.config",
    "TrainJob": "tradewind.trainer.jobs",
    "SampleJob": "tradewind.trainer.jobs",
    "SampleOptions": "tradewind.trainer.jobs",
    "ProfileJob": "tradewind.trainer.jobs",
    "ProfileOptions": "tradewind.trainer.jobs",
    "TRAIN_CALLABLE": "tradewind.trainer.jobs",
    "SAMPLE_CALLABLE": "tradewind.trainer.jobs",
    "PROFILE_CALLABLE": "tradewind.trainer.jobs",
    "RunRecord": "tradewind.trainer.record",
    "job_end_callback": "tradewind.trainer.record",
    "read_record": "tradewind.trainer.record",
    "LedgerEntry": "tradewind.trainer.record",
    "write_record": "tradewind.trainer.record",
    "read_checkpoint": "tradewind.trainer.checkpoint",
    "read_train_config": "tradewind.trainer.config",
    "peak_flops": "tradewind.trainer.flops",
    "MemoryEstimate": "tradewind.trainer.flops",
    "training_memory": "tradewind.trainer.flops",
    "RunLayout": "tradewind.trainer.layout",
    "MetricRow": "tradewind.trainer.metrics",
    "ProfileSummary": "tradewind.trainer.metrics",
    "TrainSummary": "tradewind.trainer.metrics",
    "read_metrics": "tradewind.trainer.metrics",
    "read_summary": "tradewind.trainer.metrics",
    "Llama": "tradewind.trainer.models",
    "build_model": "tradewind.trainer.models",
    "count_params": "tradewind.trainer.models",
    "GPT2": "tradewind.trainer.models",
    "OPTIMIZERS": "tradewind.trainer.optimizer",
    "register_optimizer": "tradewind.trainer.optimizer",
    "Checkpointer": "tradewind.trainer.checkpoint",
    "export_hf": "tradewind.trainer.hf",
    "load_hf_params": "tradewind.trainer.hf",
    "check_matches_hf": "tradewind.trainer.hf",
    "model_for_init_from": "tradewind.trainer.hf",
    "load_run_model": "tradewind.trainer.restore",
    "sample_run": "tradewind.trainer.sample",
    "sample_tokens": "tradewind.trainer.sample",
    "build_mesh": "tradewind.trainer.sharding",
    "build_optimizer": "tradewind.trainer.optimizer",
    "build_schedule": "tradewind.trainer.optimizer",
    "TrainSetup": "tradewind.trainer.setup",
    "evaluate": "tradewind.trainer.setup",
    "setup_training": "tradewind.trainer.setup",
    "TrainState": "tradewind.trainer.state",
    "train": "tradewind.trainer.loop",
    "run_steps": "tradewind.trainer.loop",
    "profile_training": "tradewind.trainer.profile",
}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "PROFILE_CALLABLE",
    "SAMPLE_CALLABLE",
    "TRAIN_CALLABLE",
    "ProfileJob",
    "ProfileOptions",
    "SampleJob",
    "SampleOptions",
    "GPT2",
    "GPT2Config",
    "LlamaConfig",
    "LoraConfig",
    "MistralConfig",
    "Qwen2Config",
    "Qwen3Config",
    "model_config",
    "OPTIMIZERS",
    "ARCHITECTURES",
    "PRESETS",
    "CheckpointConfig",
    "Checkpointer",
    "DistributedConfig",
    "MeshConfig",
    "build_mesh",
    "export_hf",
    "load_hf_params",
    "check_matches_hf",
    "model_for_init_from",
    "load_run_model",
    "peak_flops",
    "MemoryEstimate",
    "training_memory",
    "register_optimizer",
    "sample_run",
    "sample_tokens",
    "RunData",
    "open_run_data",
    "with_dataset_vocabulary",
    "Llama",
    "MetricRow",
    "ModelConfig",
    "OptimizerConfig",
    "ProfileSummary",
    "RunLayout",
    "TrainConfig",
    "TrainJob",
    "RunRecord",
    "job_end_callback",
    "read_record",
    "LedgerEntry",
    "write_record",
    "read_checkpoint",
    "TrainSetup",
    "TrainSummary",
    "build_model",
    "build_optimizer",
    "build_schedule",
    "count_params",
    "evaluate",
    "profile_training",
    "read_metrics",
    "read_summary",
    "read_train_config",
    "run_steps",
    "setup_training",
    "train",
    "TrainState",
]
