"""Decoder-only language models: each architecture's `flax.nnx` module, built from its config by `type`.

The configs (`ModelConfig`, `LlamaConfig`, `GPT2Config`, ...) live in `tradewind.runs.models`, without JAX; each
names its module here.

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

from tradewind.trainer.models.build import build_model, count_params
from tradewind.trainer.models.gpt2 import GPT2
from tradewind.trainer.models.layers import KVCache, init_cache
from tradewind.trainer.models.llama import Llama

__all__ = ["GPT2", "KVCache", "Llama", "build_model", "count_params", "init_cache"]
