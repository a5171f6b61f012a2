"""Trainer: the model, the optimizer, and the loop that trains and profiles it on a token cache.

This layer owns everything from a `TrainConfig` to a finished run folder: the config schema, the
registered models (`Llama`), the optimizer and its schedule, the pure train and eval steps, the loop that
writes `metrics.jsonl`, checkpoints and `summary.json`, and the profiler. It may import only
`tradewind.core`, `tradewind.cluster` and `tradewind.data` (plus JAX, flax, optax and orbax).

Entry points: `python -m tradewind.trainer RUN_DIR` trains; `python -m tradewind.trainer.profile RUN_DIR`
profiles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tradewind.trainer.batches import RunData, open_run_data
from tradewind.trainer.config import ModelConfig, OptimizerConfig, TrainConfig, read_train_config
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.metrics import MetricRow, ProfileSummary, TrainSummary, read_metrics, read_summary

if TYPE_CHECKING:
    from tradewind.trainer.checkpoint import restore_checkpoint, save_checkpoint
    from tradewind.trainer.loop import train
    from tradewind.trainer.model import MODELS, Llama, build_model, count_params, register_model
    from tradewind.trainer.optimizer import build_optimizer, build_schedule
    from tradewind.trainer.profile import profile_training
    from tradewind.trainer.step import TrainSetup, evaluate, setup_training

# JAX-heavy names load on first use (PEP 562): the CLI and MCP server import this package without JAX.
_LAZY = {
    "MODELS": "tradewind.trainer.model",
    "Llama": "tradewind.trainer.model",
    "build_model": "tradewind.trainer.model",
    "count_params": "tradewind.trainer.model",
    "register_model": "tradewind.trainer.model",
    "build_optimizer": "tradewind.trainer.optimizer",
    "build_schedule": "tradewind.trainer.optimizer",
    "TrainSetup": "tradewind.trainer.step",
    "evaluate": "tradewind.trainer.step",
    "setup_training": "tradewind.trainer.step",
    "train": "tradewind.trainer.loop",
    "save_checkpoint": "tradewind.trainer.checkpoint",
    "restore_checkpoint": "tradewind.trainer.checkpoint",
    "profile_training": "tradewind.trainer.profile",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "RunData",
    "open_run_data",
    "MODELS",
    "Llama",
    "MetricRow",
    "ModelConfig",
    "OptimizerConfig",
    "ProfileSummary",
    "RunLayout",
    "TrainConfig",
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
    "register_model",
    "restore_checkpoint",
    "save_checkpoint",
    "setup_training",
    "train",
]
