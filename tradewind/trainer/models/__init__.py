"""Decoder-only language models in `flax.nnx`, built from a `ModelConfig` by its `type`.

- `layers.py`: the shared pieces (norm, rotary, causal attention with its key/value cache, `decode`);
- `llama.py`, `gpt2.py`: the two architectures, each registering itself (`registry.register_model`).

Models only map tokens to logits; the loss, the optimizer, FLOP accounting and checkpointing live in the
trainer. Parameters are always float32; `dtype` is the compute dtype of the matmuls (the precision policy
picks it). For sampling, a model also takes a key/value cache from `init_cache` and returns it updated.

Example:
    model = build_model(ModelConfig(vocab_size=258), rngs=nnx.Rngs(0))
    logits = model(tokens)  # tokens [batch, seq] int32 -> logits [batch, seq, vocab] float32
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.trainer.config import ModelConfig
from tradewind.trainer.models.gpt2 import GPT2
from tradewind.trainer.models.layers import KVCache, init_cache
from tradewind.trainer.models.llama import Llama
from tradewind.trainer.models.registry import MODELS, register_model


def build_model(config: ModelConfig, *, rngs: nnx.Rngs, dtype: Any = jnp.float32) -> nnx.Module:
    """Build the registered model named by `config.type`, with freshly initialised weights."""
    return MODELS[config.type](config, rngs=rngs, dtype=dtype)


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters (scalars in `nnx.Param` variables) of `model`."""
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


__all__ = ["GPT2", "MODELS", "KVCache", "Llama", "build_model", "count_params", "init_cache", "register_model"]
