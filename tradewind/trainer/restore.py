"""Load a finished (or checkpointed) run's model: its config, graph and the newest checkpoint's parameters.

Used by sampling and by the Hugging Face export; training itself restores through `Checkpointer`. A run that
lives in a bucket (`storage`) is read from there. A LoRA run's checkpoints hold its adapters only: its base
is read again from `init_from` (in float32, as the folder holds it) and the adapters put beside it.

Example:
    loaded = load_run_model(Path("runs/r1"))
    logits = nnx.merge(loaded.graphdef, loaded.params)(tokens)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.data import TokenCache, open_token_cache
from tradewind.runs.config import TrainConfig, read_train_config
from tradewind.runs.hf import check_base_weights
from tradewind.runs.layout import RunLayout
from tradewind.runs.models.configs import ModelConfig
from tradewind.runs.record import checkpoints_of
from tradewind.trainer.checkpoint import read_checkpoint
from tradewind.trainer.optimizer import build_optimizer
from tradewind.trainer.setup import build_run_model, init_from_params, resolve_model_config, split_run_model
from tradewind.trainer.state import TrainState
from tradewind.trainer.step import weights_and_streams


@dataclass
class LoadedRun:
    """A run's model as saved in its newest readable checkpoint: its graph in the deterministic mode (no
    dropout) and its whole state (a LoRA run's base and adapters)."""

    config: TrainConfig
    model_config: ModelConfig
    cache: TokenCache  # its dataset: the tokenizer it was built with is `cache.tokenizer()`
    graphdef: nnx.GraphDef
    params: Any
    step: int

    def model(self) -> nnx.Module:
        """The model itself."""
        return nnx.merge(self.graphdef, self.params)


def load_run_model(run_dir: Path, step: int | None = None) -> LoadedRun:
    """Rebuild the run's model and restore the parameters of checkpoint `step` (default: newest readable).

    Raises:
        NotFoundError: no run config, token cache or checkpoint.
    """
    layout = RunLayout(Path(run_dir))
    config = read_train_config(layout.config)
    if config.lora is not None and config.init_from:  # its adapters, on a base that changed, would mean nothing
        check_base_weights(Path(config.init_from), {f"run {layout.root.name}": layout.record})
    cache = open_token_cache(Path(config.dataset))
    model_config = resolve_model_config(config.model, cache.manifest)
    float32 = {"dtype": jnp.float32, "platform": "cpu"}  # the reference attention; a cache decodes with it anyway
    if config.lora is None:  # blocks stacked as the checkpoints hold them (`scan_layers`)
        model = nnx.eval_shape(lambda: build_run_model(config, model_config, **float32))
    else:  # the frozen base is not in the checkpoints
        model = build_run_model(config, model_config, initial_params=init_from_params(config), **float32)
    _, graphdef, abstract_params, frozen = split_run_model(model, config, frozen_dtype=jnp.float32)
    abstract_opt = jax.eval_shape(build_optimizer(config.optimizer).init, weights_and_streams(abstract_params)[0])
    # Onto this process's first device, whatever mesh saved it (a run of several processes too).
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract_params, abstract_opt = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), (abstract_params, abstract_opt)
    )
    like = TrainState.start(abstract_params, abstract_opt, config.seed)
    state = read_checkpoint(checkpoints_of(layout), like, step)
    return LoadedRun(config, model_config, cache, graphdef, nnx.merge_state(state.params, frozen), state.step)
