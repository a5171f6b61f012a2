"""Decoder-only language models in `flax.nnx`, registered by the `type` of their `ModelConfig`.

Llama-style: token embedding, pre-norm blocks of causal self-attention with rotary position embeddings
and a SwiGLU MLP, a final RMSNorm and an output head (tied to the embedding by default). No biases.

The file reads top to bottom: the small pieces first (norm, rotary embedding, attention, MLP, block),
then the model, then the registry. Models only map tokens to logits; the loss, the optimizer and
checkpointing live in the trainer.

Example:
    model = build_model(ModelConfig(vocab_size=258), rngs=nnx.Rngs(0))
    logits = model(tokens)  # tokens [batch, seq] int32 -> logits [batch, seq, vocab] float32
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.core import ConfigError
from tradewind.trainer.config import ModelConfig


class RMSNorm(nnx.Module):
    """Root-mean-square normalisation with a learned per-channel scale, computed in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # [..., dim]
        inv_rms = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)  # [..., 1]
        return (x32 * inv_rms * self.scale[...]).astype(x.dtype)


def rotary_angles(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Cosines and sines of the rotary angles, each [seq, head_dim / 2], for integer `positions` [seq]."""
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # [head_dim / 2]
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [seq, head_dim / 2]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate channel pairs of `x` [batch, seq, heads, head_dim] by the position angles.

    Channel i pairs with channel i + head_dim / 2 (the Hugging Face Llama layout, so exported weights
    need no permutation). The dot product of a rotated query and key then depends only on their distance.
    """
    x1, x2 = jnp.split(x, 2, axis=-1)  # [batch, seq, heads, head_dim / 2] each
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # [1, seq, 1, head_dim / 2]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention in which each position attends to itself and earlier positions only."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d_model, self.n_heads, self.head_dim = config.d_model, config.n_heads, config.head_dim
        init = nnx.initializers.normal(config.init_std)
        # GPT-2's scaled init: each block adds to the residual stream, so shrink its output projection
        # by sqrt(2 * n_layers) to keep the stream's variance from growing with depth.
        out_init = nnx.initializers.normal(config.init_std / math.sqrt(2 * config.n_layers))
        self.q_proj = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.k_proj = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.v_proj = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.o_proj = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=out_init, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        batch, seq, d_model = x.shape  # [batch, seq, d_model]
        heads = (batch, seq, self.n_heads, self.head_dim)
        q = apply_rotary(self.q_proj(x).reshape(heads), cos, sin)  # [batch, seq, heads, head_dim]
        k = apply_rotary(self.k_proj(x).reshape(heads), cos, sin)  # [batch, seq, heads, head_dim]
        v = self.v_proj(x).reshape(heads)  # [batch, seq, heads, head_dim]

        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)  # [batch, heads, seq, seq]
        scores = scores / math.sqrt(self.head_dim)
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))  # [seq (query), seq (key)]
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [batch, heads, seq, seq]

        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)  # [batch, seq, heads, head_dim]
        return self.o_proj(out.reshape(batch, seq, d_model))  # [batch, seq, d_model]


class SwiGLU(nnx.Module):
    """The gated MLP of Llama: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d_model, d_ff = config.d_model, config.ff_dim
        init = nnx.initializers.normal(config.init_std)
        out_init = nnx.initializers.normal(config.init_std / math.sqrt(2 * config.n_layers))
        self.gate_proj = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, rngs=rngs)
        self.up_proj = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, rngs=rngs)
        self.down_proj = nnx.Linear(d_ff, d_model, use_bias=False, kernel_init=out_init, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)  # [batch, seq, d_ff]
        return self.down_proj(hidden)  # [batch, seq, d_model]


class Block(nnx.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model)
        self.mlp = SwiGLU(config, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), cos, sin)  # [batch, seq, d_model]
        return x + self.mlp(self.mlp_norm(x))  # [batch, seq, d_model]


MODELS: dict[str, type[nnx.Module]] = {}


def register_model(name: str) -> Callable[[type[nnx.Module]], type[nnx.Module]]:
    """Class decorator: make a model buildable from a `ModelConfig` whose `type` is `name`."""

    def register(cls: type[nnx.Module]) -> type[nnx.Module]:
        MODELS[name] = cls
        return cls

    return register


@register_model("llama")
class Llama(nnx.Module):
    """A Llama-style decoder-only transformer.

    Args:
        config: the model's shape; `vocab_size` must be set (the trainer fills it from the dataset).
        rngs: random streams for the weight initialisation.

    Raises:
        ConfigError: `config.vocab_size` is None.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.vocab_size is None:
            raise ConfigError("model.vocab_size: must be set to build the model (the trainer takes it from the data)")
        self.max_seq_len, self.head_dim, self.rope_theta = config.max_seq_len, config.head_dim, config.rope_theta
        init = nnx.initializers.normal(config.init_std)
        self.embed = nnx.Embed(config.vocab_size, config.d_model, embedding_init=init, rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.d_model)
        # Tied: the output head is the transposed embedding (as in GPT-2); saves vocab * d_model parameters.
        self.lm_head = (
            None
            if config.tie_embeddings
            else nnx.Linear(config.d_model, config.vocab_size, use_bias=False, kernel_init=init, rngs=rngs)
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Map tokens [batch, seq] (int) to next-token logits [batch, seq, vocab] (float32)."""
        seq = tokens.shape[1]
        if seq > self.max_seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than max_seq_len ({self.max_seq_len})")
        cos, sin = rotary_angles(jnp.arange(seq), self.head_dim, self.rope_theta)  # [seq, head_dim / 2] each
        x = self.embed(tokens)  # [batch, seq, d_model]
        for block in self.blocks:
            x = block(x, cos, sin)  # [batch, seq, d_model]
        x = self.norm(x)  # [batch, seq, d_model]
        logits = self.embed.attend(x) if self.lm_head is None else self.lm_head(x)  # [batch, seq, vocab]
        return logits.astype(jnp.float32)


def build_model(config: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """Build the registered model named by `config.type`, with freshly initialised weights."""
    return MODELS[config.type](config, rngs=rngs)


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters (scalars in `nnx.Param` variables) of `model`."""
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
