"""The pieces both architectures are made of, and the forward pass they share.

Norm, rotary position embedding, causal attention (with the key/value cache for sampling), the row-wise
MLP helper, `decode` (positions, embedding, blocks and final norm, with or without a cache), and `Decoder`, the
call contract of a model (hidden states, the head's weight, logits). Everything is
float32 unless a module is given a compute dtype; attention scores and softmax are float32 always.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from tradewind.core import ConfigError
from tradewind.runs.models.base import Attention, BlockRemat, Remat
from tradewind.runs.models.configs import Llama3RopeScaling, ModelConfig
from tradewind.trainer.sharding import BATCH_AXES

# A key/value cache: per layer `(k, v)`, each [batch, max_len, kv_heads, head_dim], and the next position.
KVCache = dict[str, Any]
# One block of a model: `(x [batch, seq, d_model], positions [seq] or [batch, seq], layer cache or None,
# segments [batch, seq] or None) -> (x, layer cache)`.
BlockFn = Callable[[jax.Array, jax.Array, Any, Any], tuple[jax.Array, Any]]
# `jax.checkpoint` policies of the `Remat` choices: what the backward pass finds saved; it recomputes the rest.
# (Dots without batch dimensions are the projections and MLP matmuls; attention's scores are recomputed.)
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class RMSNorm(nnx.Module):
    """Root-mean-square normalisation with a learned per-channel scale, computed in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    @jax.named_scope("norms")
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # [..., dim]
        inv_rms = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)  # [..., 1]
        return (x32 * inv_rms * self.scale[...]).astype(x.dtype)


def rotary_angles(
    positions: jax.Array, head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """Cosines and sines of the rotary angles, each [..., seq, head_dim], for integer `positions` [..., seq]
    (one row of positions for every sequence, or a row per sequence of a packed batch).

    Channel pairs (i, i + head_dim / 2) share an angle, so each half of the last axis repeats the other.
    """
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # [head_dim / 2]
    if scaling is not None:
        inv_freq = llama3_scaled(inv_freq, scaling)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., seq, head_dim / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [..., seq, head_dim]
    return jnp.cos(angles), jnp.sin(angles)


def llama3_scaled(inv_freq: jax.Array, scaling: Llama3RopeScaling) -> jax.Array:
    """The rotary frequencies `inv_freq` as Llama 3.1 scales them (see `Llama3RopeScaling`)."""
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_ones = jnp.where(wavelength > context / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    # Between the two wavelengths, a blend that runs from the divided frequency to the kept one.
    blend = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - blend) * long_ones / scaling.factor + blend * long_ones
    between = (wavelength >= context / scaling.high_freq_factor) & (wavelength <= context / scaling.low_freq_factor)
    return jnp.where(between, blended, long_ones)


# Make (-x2, x1) from x = (x1, x2) as a product with a signed permutation matrix instead of slicing each head in
# halves. On a TPU a half of a 64-wide head is laid out padded to the vector registers' 128 lanes, so the slices
# moved four times the head's bytes; the product is exact (each sum has one term, +x or -x). On a v5e a 125M
# Llama trained 13% faster with the same losses.
ROTATE_BY_MATMUL = True
# Multiply by the angles' cosines and sines in the compute dtype, as Hugging Face's Llama does, not in float32:
# a 125M Llama on a v5e in bfloat16 trained a further 3.5% faster (loss after 10 steps 3.43153 against 3.43134).
ROTARY_IN_COMPUTE_DTYPE = True


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate channel pairs of `x` [batch, seq, heads, head_dim] by the position angles.

    Channel i pairs with channel i + head_dim / 2 (the Hugging Face Llama layout, so exported weights
    need no permutation): x * cos + (-x2, x1) * sin. The dot product of a rotated query and key then
    depends only on their distance.
    """
    if ROTATE_BY_MATMUL:
        rotated = jnp.einsum("...d,de->...e", x, half_rotation(x.shape[-1], x.dtype), precision="highest")
    else:
        x1, x2 = jnp.split(x, 2, axis=-1)  # [batch, seq, heads, head_dim / 2] each
        rotated = jnp.concatenate([-x2, x1], axis=-1)  # [batch, seq, heads, head_dim]
    if ROTARY_IN_COMPUTE_DTYPE:
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    cos, sin = cos[..., None, :], sin[..., None, :]  # [seq, 1, head_dim] or [batch, seq, 1, head_dim]
    return (x * cos + rotated * sin).astype(x.dtype)


def half_rotation(head_dim: int, dtype: Any) -> jax.Array:
    """The [head_dim, head_dim] matrix R with (x1, x2) @ R = (-x2, x1)."""
    half = jnp.eye(head_dim // 2, dtype=dtype)
    zero = jnp.zeros_like(half)
    return jnp.block([[zero, half], [-half, zero]])


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Softmax attention of queries [b, sq, heads, d] over keys/values [b, sk, kv_heads, d], causally masked.

    `segments` [b, seq] (queries and keys at the same places) number the documents packed into each row: a
    query then sees only keys of its own document.

    When queries and keys cover the same positions (training, or a whole prompt), the first half of the
    queries can only see the first half of the keys, so the halves are attended separately: the quarter
    of the score matrix that the mask would discard is never computed (a train step ~9% faster on CPU).
    """
    seq = q.shape[1]
    if seq != k.shape[1] or seq % 2:
        return masked_attention(q, k, v, q_positions, k_positions, segments, segments)
    half = seq // 2
    first_segments = None if segments is None else segments[:, :half]
    second_segments = None if segments is None else segments[:, half:]
    first = masked_attention(
        q[:, :half], k[:, :half], v[:, :half], q_positions[:half], k_positions[:half], first_segments, first_segments
    )
    second = masked_attention(q[:, half:], k, v, q_positions[half:], k_positions, second_segments, segments)
    return jnp.concatenate([first, second], axis=1)  # [b, sq, heads * d]


def masked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    q_segments: jax.Array | None = None,
    k_segments: jax.Array | None = None,
) -> jax.Array:
    """`causal_attention` computed over all query/key pairs, with the mask applied to the scores; with
    segments ([b, sq] and [b, sk]), a query sees only keys of its own segment.

    With fewer key/value heads than query heads (grouped-query attention), each key/value head is
    repeated for its group of query heads. Scores and softmax are float32 whatever the compute dtype.
    """
    batch, sq, heads, head_dim = q.shape
    groups = heads // k.shape[2]
    if groups > 1:
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)  # [b, sk, heads, d]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(head_dim)  # [b, heads, sq, sk]
    visible = (k_positions[None, :] <= q_positions[:, None])[None, None]  # [1, 1, sq, sk]
    if q_segments is not None:
        visible = visible & same_segment(q_segments, k_segments)
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [b, heads, sq, sk]
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)  # [b, sq, heads, d]
    return out.reshape(batch, sq, heads * head_dim)  # [b, sq, heads * d]


def same_segment(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """[b, 1, sq, sk]: whether each query and key belong to the same document of their packed row."""
    return (q_segments[:, :, None] == k_segments[:, None, :])[:, None]


def update_cache(
    layer_cache: tuple[jax.Array, jax.Array], k: jax.Array, v: jax.Array, start: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Write this call's keys and values [b, s, kv, d] into the layer's cache at position `start`."""
    k_cache, v_cache = layer_cache
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, start, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, start, 0, 0))
    return k_cache, v_cache


def over_token_rows(mlp: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """`mlp` applied to `x` [batch, seq, d_model] as one [batch * seq, d_model] matrix, reshaped back.

    The result is the same; the reason is speed. On CPU, XLA compiles the backward pass of elementwise
    work on 3-D activations that feeds a weight gradient into slow transposing loops (a fifth of a train
    step for the SwiGLU product); on 2-D rows it does not. The attention projections use rows too.
    """
    rows = x.reshape(-1, x.shape[-1])  # [batch * seq, d_model]
    return mlp(rows).reshape(*x.shape[:-1], -1)  # [batch, seq, d_model]


def require_vocab(config: ModelConfig) -> int:
    """`config.vocab_size`, which must be set to build a model."""
    if config.vocab_size is None:
        raise ConfigError("model.vocab_size: must be set to build the model (the trainer takes it from the data)")
    return config.vocab_size


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty key/value cache for `batch` sequences of up to `max_len` tokens."""
    shape = (batch, max_len, config.kv_heads, config.head_dim)
    layers = [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(config.n_layers)]
    return {"layers": layers, "index": jnp.zeros((), jnp.int32)}


def fused_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """`causal_attention` of queries and keys at the same positions by `jax.nn.dot_product_attention`, which
    takes grouped key/value heads as they are. On a GPU in 16-bit it asks for cuDNN's flash attention (the
    score matrix is never stored); elsewhere, or with packed documents' `segments` (a mask cuDNN's kernel does
    not take), XLA's version, which computes every score (slower than the reference's halves). Scores and
    softmax are float32, as in the reference."""
    batch, seq, heads, head_dim = q.shape
    flash = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16) and segments is None
    kernel = "cudnn" if flash else "xla"
    mask = None if segments is None else same_segment(segments, segments)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation=kernel)  # [b, seq, heads, d]
    return out.reshape(batch, seq, heads * head_dim)


# Block sizes splash attention tiles a sequence into, the largest that divides it. Blocks of 1024 compute more of
# the masked scores than 512 but keep the v5e's matrix units busier: a 125M Llama trained 3% faster at sequence 2048.
SPLASH_BLOCKS = (1024, 512, 256, 128)
# One backward kernel makes dq beside dk and dv from scores it makes once: on a TPU v5e at sequence 2048 it trained
# a 125M Llama 7% faster and a 350M 6% faster than separate dq and dkv kernels, with the same losses.
SPLASH_FUSED_BACKWARD = True
# Rows that are one document each go to the kernel without segment ids, which it would compare block by block;
# True gives it ids of zeros instead, as before: on a v5e at sequence 2048 a 125M Llama trained 0.5% slower with
# them and a 350M the same (51.3 against 51.6% MFU; 52.78 against 52.82%).
SPLASH_ZERO_SEGMENTS = False


def splash_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None = None, *, interpret: bool = False
) -> jax.Array:
    """`causal_attention` of queries and keys at the same positions by Pallas's splash kernel for TPUs: scores
    are made block by block in the chip's VMEM and never stored, and blocks above the diagonal are skipped.
    It takes grouped key/value heads as they are. XLA cannot split a Pallas kernel over devices, so under a mesh
    it runs per device (`jax.shard_map`: rows over the batch axes, heads over `tensor`). `interpret` runs it
    in Pallas's interpreter (any platform). Packed documents' `segments` go to the kernel as its segment ids.
    The sequence length must be a multiple of 128."""
    batch, seq, heads, head_dim = q.shape
    if segments is None and SPLASH_ZERO_SEGMENTS:
        segments = jnp.zeros((batch, seq), jnp.int32)
    segment_args = () if segments is None else (segments,)

    def per_device(q: jax.Array, k: jax.Array, v: jax.Array, *segments: jax.Array) -> jax.Array:
        from jax.experimental.pallas.ops.tpu import splash_attention as splash  # Pallas loads only when used

        mask = splash.MultiHeadMask([splash.CausalMask((seq, seq))] * q.shape[2])
        sizes = splash.BlockSizes(**splash_block_sizes(seq))
        kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
        segment_ids = splash.SegmentIds(q=segments[0], kv=segments[0]) if segments else None
        out = jax.vmap(kernel)(
            _swap_seq_heads(q * head_dim**-0.5), _swap_seq_heads(k), _swap_seq_heads(v), segment_ids=segment_ids
        )
        return _swap_seq_heads(out)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        # Each chip's query heads must find their key/value heads on the same chip: split heads over `tensor`
        # only where it divides both counts, else every chip takes them all.
        tensor = mesh.shape["tensor"]
        split = "tensor" if heads % tensor == 0 and k.shape[2] % tensor == 0 else None
        spec = P(BATCH_AXES, None, split, None)
        rows = P(BATCH_AXES, None)
        in_specs = (spec, spec, spec) + (rows,) * len(segment_args)
        per_device = jax.shard_map(per_device, in_specs=in_specs, out_specs=spec, check_vma=False)
    return per_device(q, k, v, *segment_args).reshape(batch, seq, heads * head_dim)


def splash_block_sizes(seq: int) -> dict[str, Any]:
    """The splash kernel's tiling of a sequence of `seq` tokens (`splash.BlockSizes`' fields): every block the
    largest of `SPLASH_BLOCKS` that divides it."""
    block = next(size for size in SPLASH_BLOCKS if seq % size == 0)
    sizes: dict[str, Any] = dict.fromkeys(("block_q", "block_kv", "block_kv_compute"), block)
    sizes |= dict.fromkeys(("block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute"), block)
    if SPLASH_FUSED_BACKWARD:
        return sizes | {"use_fused_bwd_kernel": True}
    return sizes | dict.fromkeys(("block_q_dq", "block_kv_dq"), block)


def _swap_seq_heads(x: jax.Array) -> jax.Array:
    """[batch, seq, heads, d] <-> [batch, heads, seq, d] (the splash kernel's layout)."""
    return x.transpose(0, 2, 1, 3)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    positions: jax.Array,
    layer_cache: tuple[jax.Array, jax.Array] | None,
    implementation: Attention = "reference",
    segments: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Causal attention of this call's queries over its keys/values, or, with a `layer_cache`, over every
    position cached so far (this call's keys and values written in first); returns the layer cache too.
    `implementation` picks the kernel when there is no cache (`Attention`). Without a cache, `segments`
    [batch, seq] keep each packed document's attention to itself (its `positions` restart, so the causal
    order is the tokens' order in the row)."""
    if layer_cache is None:
        if implementation == "dot_product":
            return fused_causal_attention(q, k, v, segments), None
        if implementation in ("splash", "splash_interpret"):
            return splash_causal_attention(q, k, v, segments, interpret=implementation == "splash_interpret"), None
        order = jnp.arange(q.shape[1])
        return causal_attention(q, k, v, order, order, segments), None
    layer_cache = update_cache(layer_cache, k, v, positions[0])
    k, v = layer_cache
    return causal_attention(q, k, v, positions, jnp.arange(k.shape[1])), layer_cache


def output_head(config: ModelConfig, vocab: int, *, dtype: Any, rngs: nnx.Rngs) -> nnx.Linear | None:
    """The untied output projection, or None when the head is the transposed embedding (`tie_embeddings`,
    as in GPT-2; saves vocab * d_model parameters)."""
    if config.tie_embeddings:
        return None
    init = nnx.initializers.normal(config.init_std)
    return nnx.Linear(config.d_model, vocab, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)


def scaled_init(config: ModelConfig) -> Any:
    """GPT-2's init for a block's output projections: each block adds to the residual stream, so shrink them
    by sqrt(2 * n_layers) to keep the stream's variance from growing with depth."""
    return nnx.initializers.normal(config.init_std / math.sqrt(2 * config.n_layers))


def batch_sharded(x: jax.Array) -> jax.Array:
    """`x` [batch, ...] held with its rows split over the mesh's batch axes and its other dimensions whole, when
    compiled under a mesh (`jax.set_mesh`; the trainer's steps are). The residual stream between blocks is
    pinned so: otherwise XLA may follow a weight's fsdp split of the embedding width into the activations and
    keep every row on every device (4.7 times the HBM of a 12-layer step on a v5e slice)."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *([None] * (x.ndim - 1))))


class StackedBlocks(nnx.Module):
    """A scanned model's blocks as one block whose every weight has a leading layer axis [n_layers, ...].

    `scan_blocks` runs it as one loop, and the train state, the optimizer and the checkpoints hold one array per
    weight rather than one per layer, so that neither the compiled program nor the optimizer's update grows with
    depth. It is built from the per-layer blocks (the unrolled model's initial weights); `blocks[i]` is layer
    `i`'s block again, for decoding with a cache. `per_layer_params` and `stacked_params` convert pure
    parameter dicts between the two layouts (Hugging Face files and init_from are per layer).
    """

    def __init__(self, blocks: Sequence[nnx.Module]):
        graphdef, _ = nnx.split(blocks[0])
        self.layer = nnx.merge(graphdef, jax.tree.map(lambda *layers: jnp.stack(layers), *map(nnx.state, blocks)))
        self.count = len(blocks)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> nnx.Module:
        graphdef, stacked = nnx.split(self.layer)
        return nnx.merge(graphdef, jax.tree.map(lambda x: x[index], stacked))

    def __iter__(self) -> Iterator[nnx.Module]:
        return (self[index] for index in range(self.count))


def block_stack(blocks: list[nnx.Module], scan_layers: bool) -> nnx.List | StackedBlocks:
    """A model's blocks: stacked for a scanned model (`StackedBlocks`), else a list of modules."""
    return StackedBlocks(blocks) if scan_layers else nnx.List(blocks)


def per_layer_params(params: dict[str, Any]) -> dict[str, Any]:
    """A pure parameter dict with `StackedBlocks`' blocks (`{"blocks": {"layer": ...}}`) split into one entry per
    layer (`{"blocks": {0: ..., 1: ...}}`), as an unrolled model holds them; any other dict as it is."""
    if "layer" not in params.get("blocks", {}):
        return params
    stacked = params["blocks"]["layer"]
    layers = len(jax.tree.leaves(stacked)[0])
    return {**params, "blocks": {i: jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(layers)}}


def stacked_params(params: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `per_layer_params`: per-layer blocks stacked as `StackedBlocks` holds them."""
    layers = [params["blocks"][i] for i in sorted(params["blocks"])]
    return {**params, "blocks": {"layer": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}}


def scan_blocks(
    blocks: StackedBlocks, x: jax.Array, positions: jax.Array, segments: jax.Array | None, remat: Remat
) -> jax.Array:
    """`x` [batch, seq, d_model] through the stacked blocks in order, as one `jax.lax.scan` over their weights:
    XLA compiles the block once, whatever the depth."""
    graphdef, stacked = nnx.split(blocks.layer)

    def body(x: jax.Array, state: Any) -> tuple[jax.Array, None]:
        return batch_sharded(nnx.merge(graphdef, state)(x, positions, None, segments)[0]), None

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat])
    return jax.lax.scan(body, x, stacked)[0]


def decode(
    tokens: jax.Array,
    cache: KVCache | None,
    *,
    max_seq_len: int,
    embed: Callable[[jax.Array, jax.Array], jax.Array],
    blocks: Sequence[BlockFn] | StackedBlocks,
    norm: Callable[[jax.Array], jax.Array],
    remat: BlockRemat = "none",
    segments: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """The body of a decoder: tokens [batch, seq] (int) -> final normalised hidden states [batch, seq, d_model].

    `embed(tokens, positions)` gives the residual stream, each block updates it, `norm` closes it. With a
    `cache` (from `init_cache`), `tokens` continue the cached sequence at `cache["index"]`; the second
    result is the cache updated (None without one). Without a cache, `remat` says what each block keeps for
    the backward pass (`REMAT_POLICIES`; one policy, or one per block), and `StackedBlocks` run as one loop
    (`scan_blocks`, one policy for all); the values
    computed are the same. A row of packed documents (no cache) gives their `segments` and `positions`
    [batch, seq] (`tradewind.data.DocumentBatch`): attention stays within a document, positions restart.
    """
    seq = tokens.shape[1]
    if seq > max_seq_len:
        raise ValueError(f"sequence of {seq} tokens is longer than max_seq_len ({max_seq_len})")
    if positions is None:
        positions = (0 if cache is None else cache["index"]) + jnp.arange(seq)  # [seq]
    with jax.named_scope("embedding"):
        x = batch_sharded(embed(tokens, positions))  # [batch, seq, d_model]
    if cache is None and isinstance(blocks, StackedBlocks):
        return norm(scan_blocks(blocks, x, positions, segments, remat)), None
    policies = (remat,) * len(blocks) if isinstance(remat, str) else remat
    if cache is None and any(policy != "none" for policy in policies):
        # Each block as a pure function of its state (as `scan_blocks` runs them): `nnx.remat` of the module
        # itself fails when only part of its state is differentiated (a LoRA run's adapters).
        for block, policy in zip(blocks, policies, strict=True):
            if policy == "none":
                x = batch_sharded(block(x, positions, None, segments)[0])
                continue
            graphdef, state = nnx.split(block)

            def run(state: Any, x: jax.Array, graphdef: nnx.GraphDef = graphdef) -> jax.Array:
                return nnx.merge(graphdef, state)(x, positions, None, segments)[0]

            x = batch_sharded(jax.checkpoint(run, policy=REMAT_POLICIES[policy])(state, x))
        return norm(x), None
    layers = []
    for i, block in enumerate(blocks):
        x, layer_cache = block(x, positions, None if cache is None else cache["layers"][i], segments)
        x = batch_sharded(x)
        layers.append(layer_cache)
    x = norm(x)
    if cache is None:
        return x, None
    return x, {"layers": layers, "index": cache["index"] + seq}


class Decoder(nnx.Module):
    """The contract both architectures keep: `features` (the decoder body) and `head_weight` (the output
    projection), from which the call computes logits. The training loss takes the two separately, so that
    it can fuse the projection with the cross-entropy (`tradewind.trainer.cross_entropy`)."""

    dtype: Any  # compute dtype of the matmuls
    max_seq_len: int
    blocks: Sequence[BlockFn] | StackedBlocks  # stacked: training steps run them as one loop (`scan_blocks`)

    def embed_tokens(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """The residual stream [batch, seq, d_model] that tokens [batch, seq] at `positions` [seq] start."""
        raise NotImplementedError

    def final_norm(self, x: jax.Array) -> jax.Array:
        """The normalisation after the last block."""
        raise NotImplementedError

    def features(
        self,
        tokens: jax.Array,
        cache: KVCache | None = None,
        remat: BlockRemat = "none",
        segments: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final normalised hidden states [batch, seq, d_model] of tokens [batch, seq], and the cache; packed
        documents give their `segments` and `positions` (`decode`)."""
        return decode(
            tokens,
            cache,
            max_seq_len=self.max_seq_len,
            embed=self.embed_tokens,
            blocks=self.blocks,
            norm=self.final_norm,
            remat=remat,
            segments=segments,
            positions=positions,
        )

    def head_weight(self) -> jax.Array:
        """The output projection [d_model, vocab] in the compute dtype."""
        raise NotImplementedError

    def __call__(self, tokens: jax.Array, cache: KVCache | None = None):
        """Logits [batch, seq, vocab] (float32) of tokens [batch, seq]; with a cache, `(logits, cache updated)`."""
        x, updated = self.features(tokens, cache)
        logits = jnp.dot(x.astype(self.dtype), self.head_weight(), preferred_element_type=jnp.float32)
        return logits if cache is None else (logits, updated)


def head_weight(embed: nnx.Embed, lm_head: nnx.Linear | None, dtype: Any) -> jax.Array:
    """The untied head's kernel, or the transposed embedding when the head is tied; [d_model, vocab] in `dtype`."""
    weight = embed.embedding[...].T if lm_head is None else lm_head.kernel[...]
    return weight.astype(dtype)
