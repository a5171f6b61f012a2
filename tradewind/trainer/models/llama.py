"""The Llama-style decoder: RMSNorm, rotary position embeddings, grouped-query attention, a SwiGLU MLP.

Token embedding, pre-norm blocks, a final RMSNorm and an output head (tied to the embedding by default); no
biases. Model types "llama", "mistral", "qwen2" and "qwen3" all build it: what tells them apart is read from
their config (`qkv_bias`: Qwen2's biases on the query, key and value projections; `qk_norm`: Qwen3's RMSNorm
of each query and key head; `head_dim`, which may differ from d_model / n_heads).

Example:
    model = build_model(LlamaConfig(vocab_size=258), rngs=nnx.Rngs(0))
    logits = model(tokens)  # tokens [batch, seq] int32 -> logits [batch, seq, vocab] float32
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from tradewind.runs.models.base import Attention
from tradewind.runs.models.configs import LlamaConfig
from tradewind.trainer.models.layers import (
    Decoder,
    RMSNorm,
    apply_rotary,
    attend,
    block_stack,
    head_weight,
    output_head,
    over_token_rows,
    require_vocab,
    rotary_angles,
    scaled_init,
)


class CausalSelfAttention(nnx.Module):
    """Grouped-query self-attention in which each position attends to itself and earlier positions only."""

    def __init__(self, config: LlamaConfig, *, dtype: Any, attention: Attention, rngs: nnx.Rngs):
        d_model, self.n_heads, self.head_dim = config.d_model, config.n_heads, config.head_dim
        self.kv_heads, self.attention = config.kv_heads, attention
        self.rope_theta, self.rope_scaling = config.rope_theta, config.rope_scaling
        init = nnx.initializers.normal(config.init_std)
        q_width, kv_width = self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = dict(use_bias=config.qkv_bias, dtype=dtype, rngs=rngs)
        self.q_proj = nnx.Linear(d_model, q_width, kernel_init=init, **qkv)
        self.k_proj = nnx.Linear(d_model, kv_width, kernel_init=init, **qkv)
        self.v_proj = nnx.Linear(d_model, kv_width, kernel_init=init, **qkv)
        self.o_proj = nnx.Linear(
            q_width, d_model, use_bias=False, kernel_init=scaled_init(config), dtype=dtype, rngs=rngs
        )
        # Qwen3 normalises each head's queries and keys (over head_dim) before rotating them.
        self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None

    @jax.named_scope("attention")
    def __call__(self, x, positions, layer_cache=None, segments=None):
        batch, seq, _ = x.shape  # [batch, seq, d_model]
        # The same angles in every layer: under jit, XLA computes them once.
        cos, sin = rotary_angles(positions, self.head_dim, self.rope_theta, self.rope_scaling)  # [..., seq, head_dim]
        rows = x.reshape(batch * seq, -1)  # the projections run on 2-D rows, see `over_token_rows`
        q = self.q_proj(rows).reshape(batch, seq, self.n_heads, self.head_dim)  # [batch, seq, heads, head_dim]
        k = self.k_proj(rows).reshape(batch, seq, self.kv_heads, self.head_dim)  # [batch, seq, kv_heads, head_dim]
        v = self.v_proj(rows).reshape(batch, seq, self.kv_heads, self.head_dim)  # [batch, seq, kv_heads, head_dim]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out, layer_cache = attend(q, k, v, positions, layer_cache, self.attention, segments)  # [b, seq, heads * hd]
        return self.o_proj(out.reshape(batch * seq, -1)).reshape(batch, seq, -1), layer_cache


class SwiGLU(nnx.Module):
    """The gated MLP of Llama: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig, *, dtype: Any, rngs: nnx.Rngs):
        d_model, d_ff = config.d_model, config.ff_dim
        init = nnx.initializers.normal(config.init_std)
        linear = dict(use_bias=False, dtype=dtype, rngs=rngs)
        self.gate_proj = nnx.Linear(d_model, d_ff, kernel_init=init, **linear)
        self.up_proj = nnx.Linear(d_model, d_ff, kernel_init=init, **linear)
        self.down_proj = nnx.Linear(d_ff, d_model, kernel_init=scaled_init(config), **linear)

    @jax.named_scope("mlp")
    def __call__(self, x: jax.Array) -> jax.Array:
        def mlp(rows: jax.Array) -> jax.Array:  # [tokens, d_model]
            return self.down_proj(jax.nn.silu(self.gate_proj(rows)) * self.up_proj(rows))

        return over_token_rows(mlp, x)


class Block(nnx.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, *, dtype: Any, attention: Attention, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config, dtype=dtype, attention=attention, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, positions, layer_cache=None, segments=None):
        attended, layer_cache = self.attn(self.attn_norm(x), positions, layer_cache, segments)
        x = x + attended  # [batch, seq, d_model]
        return x + self.mlp(self.mlp_norm(x)), layer_cache  # [batch, seq, d_model]


class Llama(Decoder):
    """A Llama-style decoder-only transformer.

    Args:
        config: the model's shape; `vocab_size` must be set (the trainer fills it from the dataset).
        rngs: random streams for the weight initialisation.
        dtype: compute dtype of the matmuls (parameters stay float32).
        attention: the attention kernel of training steps (`Attention`).
        scan_layers: hold the blocks stacked (`layers.StackedBlocks`), which training steps run as one loop.

    Raises:
        ConfigError: `config.vocab_size` is None.
    """

    def __init__(
        self,
        config: LlamaConfig,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jax.numpy.float32,
        attention: Attention = "reference",
        scan_layers: bool = False,
    ):
        vocab = require_vocab(config)
        self.max_seq_len, self.dtype = config.max_seq_len, dtype
        init = nnx.initializers.normal(config.init_std)
        self.embed = nnx.Embed(vocab, config.d_model, embedding_init=init, dtype=dtype, rngs=rngs)
        blocks = [Block(config, dtype=dtype, attention=attention, rngs=rngs) for _ in range(config.n_layers)]
        self.blocks = block_stack(blocks, scan_layers)
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = output_head(config, vocab, dtype=dtype, rngs=rngs)

    def embed_tokens(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        return self.embed(tokens)  # positions enter through the rotary embedding

    def final_norm(self, x: jax.Array) -> jax.Array:
        return self.norm(x)

    def head_weight(self) -> jax.Array:
        return head_weight(self.embed, self.lm_head, self.dtype)
