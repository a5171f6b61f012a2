"""Decoder-only language models: a config class per architecture and its `flax.nnx` module, found by `type`.

- `base.py`, `configs.py`: `ModelConfig`, the union of the architectures registered in `ARCHITECTURES` by
  `type` (`LlamaConfig`, its kin `MistralConfig`, `Qwen2Config` and `Qwen3Config`, and `GPT2Config`) over their
  shared `BaseModelConfig` (no JAX: the CLI loads them); each owns its MLP width, parameter and FLOP counts and
  Hugging Face mapping (one table of `config.json` keys, one of tensors, each read both ways);
- `layers.py`: the shared pieces (norm, rotary, causal attention with its key/value cache, `decode`);
- `build.py`: `build_model`, which builds the module a config's class names;
- `llama.py` (the Llama family's one module, shaped by its config's settings), `gpt2.py`.

Models only map tokens to logits; the loss, the optimizer and checkpointing live in the trainer. Parameters
are always float32; `dtype` is the compute dtype of the matmuls (the precision policy picks it). For
sampling, a model also takes a key/value cache from `init_cache` and returns it updated.

Example:
    model = build_model(LlamaConfig(vocab_size=258), rngs=nnx.Rngs(0))
    logits = model(tokens)  # tokens [batch, seq] int32 -> logits [batch, seq, vocab] float32
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tradewind.core import lazy_getattr

if TYPE_CHECKING:
    from tradewind.trainer.models.base import PRESETS
    from tradewind.trainer.models.build import build_model, count_params
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
    from tradewind.trainer.models.gpt2 import GPT2
    from tradewind.trainer.models.layers import KVCache, init_cache
    from tradewind.trainer.models.llama import Llama

# Names load on first use, so that the configs import without JAX.
_LAZY = {
    "build_model": "tradewind.trainer.models.build",
    "count_params": "tradewind.trainer.models.build",
    "ARCHITECTURES": "tradewind.trainer.models.configs",
    "PRESETS": "tradewind.trainer.models.base",
    "GPT2Config": "tradewind.trainer.models.configs",
    "LlamaConfig": "tradewind.trainer.models.configs",
    "MistralConfig": "tradewind.trainer.models.configs",
    "ModelConfig": "tradewind.trainer.models.configs",
    "Qwen2Config": "tradewind.trainer.models.configs",
    "Qwen3Config": "tradewind.trainer.models.configs",
    "model_config": "tradewind.trainer.models.configs",
    "GPT2": "tradewind.trainer.models.gpt2",
    "KVCache": "tradewind.trainer.models.layers",
    "init_cache": "tradewind.trainer.models.layers",
    "Llama": "tradewind.trainer.models.llama",
}
__getattr__ = lazy_getattr(__name__, _LAZY)
__all__ = [
    "ARCHITECTURES",
    "GPT2",
    "PRESETS",
    "GPT2Config",
    "KVCache",
    "Llama",
    "LlamaConfig",
    "MistralConfig",
    "ModelConfig",
    "Qwen2Config",
    "Qwen3Config",
    "build_model",
    "count_params",
    "init_cache",
    "model_config",
]
