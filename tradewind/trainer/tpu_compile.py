"""Compile a run's train and eval steps for a TPU slice it does not hold, and read what the slice would need.

libtpu (the `tpu` extra) has a compile-only client: `jax.experimental.topologies.get_topology_desc` gives the
devices of any TPU topology with no TPU attached, and XLA compiles for them. `compile_for_tpu` builds the run's
model and optimizer state as abstract arrays (`nnx.eval_shape`; no weight is ever materialised, so a 70B config
compiles on a laptop), lays them on the slice's mesh with the run's sharding rule, and compiles the exact steps
`setup_training` compiles (same model, optimizer, precision, grad accumulation and donation). From the compiled
programs it reads, per chip:

- the HBM the train step needs (XLA's peak of the buffers live at once) against the chip's; a program that does
  not fit fails to compile, and the compiler's message gives its temporaries;
- the collectives by kind, with the bytes each chip sends;
- an estimated step time, and the MFU and tokens/s that follow, from the step's kinds of work at the rates a
  real chip was measured to run them (`estimate_step`, `STEP_CALIBRATION`): an estimate, not a measurement.

No network is used: `TPU_COMPILE_ENV` (`tradewind.cluster.tpus`) tells libtpu not to ask a metadata server; it
must be in the environment before JAX starts, as in the compile job `estimate_run` submits
(`tradewind.trainer.compile.compile_job`). The report's types are in `tradewind.trainer.compile`.

Example:
    report = compile_for_tpu(config, vocab_size=32768, target=tpu_slice("v5litepod-16"))
    report.fits, report.hbm_bytes, report.step.seconds
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import topologies
from jax.sharding import Mesh

from tradewind.cluster.tpus import TpuSlice
from tradewind.runs.compile import Collective, StepEstimate, TpuCompileReport
from tradewind.runs.config import TrainConfig
from tradewind.runs.models.configs import ModelConfig
from tradewind.trainer.optimizer import build_optimizer
from tradewind.trainer.setup import attention_kernel, build_run_model, compute_dtype, lower_steps, split_run_model
from tradewind.trainer.sharding import (
    batch_sharding,
    build_mesh,
    check_batch_split,
    optimizer_shardings,
    param_shardings,
)
from tradewind.trainer.step import weights_and_streams
from tradewind.trainer.trace_summary import COLLECTIVES, hlo_computations

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
_DTYPE_BYTES |= {"f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(pred|bf16|[fsu]\d+)\[([\d,]*)\]")
_LISTED_GROUPS = re.compile(r"replica_groups=\{\{([\d,]+)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[\d+,(\d+)\]<=")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(.*?)\](?:, device_ids=\(.*?\))? \{(.*?)\}")
# `%name = SHAPE op(OPERANDS...)` where op is a collective or its async start; SHAPE may be a tuple, and a TPU
# layout (`{1,0:T(8,128)}`) holds parentheses, so the op is found by its name.
_COLLECTIVE_LINE = re.compile(r"= (.*?) (" + "|".join(COLLECTIVES) + r")(-start)?\(")
_WHILE = re.compile(r"condition=%([\w.\-]+), body=%([\w.\-]+)")
_CONSTANT = re.compile(r"constant\((\d+)\)")
_OUT_OF_MEMORY = re.compile(r"temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compile_for_tpu(
    config: TrainConfig, vocab_size: int, target: TpuSlice, slices: int = 1, *, with_eval: bool = True
) -> TpuCompileReport:
    """Compile `config`'s train and eval steps for `slices` slices of `target` and report what they need.

    Args:
        config: the run (its model, optimizer, precision, mesh rule, batch and grad accumulation).
        vocab_size: the tokenizer's, used where `config.model.vocab_size` is null.
        target: the TPU slice (a placement's `accelerator.tpu`, or `tpu_slice("v5litepod-16")`).
        slices: slices training together; the mesh's `data` axis spans them.
        with_eval: also compile the eval step (False: only whether training fits is wanted).

    Raises:
        ConfigError: the mesh does not fit the slice's chips, or the batch does not split over it.
    """
    devices = topologies.get_topology_desc(
        platform="tpu",
        topology_name=target.jax_topology,
        chip_config_name="megacore" if target.chip.megacore else "default",
        chips_per_host_bounds=target.host_bounds,
        num_slices=slices,
    ).devices
    mesh = build_mesh(config.mesh, list(devices))
    check_batch_split(config, mesh)
    dtype = compute_dtype(config.compute_dtype, platform="tpu")
    model_config = config.model.model_copy(update={"vocab_size": config.model.vocab_size or vocab_size})
    start = time.perf_counter()
    train_lowered, eval_lowered, arguments = lower_abstract_steps(config, model_config, mesh, platform="tpu")
    report = {
        "target": target.tpu_type,
        "slices": slices,
        "hosts": target.hosts * slices,
        "chips": len(devices),
        "device_kind": devices[0].device_kind,
        "mesh": dict(mesh.shape),
        "compute_dtype": jnp.dtype(dtype).name,
        "attention": attention_kernel(config.attention, dtype, config.seq_len, platform="tpu"),
    }
    try:
        train_step = train_lowered.compile()
        eval_step = eval_lowered.compile() if with_eval else None
    except jax.errors.JaxRuntimeError as error:
        found = _OUT_OF_MEMORY.search(str(error))
        if "RESOURCE_EXHAUSTED" not in str(error) or found is None:
            raise
        temporaries = int(float(found.group(1)) * _UNITS[found.group(2)])
        return TpuCompileReport(
            **report,
            compile_s=time.perf_counter() - start,
            fits=False,
            hbm_bytes=arguments + temporaries,
            hbm_available_bytes=target.chip.hbm_bytes,
            arguments_bytes=arguments,
            temporaries_bytes=temporaries,
            eval_hbm_bytes=None,
            collectives=[],
            step=None,
            compiler_message=str(error).strip(),
        )
    compile_s = time.perf_counter() - start
    memory = train_step.memory_analysis()
    needed = hbm_needed(memory)
    collectives = collectives_of(train_step.as_text())
    return TpuCompileReport(
        **report,
        compile_s=compile_s,
        fits=needed <= target.chip.hbm_bytes,
        hbm_bytes=needed,
        hbm_available_bytes=target.chip.hbm_bytes,
        arguments_bytes=memory.argument_size_in_bytes,
        temporaries_bytes=memory.temp_size_in_bytes,
        eval_hbm_bytes=hbm_needed(eval_step.memory_analysis()) if eval_step is not None else None,
        collectives=collectives,
        step=estimate_step(config, model_config, target, slices, collectives),
        compiler_message=None,
    )


def lower_abstract_steps(
    config: TrainConfig, model_config: ModelConfig, mesh: Mesh, platform: str
) -> tuple[Any, Any, int]:
    """`config`'s train and eval steps lowered for `mesh` (`lower_steps`) from abstract arrays: no weight is
    materialised. Also the bytes one device holds of the steps' arguments (weights, optimizer state, a batch).

    `platform` is the one the model is built for (its attention kernel and compute dtype): the mesh's devices may
    be a TPU slice's that this host does not hold."""
    model = nnx.eval_shape(lambda: build_run_model(config, model_config, platform=platform))
    graphdef, eval_graphdef, params, frozen = split_run_model(model, config)
    optimizer = build_optimizer(config.optimizer)
    params = _laid_out(params, param_shardings(mesh, params))
    frozen = _laid_out(frozen, param_shardings(mesh, frozen))
    opt_state = jax.eval_shape(optimizer.init, weights_and_streams(params)[0])
    opt_state = _laid_out(opt_state, optimizer_shardings(mesh, opt_state, config.optimizer.host_state))
    batch = jax.ShapeDtypeStruct((config.batch_size, config.seq_len + 1), jnp.int32, sharding=batch_sharding(mesh))
    arguments = sum(map(_bytes_per_chip, (params, frozen, opt_state, batch)))
    train_lowered, eval_lowered = lower_steps(
        config, (graphdef, eval_graphdef), optimizer, mesh, params, opt_state, batch, frozen
    )
    return train_lowered, eval_lowered, arguments


@dataclass(frozen=True)
class StepCalibration:
    """How fast one chip ran each kind of the trainer's work, measured by profiling its steps there.

    Attributes:
        matmul: the model's matrix multiplies (6 FLOPs a weight a token, 8 with full remat) over the chip's peak.
        attention: the splash kernel's rate on the attention FLOPs MFU counts, over the peak, by the width of a
            head (the kernel's products run along it: 64-wide heads fill half the matrix unit's 128 lanes); a
            width between two measured ones takes the narrower one's rate (`attention_rate`).
        attention_forward: the forward pass's share of the kernel's time (remat runs it again).
        elementwise_bytes: HBM bytes per token, layer and unit of `d_model` of all the rest (norms, rotary
            embedding, residual adds, layout copies, the loss's softmax, the optimizer), at the HBM bandwidth, by
            the width of a head as `attention` (heads narrower than the matrix unit take layout copies of their own).
        elementwise_again: the share of those bytes a block that remat recomputes moves again.
        overhead: host, loop and idle time, over the step.
        source: where and when it was measured.
    """

    matmul: float
    attention: dict[int, float]
    attention_forward: float
    elementwise_bytes: dict[int, float]
    elementwise_again: float
    overhead: float
    source: str

    def attention_rate(self, head_dim: int) -> float:
        """The splash kernel's rate for heads `head_dim` wide (`by_head_width`)."""
        return by_head_width(self.attention, head_dim)

    def elementwise(self, head_dim: int) -> float:
        """The element-wise bytes per token, layer and unit of `d_model` for heads `head_dim` wide."""
        return by_head_width(self.elementwise_bytes, head_dim)


def by_head_width(measured: dict[int, float], head_dim: int) -> float:
    """The figure measured at the widest head width not above `head_dim` (the narrowest's, for narrower heads)."""
    widths = sorted(measured)
    return measured[max((w for w in widths if w <= head_dim), default=widths[0])]


# The one table of measured rates. A generation not in it is estimated with the v5e's, scaled by its own peak and
# bandwidth (`TpuChip`), and its estimate says so.
STEP_CALIBRATION = {
    "v5e": StepCalibration(
        matmul=0.80,
        attention={64: 0.43, 128: 0.86},
        attention_forward=0.30,
        elementwise_bytes={64: 160.0, 128: 90.0},
        elementwise_again=0.25,
        overhead=0.012,
        source=(
            "one TPU v5e chip, 2026-12-06: the profiles of a 125M, a 350M and a 1B Llama at sequence 2048 "
            "(benchmarks/tpu_chip.py; the rows of the code as it is in benchmarks/results/tpu_chip-2026-12-06b.jsonl); "
            "128-wide heads' attention 2026-12-07 (the 350M in 8 heads, tpu_chip-2026-12-07b.jsonl); 2026-12-08: "
            "128-wide heads' element-wise bytes from the 350M's profile, and what a recomputed block runs again from "
            "the remat choices of the three shapes (tpu_chip-2026-12-08.jsonl)"
        ),
    ),
}
REFERENCE_SCORE_BYTES = 24  # HBM bytes a score of the reference attention moves (written, read back, its gradient)


def estimate_step(
    config: TrainConfig, model: ModelConfig, target: TpuSlice, slices: int, collectives: list[Collective]
) -> StepEstimate:
    """The step time of `config`'s train step on `slices` slices of `target`, by kind of work at the rates the
    chip was measured to run it (`STEP_CALIBRATION`), per chip.

    Matmuls: the model's matmul FLOPs (8 a block's weight a token with full remat, which runs the block's forward
    again; `remat_blocks` counts only the blocks it names) at the calibrated share of the peak. Attention: the
    score and value products MFU counts, at the splash kernel's measured rate (its forward again in the blocks
    remat recomputes), or for the reference kernel at the matmul rate with its scores' traffic. Element-wise: the
    calibrated bytes per token, layer and unit of `d_model` for the model's head width (a share again in the blocks
    remat recomputes) at the HBM bandwidth. The three add up, plus the loop's overhead. Network: each chip's
    collective bytes over a ring on one torus axis (two of the chip's `2 x dims` links), plus, with several slices,
    the float32 gradients of one host's chips crossing the data-centre network twice (an all-reduce over slices);
    taken to overlap the compute, so the step is the longer of the two.
    """
    chips = target.chips * slices
    chip = target.chip
    rates = STEP_CALIBRATION.get(chip.generation, STEP_CALIBRATION["v5e"])
    tokens = config.tokens_per_step / chips
    remat = config.recomputed_blocks / model.n_layers  # the share of the blocks whose forward runs again
    compute_s = config.flops_per_token(model.vocab_size) * tokens / chip.peak_bf16_flops
    matmul_flops = 6.0 * model.matmul_params() * tokens
    if config.remat == "full":  # save_matmuls keeps the products' outputs
        matmul_flops += 2.0 * remat * model.n_layers * model.block_matmul_params() * tokens
    matmul_s = matmul_flops / (chip.peak_bf16_flops * rates.matmul)
    attention_flops = model.attention_product_flops(config.seq_len) * tokens
    kernel = attention_kernel(config.attention, compute_dtype(config.compute_dtype, "tpu"), config.seq_len, "tpu")
    if kernel == "splash":
        forward_again = rates.attention_forward * remat
        attention_rate = rates.attention_rate(model.head_dim)
        attention_s = attention_flops / (chip.peak_bf16_flops * attention_rate) * (1 + forward_again)
    else:  # every score made and stored: the products at the matmul rate, the scores at the HBM bandwidth
        scores = model.n_layers * model.n_heads * config.seq_len * tokens * REFERENCE_SCORE_BYTES
        attention_s = attention_flops / (chip.peak_bf16_flops * rates.matmul) + scores / chip.hbm_bytes_per_s
    elementwise_again = rates.elementwise_again * remat
    elementwise = rates.elementwise(model.head_dim) * tokens * model.n_layers * model.d_model * (1 + elementwise_again)
    elementwise_s = elementwise / chip.hbm_bytes_per_s
    ring_bytes_per_s = chip.ici_bytes_per_s / chip.torus_dims / 2
    network_s = sum(c.bytes for c in collectives) / ring_bytes_per_s
    if slices > 1:  # each host's share of the float32 gradients, reduced across slices over DCN
        network_s += 2 * 4 * model.count_params() / chips * target.chips_per_host / chip.dcn_bytes_per_s
    seconds = max((matmul_s + attention_s + elementwise_s) * (1 + rates.overhead), network_s)
    measured_on = "" if chip.generation in STEP_CALIBRATION else f" ({chip.generation} not measured: the v5e's rates)"
    return StepEstimate(
        seconds=seconds,
        method=(
            "per chip, by kind of work at the rates measured on a chip: matmuls + attention kernel + element-wise "
            "at HBM bandwidth, plus the loop's overhead; or the collectives over the ICI ring (+ DCN between "
            "slices) where longer. An estimate, not a measurement"
        ),
        calibration=rates.source + measured_on,
        compute_s=compute_s,
        matmul_s=matmul_s,
        attention_s=attention_s,
        elementwise_s=elementwise_s,
        network_s=network_s,
        mfu=compute_s / seconds if seconds else 0.0,
        tokens_per_s_per_chip=tokens / seconds if seconds else 0.0,
    )


def collectives_of(hlo: str) -> list[Collective]:
    """The collectives of a compiled program's HLO text, by kind, with the bytes each chip sends for them.

    Each is costed as a ring over its group of n devices: an all-gather sends (n-1)/n of its output, a
    reduce-scatter n-1 times its output, an all-reduce twice (n-1)/n of its array, an all-to-all (n-1)/n of it,
    a permute all of it. An asynchronous collective counts once, at its `-start` (whose result pairs its input
    with its output). One inside a loop (scanned layers, gradient accumulation) counts once per iteration.
    """
    counts: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    computations = hlo_computations(hlo)
    runs = _runs_per_step(computations)
    for name, lines in computations.items():
        for line in lines:
            found = _COLLECTIVE_LINE.search(line)
            if found is None:
                continue
            result, kind, start = found.groups()
            shapes = _SHAPE.findall(result)
            size, n = _bytes_of(shapes[-1:] if start else shapes), _group_size(line)
            share = (n - 1) / n
            ring = {"all-gather": share, "reduce-scatter": n - 1, "all-reduce": 2 * share, "all-to-all": share}
            counts[kind] += runs.get(name, 1)
            sent[kind] += round(ring.get(kind, 1) * size) * runs.get(name, 1)
    return [Collective(kind=kind, count=counts[kind], bytes=sent[kind]) for kind in COLLECTIVES if counts[kind]]


def _runs_per_step(computations: dict[str, list[str]]) -> dict[str, int]:
    """How many times each loop body runs per call of the program, nested loops multiplying: its condition's
    bound, the integer constant the loop counter is compared with."""
    runs, pending = {"ENTRY": 1}, ["ENTRY"]
    while pending:
        caller = pending.pop()
        for line in computations.get(caller, []):
            if found := _WHILE.search(line):
                condition, body = found.groups()
                bounds = [int(c) for line in computations.get(condition, []) for c in _CONSTANT.findall(line)]
                runs[body] = runs[caller] * max(bounds, default=1)
                pending.append(body)
    return runs


def _group_size(line: str) -> int:
    """Devices in each replica group of a collective: `{{0,1,2,3}}`, `[2,4]<=[8]`, or a mesh's named axes."""
    if found := _LISTED_GROUPS.search(line):
        return len(found.group(1).split(","))
    if found := _IOTA_GROUPS.search(line):
        return int(found.group(1))
    if found := _MESH_GROUPS.search(line):
        sizes = {name: int(size) for name, size in re.findall(r"'(\w+)'=(\d+)", found.group(1))}
        return math.prod(sizes.get(name, 1) for name in re.findall(r"'(\w+)'", found.group(2)))
    return 1


def _bytes_of(shapes: list[tuple[str, str]]) -> int:
    """Bytes of the arrays of `(dtype, dims)` pairs as HLO writes them (`bf16`, `8,128`)."""
    return sum(_DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d) for dtype, dims in shapes)


def _laid_out(tree: Any, shardings: Any) -> Any:
    """Abstract arrays of `tree`'s shapes and dtypes, placed by `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _bytes_per_chip(tree: Any) -> int:
    """Bytes one device holds of the abstract arrays of `tree` (their shards)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def hbm_needed(memory: Any) -> int:
    """HBM a compiled program needs per device: XLA's peak of the buffers live at once, where it reports one, else
    arguments, outputs and temporaries less the aliased buffers. The sum counts buffers that are never live together:
    a 1B train step it put at 18.0 GiB peaked at 14.05 GiB, and trained on a 15.75 GiB TPU v5e (2026-12-06)."""
    if getattr(memory, "peak_memory_in_bytes", 0) > 0:
        return memory.peak_memory_in_bytes
    return (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def compiler_cost(compiled: Any) -> dict[str, float]:
    """The compiler's cost analysis of a compiled program (`flops`, `bytes accessed`, ...; one loop body counted
    once)."""
    analysis = compiled.cost_analysis()
    return (analysis[0] if isinstance(analysis, list) else analysis) or {}
