"""Training memory of a config, and the peak-FLOPs table used for MFU.

Imports no JAX: the tools report a configuration's size before anything trains.

A model's own parameter and FLOP counts are methods of its config (`tradewind.runs.models.configs`).

Training memory follows Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer
Models": a block stores `s * b * d * (34 + 5 * heads * s / d)` bytes of 16-bit activations, doubled here
for float32, plus the logits and their gradient; weights, gradients and optimizer moments are float32. The
`5 * heads * s / d` term is the attention scores, which only the reference attention keeps (splash and cuDNN's
flash attention recompute them); `remat` keeps less: `save_matmuls` the matmuls' outputs (no scores), `full` each
block's input alone (in the first `remat_blocks` blocks, where set; the others keep everything), and one block's
activations are rebuilt at a time. A LoRA run (`TrainConfig.lora`) trains
only its adapters (float32, with gradients and moments) and holds its frozen base in bfloat16, with neither; its
activations are counted as a full run's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tradewind.cluster.tpus import CHIPS
from tradewind.runs.config import TrainConfig


def block_logits(platform: str) -> int:
    """The logits of one block of the fused cross-entropy (`cross_entropy.py`) on `platform`. On a CPU, 32 MiB of
    float32: large enough for full-speed matmuls, small enough for cache. On an accelerator, 256 MiB: each block
    reads and writes the float32 [d_model, vocab] gradient of the head, so a block of 256 rows (vocabulary 32768)
    spent 10% of a 125M model's step on a TPU v5e doing that; 2048 rows take an eighth of it."""
    return 8 * 1024 * 1024 if platform == "cpu" else 64 * 1024 * 1024


# Dense bf16 peak FLOP/s per chip, from the vendors' data sheets (no sparsity). A TPU by the name JAX gives its
# devices ("TPU v5 lite" is a v5e) or by its generation ("TPU v5e"); the figures are `cluster.tpus.CHIPS`'.
PEAK_FLOPS: dict[str, float] = {
    **{chip.device_kind.lower(): chip.peak_bf16_flops for chip in CHIPS.values()},
    **{f"tpu {chip.generation}": chip.peak_bf16_flops for chip in CHIPS.values()},
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}
# The CPU estimate assumes two FMA units per core, each doing one fused multiply-add (2 FLOPs) per float32
# lane per cycle. Lanes come from the widest vector extension /proc/cpuinfo lists, the clock from its
# "cpu MHz" (often the base clock: turbo makes the real ceiling higher; CPUs that split 512-bit vectors
# into two halves make it lower). Without /proc/cpuinfo (macOS, Windows) it assumes AVX2 at 3 GHz.
CPU_FMA_UNITS = 2
CPU_VECTOR_LANES = {"avx512f": 16, "avx2": 8, "avx": 8, "asimd": 4, "sse2": 4}  # widest first


# Float32 values kept per trained parameter: the weight, its gradient and the optimizer's moments.
STATE_FLOATS_PER_PARAM = {"adamw": 4, "lion": 3, "adafactor": 2}
FROZEN_BYTES_PER_PARAM = 2  # a LoRA run's base model, held in bfloat16 and never differentiated


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training process holds: the weights with the trained ones' gradients and optimizer state, and
    activations."""

    params: int  # trained: every parameter, or a LoRA run's adapters
    frozen: int  # only read: a LoRA run's base model; else 0
    weight_bytes: int  # every weight, and the trained ones' gradients
    optimizer_bytes: int  # the trained weights' optimizer moments
    activation_bytes: int
    sequences: int  # in one microbatch of one process, whose activations `activation_bytes` counts

    @property
    def state_bytes(self) -> int:
        """Weights, gradients and optimizer state."""
        return self.weight_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def training_memory(config: TrainConfig, vocab_size: int, processes: int = 1, platform: str = "cpu") -> MemoryEstimate:
    """What one of `processes` data-parallel processes needs to train `config` on `platform` (`cpu`, `gpu` or
    `tpu`: which attention kernel 'auto' is) (an estimate).

    Each process holds a whole copy of the parameters and state and one microbatch of its share of the batch.
    Trained parameters take `4 * STATE_FLOATS_PER_PARAM[optimizer]` bytes each (the moments 2 bytes each with
    `optimizer.bf16_moments`); a LoRA run's frozen base `FROZEN_BYTES_PER_PARAM`.

    Raises:
        ConfigError: `config.lora` targets projections the model does not have (`LoraConfig.count_params`).
    """
    model = config.model.model_copy(update={"vocab_size": config.model.vocab_size or vocab_size})
    if config.lora is None:
        params, frozen = model.count_params(), 0
    else:
        params, frozen = config.lora.count_params(model), model.count_params()
    weight_bytes = 2 * 4 * params + FROZEN_BYTES_PER_PARAM * frozen  # a trained weight and its gradient in float32
    moment_bytes = 2 if config.optimizer.bf16_moments else 4
    optimizer_bytes = moment_bytes * (STATE_FLOATS_PER_PARAM[config.optimizer.type] - 2) * params
    sequences = max(1, config.batch_size // (config.grad_accum * processes))
    tokens = sequences * config.seq_len
    scores = 5 * model.n_heads * config.seq_len / model.d_model if keeps_scores(config, platform) else 0.0
    unit = 2 * tokens * model.d_model  # the bytes of one float32 [tokens, d_model] activation, counted in halves
    kept = {"none": 34 + scores, "save_matmuls": 34, "full": 2}
    recomputing = config.recomputed_blocks
    kept_in_blocks = recomputing * kept[config.remat] + (model.n_layers - recomputing) * kept["none"]
    rebuilt = 0 if config.remat == "none" else 34 + scores  # the block whose activations the backward recomputes
    # The fused cross-entropy holds one block of logits at a time, with its softmax and gradient.
    logits = 3 * 4 * min(tokens * model.vocab_size, block_logits(platform))
    activations = int(unit * (kept_in_blocks + rebuilt) + logits)
    return MemoryEstimate(params, frozen, weight_bytes, optimizer_bytes, activations, sequences)


def keeps_scores(config: TrainConfig, platform: str) -> bool:
    """Whether `config`'s attention kernel on `platform` keeps each block's [seq, seq] scores for the backward
    pass: the reference does, and `dot_product` off a GPU (XLA's); 'auto' is flash attention on a GPU and splash
    on a TPU, which do not."""
    if config.attention == "auto":
        return platform == "cpu"
    return config.attention == "reference" or (config.attention == "dot_product" and platform != "gpu")


def peak_flops(device_kind: str, cpu_cores: int) -> tuple[float, str]:
    """Peak FLOP/s of one device of `device_kind` (as `jax.devices()[0].device_kind` says) and how it was found.

    Returns:
        `(flops, source)`; for unknown accelerators and CPUs an estimate, which `source` says.
    """
    kind = device_kind.lower()
    for name in sorted(PEAK_FLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_FLOPS[name], f"table entry {name!r} (bf16 dense)"
    return cpu_peak_flops(cpu_cores, device_kind)


def cpu_peak_flops(cores: int, device_kind: str = "cpu", cpuinfo: str | None = None) -> tuple[float, str]:
    """An estimate of the float32 peak of `cores` CPU cores, and a sentence saying how it was reached.

    Args:
        cores: cores the run may use.
        device_kind: the device's name, quoted in the sentence.
        cpuinfo: the text of /proc/cpuinfo; read from the system when None (empty where there is none).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
                cpuinfo = file.read()
        except OSError:
            cpuinfo = ""
    extension, lanes = "avx2, assumed", 8
    flags = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.MULTILINE)
    if flags:
        present = set(flags.group(1).split())
        extension, lanes = next(((name, n) for name, n in CPU_VECTOR_LANES.items() if name in present), ("scalar", 1))
    clock, clock_source = 3.0e9, "assumed"
    mhz = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo, re.MULTILINE)
    if mhz and float(mhz.group(1)) > 0:
        clock, clock_source = float(mhz.group(1)) * 1e6, "cpu MHz in /proc/cpuinfo"
    flops = cores * CPU_FMA_UNITS * 2 * lanes * clock
    return flops, (
        f"estimate for {device_kind!r}: {cores} cores x {CPU_FMA_UNITS} FMA units x 2 FLOP x {lanes} float32 "
        f"lanes ({extension}) x {clock / 1e9:.2f} GHz ({clock_source})"
    )
