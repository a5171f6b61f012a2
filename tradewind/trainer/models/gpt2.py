"""The GPT-2-style decoder: LayerNorm, learned position embeddings, a GELU MLP and biases.

Model type "gpt2"; same call contract as `Llama` (`layers.Decoder`).

Example:
    model = build_model(GPT2Config(vocab_size=258), rngs=nnx.Rngs(0))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.runs.models.base import Attention
from tradewind.runs.models.configs import GPT2Config
from tradewind.trainer.models.layers import (
    Decoder,
    attend,
    block_stack,
    head_weight,
    output_head,
    over_token_rows,
    require_vocab,
    scaled_init,
)


class GPT2Attention(nnx.Module):
    """Multi-head causal self-attention with a fused, biased qkv projection."""

    def __init__(self, config: GPT2Config, *, dtype: Any, attention: Attention, rngs: nnx.Rngs):
        d_model, self.n_heads, self.head_dim = config.d_model, config.n_heads, config.head_dim
        self.attention = attention
        init = nnx.initializers.normal(config.init_std)
        self.qkv = nnx.Linear(d_model, 3 * d_model, kernel_init=init, dtype=dtype, rngs=rngs)
        self.proj = nnx.Linear(d_model, d_model, kernel_init=scaled_init(config), dtype=dtype, rngs=rngs)

    @jax.named_scope("attention")
    def __call__(self, x, positions, layer_cache=None, segments=None):
        batch, seq, _ = x.shape  # [batch, seq, d_model]
        heads = (batch, seq, self.n_heads, self.head_dim)
        q, k, v = (part.reshape(heads) for part in jnp.split(self.qkv(x), 3, axis=-1))
        out, layer_cache = attend(q, k, v, positions, layer_cache, self.attention, segments)  # [batch, seq, d_model]
        return self.proj(out), layer_cache


class GPT2Block(nnx.Module):
    """x + attn(ln(x)), then x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, config: GPT2Config, *, dtype: Any, attention: Attention, rngs: nnx.Rngs):
        d_model, d_ff = config.d_model, config.ff_dim
        init = nnx.initializers.normal(config.init_std)
        self.ln_1 = nnx.LayerNorm(d_model, epsilon=config.norm_eps, rngs=rngs)
        self.attn = GPT2Attention(config, dtype=dtype, attention=attention, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(d_model, epsilon=config.norm_eps, rngs=rngs)
        self.fc = nnx.Linear(d_model, d_ff, kernel_init=init, dtype=dtype, rngs=rngs)
        self.fc_out = nnx.Linear(d_ff, d_model, kernel_init=scaled_init(config), dtype=dtype, rngs=rngs)

    def __call__(self, x, positions, layer_cache=None, segments=None):
        with jax.named_scope("norms"):
            normed = self.ln_1(x)
        attended, layer_cache = self.attn(normed, positions, layer_cache, segments)
        x = x + attended  # [batch, seq, d_model]
        with jax.named_scope("norms"):
            normed = self.ln_2(x)
        with jax.named_scope("mlp"):
            return x + over_token_rows(lambda rows: self.fc_out(jax.nn.gelu(self.fc(rows))), normed), layer_cache


class GPT2(Decoder):
    """A GPT-2-style decoder-only transformer; same call contract as `Llama`."""

    def __init__(
        self,
        config: GPT2Config,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jnp.float32,
        attention: Attention = "reference",
        scan_layers: bool = False,
    ):
        vocab = require_vocab(config)
        self.max_seq_len, self.dtype = config.max_seq_len, dtype
        init = nnx.initializers.normal(config.init_std)
        self.wte = nnx.Embed(vocab, config.d_model, embedding_init=init, dtype=dtype, rngs=rngs)
        self.wpe = nnx.Embed(config.max_seq_len, config.d_model, embedding_init=init, dtype=dtype, rngs=rngs)
        blocks = [GPT2Block(config, dtype=dtype, attention=attention, rngs=rngs) for _ in range(config.n_layers)]
        self.blocks = block_stack(blocks, scan_layers)
        self.ln_f = nnx.LayerNorm(config.d_model, epsilon=config.norm_eps, rngs=rngs)
        self.lm_head = output_head(config, vocab, dtype=dtype, rngs=rngs)

    def embed_tokens(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        return self.wte(tokens) + self.wpe(positions)  # positions [seq] broadcast over the batch

    @jax.named_scope("norms")
    def final_norm(self, x: jax.Array) -> jax.Array:
        return self.ln_f(x)

    def head_weight(self) -> jax.Array:
        return head_weight(self.wte, self.lm_head, self.dtype)
