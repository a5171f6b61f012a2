"""Whether a TPU run fits its slice, from compiling its steps for that slice here, with no TPU attached.

`compile_for_slice` runs `tradewind.trainer.compile` as a job on the local backend (libtpu's compile-only client
needs its environment set before JAX starts, and JAX stays out of the server) and keeps each report in
`<workspace>/cache/tpu/`, named by a hash of everything the compiled program depends on (the trainer's own
source included), so that `estimate_run` and then `launch_training` compile a run once. `fit_slice` is
the preflight of `estimate_run`, `tradewind compile` and `launch_training`: a run whose train step does not fit a
chip's HBM is trained with the first memory change that fits (checked by compiling it), and the tool says which
and what it costs; where none fits, it is refused before anything queues, with the bytes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tradewind.cluster import Accelerator, JobSpec, Placement, Resources
from tradewind.cluster.tpus import TPU_COMPILE_ENV
from tradewind.core import InvalidInputError, TradewindError, get_logger, make_id, read_json
from tradewind.runs import TrainConfig
from tradewind.runs.compile import COMPILE_CALLABLE, CompileJob, TpuCompileReport
from tradewind.runs.config import named_fields, with_fields
from tradewind.runs.flops import training_memory
from tradewind.tools.context import Cancelled, Progress, ToolContext, no_progress, run_job

GIB = 2**30
COMPILE_TIMEOUT_S = 600.0
# What a compiled step depends on besides the target: a report is reused for another run only if these match.
STEP_FIELDS = {"model", "optimizer", "batch_size", "seq_len", "grad_accum", "compute_dtype", "mesh", "z_loss"}
STEP_FIELDS |= {"on_nonfinite", "remat", "remat_blocks", "attention", "scan_layers", "lora"}

log = get_logger(__name__)


def can_compile_for_tpu() -> bool:
    """Whether libtpu (the `tpu` extra) is installed here, so TPU programs can be compiled."""
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Refuse to go on where libtpu is not installed, saying how to install it.

    Raises:
        InvalidInputError: libtpu is not installed here.
    """
    if not can_compile_for_tpu():
        raise InvalidInputError(
            "compiling for a TPU slice needs libtpu, which is not installed here: pip install -e '.[tpu]' "
            "(jax's tpu extra; it compiles for TPUs on any machine)"
        )


def compile_for_slice(
    ctx: ToolContext,
    config: TrainConfig,
    placement: Placement,
    vocab_size: int,
    *,
    timeout_s: float = COMPILE_TIMEOUT_S,
    progress: Progress = no_progress,
) -> TpuCompileReport:
    """The compile report of `config` on its TPU slices (`placement`'s accelerator and slices): from the
    workspace's cache when this program was compiled before, else from a compile job.

    Raises:
        InvalidInputError: libtpu is not installed here; the mesh or the batch does not split over the chips.
        TradewindError: the compile job failed (its log's end in the message) or ran past `timeout_s`.
        Cancelled: the caller cancelled.
    """
    (report,) = compile_in_order(ctx, [config], placement, vocab_size, timeout_s=timeout_s, progress=progress)
    return report


def compile_in_order(
    ctx: ToolContext,
    configs: list[TrainConfig],
    placement: Placement,
    vocab_size: int,
    *,
    until_fits: bool = False,
    train_only: bool = False,
    timeout_s: float = COMPILE_TIMEOUT_S,
    progress: Progress = no_progress,
) -> list[TpuCompileReport | None]:
    """The compile reports of `configs` on their TPU slices, in their order: each from the workspace's cache when
    its program was compiled before, the others from one compile job (JAX and libtpu start once). With
    `until_fits`, the configs after the first that fits are not compiled: None. With it or `train_only`, only
    their train steps are (whether they fit), not their eval steps.

    Raises:
        As `compile_for_slice`.
    """
    require_libtpu()
    accelerator, slices = placement.accelerator, placement.slices
    for config in configs:
        check_splits(config, placement.chips)
    folder = ctx.workspace.root / "cache" / "tpu"
    cached = [folder / f"{_program_key(config, vocab_size, accelerator, slices)}.json" for config in configs]
    reader = ctx.workspace.reader("accelerator")
    reports = [TpuCompileReport.model_validate(read_json(path, reader)) if path.is_file() else None for path in cached]
    wanted = _up_to_first_fit(reports) if until_fits else len(configs)
    missing = [index for index in range(wanted) if reports[index] is None]
    if missing:
        job_id = make_id("compile")
        out_path = ctx.workspace.jobs_dir / job_id / "compile.json"
        job = CompileJob(
            configs=[configs[index] for index in missing],
            vocab_size=vocab_size,
            accelerator=accelerator,
            slices=slices,
            until_fits=until_fits,
            train_only=train_only,
            output_file=str(out_path),
        )
        spec = JobSpec(
            name=f"compile {job_id}",
            callable=COMPILE_CALLABLE,
            kwargs=job.model_dump(mode="json"),
            log_path=str(out_path.with_name("compile.log")),
            resources=Resources(cpus=1),  # compiled here, on this machine's CPU
            env=TPU_COMPILE_ENV,
        )
        activity = f"compiling for {slices} x {accelerator}"
        run_job(ctx, spec, job_id=job_id, timeout_s=timeout_s, activity=activity, progress=progress)
        compiled = read_json(out_path, ctx.workspace.reader("config"))
        ctx.workspace.make_dir(folder, argument="accelerator")
        for index, found in zip(missing, compiled, strict=False):  # with until_fits, it stops at a fit
            reports[index] = TpuCompileReport.model_validate(found)
            ctx.workspace.write_atomic(cached[index], reports[index].model_dump_json(), argument="accelerator")
    wanted = _up_to_first_fit(reports) if until_fits else len(configs)
    return reports[:wanted] + [None] * (len(configs) - wanted)


def _up_to_first_fit(reports: list[TpuCompileReport | None]) -> int:
    """How many reports there are up to and with the first that fits (all of them, when none does)."""
    return next((index + 1 for index, report in enumerate(reports) if report is not None and report.fits), len(reports))


@dataclass(frozen=True)
class SliceFit:
    """A TPU run as it will train on its slice: its config, changed where it did not fit as given, and how."""

    config: TrainConfig
    report: TpuCompileReport | None = None  # its compile; None where libtpu is not installed here
    change: str | None = None  # the change the preflight made, e.g. "optimizer.bf16_moments=true"
    cost: str | None = None  # what the change costs
    needed: str | None = None  # what the run as given needed

    def note(self, placement: Placement) -> str | None:
        """One sentence saying what was changed to fit, and what it costs; None when nothing was."""
        if self.change is None:
            return None
        step = self.report.step
        speed = f"; estimated {step.seconds:.3g} s a step, {step.mfu:.0%} MFU" if step is not None else ""
        return (
            f"as given it does not fit {placement.slices} x {placement.accelerator.tpu_type} ({self.needed}), so it "
            f"trains with {self.change}: {self.report.hbm_bytes / GIB:,.2f} GiB per chip (compiled){speed}; "
            f"{self.cost}"
        )


def fit_slice(
    ctx: ToolContext, config: TrainConfig, placement: Placement, vocab_size: int, progress: Progress = no_progress
) -> SliceFit:
    """`config` as it fits one chip's HBM of its slice: as given where it fits, else with the first of the memory
    changes (`memory_changes`, least costly in speed first) that does, each checked by compiling it; a change that
    recomputes every block with HBM to spare then recomputes as few as fit, unrolled (`recompute_fewer`).

    The run and its changes are compiled in one job, stopping at the first that fits; a config whose weights,
    gradients and optimizer state alone exceed a chip (`state_floor`) is not compiled. Without libtpu nothing
    can be compiled here: the run is let through as given, with a warning in the server's log.

    Raises:
        InvalidInputError: neither it nor any change fits; the message names the bytes needed and available.
    """
    if not can_compile_for_tpu():
        log.warning("libtpu is not installed: %s is launched without checking that it fits", placement.accelerator)
        return SliceFit(config)
    check_splits(config, placement.chips)  # named first, even where the run is too big to be compiled
    chip = placement.accelerator.tpu.chip
    changes = [MemoryChange("", "", {}), *memory_changes(config, placement)]
    changed = {change.name: change.applied_to(config) for change in changes}
    hopeful = [change for change in changes if state_floor(changed[change.name], vocab_size) <= chip.hbm_bytes]
    reports = compile_in_order(
        ctx, [changed[change.name] for change in hopeful], placement, vocab_size, until_fits=True, progress=progress
    )
    compiled = {change.name: report for change, report in zip(hopeful, reports, strict=True)}
    if "" in compiled and compiled[""].fits:
        return SliceFit(config, compiled[""])
    if "" in compiled:
        needed = f"its train step needs {compiled[''].hbm_bytes / GIB:,.2f} GiB of HBM per chip (compiled here)"
    else:
        needed = (
            f"its weights, gradients and {config.optimizer.type} state alone need "
            f"{state_floor(config, vocab_size) / GIB:,.2f} GiB of HBM per chip"
        )
    fitting = next((change for change in hopeful if compiled[change.name] and compiled[change.name].fits), None)
    if fitting is None:
        tried = " or ".join(change.name for change in changes[1:])
        raise InvalidInputError(
            f"argument 'accelerator': the run does not fit {placement.slices} x {placement.accelerator.tpu_type}: "
            f"{needed}, and a {chip.device_kind} chip has {chip.hbm_bytes / GIB:,.2f} GiB; {tried} does not fit "
            "either: take a larger slice, or a smaller model, batch_size or seq_len"
        )
    fit = SliceFit(changed[fitting.name], compiled[fitting.name], fitting.name, fitting.cost, needed)
    return fewer_recomputed(ctx, fit, fitting, config, placement, vocab_size, progress)


def fewer_recomputed(
    ctx: ToolContext,
    fit: SliceFit,
    change: MemoryChange,
    given: TrainConfig,
    placement: Placement,
    vocab_size: int,
    progress: Progress,
) -> SliceFit:
    """`fit` (`given` with `change`) with as few blocks recomputed as fit (`recompute_fewer`), or as it is. Blocks
    the change scanned are unrolled for it; unrolled, they compile longer and, all recomputed, run 1% slower, so
    that pays only where at least two keep their activations (recomputing the last block saves no HBM)."""
    unrolls = bool(change.fields.get("scan_layers")) and not given.scan_layers
    config = with_fields(fit.config, {"scan_layers": False}) if unrolls else fit.config
    fewer = recompute_fewer(ctx, config, placement, vocab_size, progress=progress)
    blocks = config.model.n_layers
    if fewer is None or (unrolls and fewer[0].remat_blocks > blocks - 2):
        return fit
    config, report = fewer
    fields = {**change.fields, **({"scan_layers": False} if unrolls else {}), "remat_blocks": config.remat_blocks}
    cost = f"{change.cost}; full remat in the first {config.remat_blocks} of the {blocks} blocks only"
    if unrolls:
        cost += f"; {UNROLLED_COST}"
    return SliceFit(config, report, named_fields(fields), cost, fit.needed)


# Of a chip's HBM, what `recompute_fewer` leaves free: the runtime keeps some for itself (a v5e's 16 GiB shows 15.75
# to programs), and a run that fills the rest to the byte is one allocation away from running out.
HBM_LEFT_FREE = 0.05


def recompute_fewer(
    ctx: ToolContext,
    config: TrainConfig,
    placement: Placement,
    vocab_size: int,
    *,
    budget_bytes: int | None = None,
    progress: Progress = no_progress,
) -> tuple[TrainConfig, TpuCompileReport] | None:
    """A run with full remat of every unrolled block, as it fits its chip with the fewest blocks recomputed
    (`remat_blocks`), with that compile: each block that keeps its activations runs its forward once instead of
    twice. None where no fewer fit in `budget_bytes` (default: the chip's HBM less `HBM_LEFT_FREE`), or where it
    is not such a run.

    Every block that keeps its activations adds about the same bytes, so the run as given and with half its
    blocks recomputed give that amount (one job; the first is cached where it was the launch's fit); the count it
    allows is then compiled to check, with one more block recomputed where it does not fit. Those are compiled in
    one job, the fewest first, and the first within the budget wins.
    """
    blocks = config.model.n_layers
    if config.remat != "full" or config.scan_layers or config.remat_blocks is not None or blocks < 2:
        return None
    budget = budget_bytes or int(placement.accelerator.tpu.chip.hbm_bytes * (1 - HBM_LEFT_FREE))
    compile_train_steps = functools.partial(
        compile_in_order, ctx, placement=placement, vocab_size=vocab_size, train_only=True, progress=progress
    )
    try:
        every, halved = compile_train_steps([config, _with_remat_blocks(config, blocks // 2)])
        per_block = (halved.hbm_bytes - every.hbm_bytes) / (blocks - blocks // 2)
        if not every.fits or per_block <= 0 or every.hbm_bytes + per_block > budget:
            return None
        fewest = max(1, blocks - int((budget - every.hbm_bytes) // per_block))
        counts = sorted(count for count in {fewest, fewest + 1, blocks // 2} if count < blocks)
        candidates = [_with_remat_blocks(config, count) for count in counts]
        reports = compile_train_steps(candidates)
    except Cancelled:
        raise
    except TradewindError as error:  # a refinement only (a model's unrolled blocks can compile for long)
        log.warning("fewer blocks recomputed on %s not checked, so every block is: %s", placement.accelerator, error)
        return None
    within = [(c, r) for c, r in zip(candidates, reports, strict=True) if r.fits and r.hbm_bytes <= budget]
    return within[0] if within else None


def _with_remat_blocks(config: TrainConfig, count: int) -> TrainConfig:
    """`config` with full remat of its first `count` blocks."""
    return with_fields(config, {"remat_blocks": count})


def state_floor(config: TrainConfig, vocab_size: int) -> int:
    """Bytes per chip that `config`'s weights, their gradients and its optimizer state need at the least
    (`training_memory`'s, over the chips they are sharded across; the optimizer state not counted where it is kept
    in host memory): a config above a chip's HBM cannot fit it, whatever its activations."""
    memory = training_memory(config, vocab_size)
    on_chip = memory.weight_bytes if config.optimizer.host_state else memory.state_bytes
    return on_chip // (config.mesh.fsdp * config.mesh.tensor)


def check_splits(config: TrainConfig, chips: int) -> None:
    """Refuse a mesh that does not cover `chips` devices, or a microbatch that does not split over them.

    Raises:
        InvalidInputError: naming the field, the sizes and the chips.
    """
    mesh = config.mesh
    if (mesh.data == -1 and chips % (mesh.fsdp * mesh.tensor)) or (
        mesh.data != -1 and mesh.data * mesh.fsdp * mesh.tensor != chips
    ):
        raise InvalidInputError(
            f"argument 'mesh': data x fsdp x tensor = {mesh.data} x {mesh.fsdp} x {mesh.tensor} does not cover the "
            f"slice's {chips} chips; give data=-1 and an fsdp x tensor that divides {chips}"
        )
    rows = chips // mesh.tensor  # data x fsdp: the devices a batch's rows are split over
    if config.batch_size % config.grad_accum or (config.batch_size // config.grad_accum) % rows:
        raise InvalidInputError(
            f"argument 'batch_size': batch_size / grad_accum = {config.batch_size} / {config.grad_accum} must be a "
            f"whole multiple of the {rows} devices its rows split over (data x fsdp on {chips} chips)"
        )


@dataclass(frozen=True)
class MemoryChange:
    """A change of a run's fields that lowers the HBM it needs per chip, and what it costs."""

    name: str  # the fields as a person sets them: "remat=full and scan_layers=true"
    cost: str  # what it costs, in speed or in what is learned
    fields: dict[str, Any]  # dotted field names to values

    def applied_to(self, config: TrainConfig) -> TrainConfig:
        """`config` with this change."""
        return with_fields(config, self.fields)


def _change(cost: str, **fields: Any) -> MemoryChange:
    """A `MemoryChange` of `fields` (`__` for a section's dot), named by them."""
    dotted = {name.replace("__", "."): value for name, value in fields.items()}
    return MemoryChange(named_fields(dotted), cost, dotted)


# What each memory option costs, as measured where a figure is given (docs/reports/benchmarks.md).
SHARDED_COST = "each chip gathers the parameters it uses over the slice's links"
BF16_MOMENTS_COST = "no slower; the moments keep 8 bits of mantissa (the demo model's eval loss 0.4% higher)"
REMAT_COST = "each block's forward pass is computed again in the backward pass: about a third more compute"
UNROLLED_COST = "the blocks unrolled compile longer than scanned (a 1B Llama: 80 s against 18 s on a v5e)"
UNROLLED_REMAT_COST = f"{REMAT_COST}; {UNROLLED_COST} and run 1% slower"
ACCUM_COST = "half the rows in each matmul: slower where a microbatch is small"
HOST_STATE_COST = "the moments cross between host and chip memory every step"
ADAFACTOR_COST = (
    "Adafactor (a factored second moment, no momentum) learns differently from AdamW: at the same learning rate the "
    "demo model's eval loss was 18% higher after 300 steps"
)


def memory_changes(config: TrainConfig, placement: Placement) -> list[MemoryChange]:
    """The changes that may make `config` fit its slice, by what they cost, least first: parameters sharded over
    every chip; moments in bfloat16; activations recomputed (full remat), alone and with bfloat16 moments, with
    the blocks scanned and then unrolled (which needs less HBM depends on the model: scanned where activations
    dominate, unrolled where the gradients do, as the scanned loop holds every block's at once; benchmarks page);
    half the microbatch (twice grad_accum); the moments in host memory; the frugal end (Adafactor's factored state
    with no momentum, and full remat) and that with one row per device in each microbatch. Those the run has
    already, that an earlier one makes, or that do not split over the chips, are left out."""
    mesh, chips, optimizer = config.mesh, placement.chips, config.optimizer
    recompute: dict[str, Any] = {"remat": "full", "scan_layers": True}
    if config.remat_blocks is not None:  # every block, not the run's first few
        recompute["remat_blocks"] = None
    # Adafactor's second moment is a row and a column per matrix: halved or in host memory, it saves next to nothing.
    factored = optimizer.type == "adafactor"
    halve_moments = not optimizer.bf16_moments and not factored
    changes = []
    if mesh.fsdp * mesh.tensor < chips:
        changes.append(_change(SHARDED_COST, mesh__data=-1, mesh__fsdp=chips // mesh.tensor))
    if halve_moments:
        changes.append(_change(BF16_MOMENTS_COST, optimizer__bf16_moments=True))
    if config.remat != "full" or config.remat_blocks is not None:
        unrolled = {**recompute, "scan_layers": False}
        for layers, cost in ((recompute, REMAT_COST), (unrolled, UNROLLED_REMAT_COST)):
            changes.append(_change(cost, **layers))
            if halve_moments:
                changes.append(_change(f"{BF16_MOMENTS_COST}; {cost}", optimizer__bf16_moments=True, **layers))
    changes.append(_change(ACCUM_COST, grad_accum=2 * config.grad_accum))
    if not optimizer.host_state and not factored:
        host = {"optimizer__host_state": True, "optimizer__bf16_moments": True, **recompute}
        changes.append(_change(f"{HOST_STATE_COST}; {REMAT_COST}", **host))
    frugal = {"optimizer__type": "adafactor", **recompute}
    changes.append(_change(f"{ADAFACTOR_COST}; {REMAT_COST}", **frugal))
    one_row = config.batch_size // (chips // mesh.tensor)
    if one_row > config.grad_accum:
        changes.append(_change(f"{ADAFACTOR_COST}; {REMAT_COST}; {ACCUM_COST}", **frugal, grad_accum=one_row))
    fitting, seen = [], [config]
    for change in changes:
        try:
            changed = change.applied_to(config)
            check_splits(changed, chips)
        except (ValidationError, InvalidInputError):  # the batch does not split that way
            continue
        if changed not in seen:  # Adafactor with full remat, say, for an Adafactor run
            fitting.append(change)
            seen.append(changed)
    return fitting


@functools.cache  # read once per process: every compile of a launch (and each candidate change) asks for it
def trainer_source_hash() -> str:
    """A hash of the source that builds the compiled program: the trainer's (model, step, sharding) and the run
    configs it reads (`tradewind.runs`), so that a report cached before Tradewind itself changed is not reused."""
    digest = hashlib.sha256()
    for name in ("tradewind.trainer", "tradewind.runs"):
        package = Path(importlib.util.find_spec(name).origin).parent
        for path in sorted(package.rglob("*.py")):
            digest.update(f"{name}/{path.relative_to(package).as_posix()}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _program_key(config: TrainConfig, vocab_size: int, accelerator: Accelerator, slices: int) -> str:
    """A hash of what the compiled program depends on: the step's fields, the target, the compiler, and the
    trainer's own code."""
    versions = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "libtpu")}
    what = {
        "config": config.model_dump(mode="json", include=STEP_FIELDS),
        "vocab_size": vocab_size,
        "target": [str(accelerator), slices],
        "versions": versions,
        "trainer": trainer_source_hash(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]
