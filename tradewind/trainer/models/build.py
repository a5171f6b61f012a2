"""Building a model from its config: the `nnx` module its config class names."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.runs.models.base import Attention
from tradewind.runs.models.configs import ModelConfig


def build_model(
    config: ModelConfig,
    *,
    rngs: nnx.Rngs,
    dtype: Any = jnp.float32,
    attention: Attention = "reference",
    scan_layers: bool = False,
) -> nnx.Module:
    """Build the model `config` describes (its class's `module`), with freshly initialised weights; `dtype` is
    its compute dtype, `attention` the attention kernel of its training steps and `scan_layers` whether they
    run the blocks as one loop."""
    module_name, class_name = config.module.rsplit(".", 1)
    model_class = getattr(importlib.import_module(module_name), class_name)
    return model_class(config, rngs=rngs, dtype=dtype, attention=attention, scan_layers=scan_layers)


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters (scalars in `nnx.Param` variables) of `model`."""
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
