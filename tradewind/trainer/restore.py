"""Load a finished (or checkpointed) run's model: its config, graph and the newest checkpoint's parameters.

Used by sampling and by the Hugging Face export; training itself restores through `Checkpointer`. A run that
lives in a bucket (`storage`) is read from there.

Example:
    loaded = load_run_model(Path("runs/r1"))
    logits = nnx.merge(loaded.graphdef, loaded.params)(tokens)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from tradewind.data import CacheManifest, open_token_cache
from tradewind.trainer.checkpoint import read_checkpoint
from tradewind.trainer.config import TrainConfig, read_train_config
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.models import build_model
from tradewind.trainer.models.configs import ModelConfig
from tradewind.trainer.optimizer import build_optimizer
from tradewind.trainer.record import checkpoints_of
from tradewind.trainer.setup import resolve_model_config
from tradewind.trainer.state import TrainState


@dataclass
class LoadedRun:
    """A run's model as saved in its newest readable checkpoint."""

    config: TrainConfig
    model_config: ModelConfig
    manifest: CacheManifest
    graphdef: nnx.GraphDef
    params: Any
    step: int


def load_run_model(run_dir: Path, step: int | None = None) -> LoadedRun:
    """Rebuild the run's model and restore the parameters of checkpoint `step` (default: newest readable).

    Raises:
        NotFoundError: no run config, token cache or checkpoint.
    """
    layout = RunLayout(Path(run_dir))
    config = read_train_config(layout.config)
    manifest = open_token_cache(Path(config.dataset)).manifest
    model_config = resolve_model_config(config.model, manifest)
    scanned = config.scan_layers  # its checkpoints hold the blocks stacked
    model = nnx.eval_shape(lambda: build_model(model_config, rngs=nnx.Rngs(config.seed), scan_layers=scanned))
    graphdef, abstract_params = nnx.split(model)
    abstract_opt = jax.eval_shape(build_optimizer(config.optimizer).init, abstract_params)
    # Onto this process's first device, whatever mesh saved it (a run of several processes too).
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract_params, abstract_opt = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), (abstract_params, abstract_opt)
    )
    like = TrainState.start(abstract_params, abstract_opt, config.seed)
    state = read_checkpoint(checkpoints_of(layout), like, step)
    return LoadedRun(config, model_config, manifest, graphdef, state.params, state.step)
