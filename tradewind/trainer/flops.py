"""Parameter and FLOP accounting of a model shape, and the peak-FLOPs table used for MFU.

Imports no JAX: the tools report a configuration's size before anything trains.

Model FLOPs per token, forward and backward, follow the PaLM paper's appendix B:
`6 * N_matmul + 12 * n_layers * d_model * seq_len`, where `N_matmul` counts the weights that take part
in a matrix multiply (projections, MLP and the output head, but not the embedding lookup or norms) and
the second term is the attention score and value products (not halved for the causal mask).
"""

from __future__ import annotations

from tradewind.trainer.config import ModelConfig

# Dense bf16 peak FLOP/s per chip, from the vendors' data sheets (no sparsity).
PEAK_FLOPS: dict[str, float] = {
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,  # v5e reports itself as "TPU v5 lite"
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,  # v6e (Trillium)
    "tpu v6e": 918e12,
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}
# A CPU core doing 2 x 8-wide float32 FMAs per cycle (AVX2) at ~3 GHz: 96 GFLOP/s. Only an estimate.
CPU_FLOPS_PER_CORE = 2 * 2 * 8 * 3.0e9


def matmul_params(config: ModelConfig) -> int:
    """Weights used in matrix multiplies (projections, MLP, output head); needs `vocab_size`."""
    d, ff, kv = config.d_model, config.ff_dim, config.kv_heads * config.head_dim
    per_layer = 3 * d * d + d * d + 2 * d * ff if config.type == "gpt2" else 2 * d * d + 2 * d * kv + 3 * d * ff
    return config.n_layers * per_layer + d * (config.vocab_size or 0)


def count_model_params(config: ModelConfig) -> int:
    """Trainable parameters of the model `config` describes (equal to `count_params` of the built model)."""
    d, vocab, ff = config.d_model, config.vocab_size or 0, config.ff_dim
    head = 0 if config.tie_embeddings else d * vocab
    if config.type == "gpt2":
        per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 4 * d
        return vocab * d + config.max_seq_len * d + config.n_layers * per_layer + 2 * d + head
    kv = config.kv_heads * config.head_dim
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * ff + 2 * d
    return vocab * d + config.n_layers * per_layer + d + head


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Model FLOPs per trained token (forward and backward) at sequence length `seq_len`."""
    return 6.0 * matmul_params(config) + 12.0 * config.n_layers * config.d_model * seq_len


def peak_flops(device_kind: str, cpu_cores: int) -> tuple[float, str]:
    """Peak FLOP/s of one device of `device_kind` (as `jax.devices()[0].device_kind` says) and how it was found.

    Returns:
        `(flops, source)`; for unknown accelerators and CPUs an estimate, which `source` says.
    """
    kind = device_kind.lower()
    for name in sorted(PEAK_FLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_FLOPS[name], f"table entry {name!r} (bf16 dense)"
    return cpu_cores * CPU_FLOPS_PER_CORE, (
        f"estimate for {device_kind!r}: {cpu_cores} cores x 96 GFLOP/s (8-wide fp32 FMA x2 at 3 GHz)"
    )
