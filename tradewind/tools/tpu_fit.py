"""Whether a TPU run fits its slice, from compiling its steps for that slice here, with no TPU attached.

`compile_for_slice` runs `tradewind.trainer.compile` as a job on the local backend (libtpu's compile-only client
needs its environment set before JAX starts, and JAX stays out of the server) and keeps each report in
`<workspace>/cache/tpu/`, named by a hash of everything the compiled program depends on (the trainer's own
source included), so that `estimate_run` and then `launch_training` compile a run once. `check_fits_slice` is
launch_training's check: a run whose train step does not fit a chip's HBM is refused before anything queues,
with the bytes and one change that fits, itself checked by compiling it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

from pydantic import ValidationError

from tradewind.cluster import JobSpec, Placement, Resources
from tradewind.cluster.tpus import TPU_COMPILE_ENV, tpu_slice
from tradewind.core import InvalidInputError, get_logger, make_id, read_json
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.trainer import TrainConfig
from tradewind.trainer.compile import COMPILE_CALLABLE, CompileJob, TpuCompileReport
from tradewind.trainer.flops import training_memory

GIB = 2**30
COMPILE_TIMEOUT_S = 600.0
# What a compiled step depends on besides the target: a report is reused for another run only if these match.
STEP_FIELDS = {"model", "optimizer", "batch_size", "seq_len", "grad_accum", "compute_dtype", "mesh", "z_loss"}
STEP_FIELDS |= {"on_nonfinite", "remat", "attention", "scan_layers", "lora"}

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
    timeout_s: float = COMPILE_TIMEOUT_S,
    progress: Progress = no_progress,
) -> list[TpuCompileReport | None]:
    """The compile reports of `configs` on their TPU slices, in their order: each from the workspace's cache when
    its program was compiled before, the others from one compile job (JAX and libtpu start once). With
    `until_fits`, the configs after the first that fits are not compiled: None.

    Raises:
        As `compile_for_slice`.
    """
    require_libtpu()
    tpu_type, slices = placement.accelerator.tpu_type, placement.slices
    for config in configs:
        check_splits(config, placement.chips)
    folder = ctx.workspace.root / "cache" / "tpu"
    cached = [folder / f"{_program_key(config, vocab_size, tpu_type, slices)}.json" for config in configs]
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
            tpu_type=tpu_type,
            slices=slices,
            until_fits=until_fits,
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
        activity = f"compiling for {slices} x {tpu_type}"
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


def check_fits_slice(
    ctx: ToolContext, config: TrainConfig, placement: Placement, vocab_size: int, progress: Progress = no_progress
) -> None:
    """Refuse a TPU run whose train step does not fit one chip's HBM, saying by how much and what would fit.

    The run and the changes that might make it fit are compiled in one job, stopping at the first that fits;
    a config whose weights, gradients and optimizer state alone exceed a chip (`state_floor`) is not compiled.
    Without libtpu nothing can be compiled here: the run is let through, with a warning in the server's log.

    Raises:
        InvalidInputError: it does not fit; the message names the bytes needed and available and one change
            (fsdp over every chip, full remat, twice the gradient accumulation, or the frugal end) that compiles
            within the chip.
    """
    if not can_compile_for_tpu():
        log.warning("libtpu is not installed: %s is launched without checking that it fits", placement.accelerator)
        return
    check_splits(config, placement.chips)  # named first, even where the run is too big to be compiled
    chip = tpu_slice(placement.accelerator.tpu_type).chip
    changes = [("", config), *_changes(config, placement)]
    hopeful = [(name, change) for name, change in changes if state_floor(change, vocab_size) <= chip.hbm_bytes]
    reports = compile_in_order(
        ctx, [change for _, change in hopeful], placement, vocab_size, until_fits=True, progress=progress
    )
    compiled = dict(zip((name for name, _ in hopeful), reports, strict=True))
    if "" in compiled and compiled[""].fits:
        return
    if "" in compiled:
        needed = f"its train step needs {compiled[''].hbm_bytes / GIB:,.2f} GiB of HBM per chip (compiled here)"
    else:
        needed = (
            f"its weights, gradients and {config.optimizer.type} state alone need "
            f"{state_floor(config, vocab_size) / GIB:,.2f} GiB of HBM per chip"
        )
    fitting = next(((name, report) for name, report in compiled.items() if report is not None and report.fits), None)
    if fitting is not None:
        change = f"with {fitting[0]} it fits ({fitting[1].hbm_bytes / GIB:,.2f} GiB per chip, compiled)"
    else:
        tried = " or ".join(name for name, _ in changes[1:])
        change = f"{tried} does not fit either: take a larger slice, or a smaller model, batch_size or seq_len"
    raise InvalidInputError(
        f"argument 'accelerator': the run does not fit {placement.slices} x {placement.accelerator.tpu_type}: "
        f"{needed}, and a {chip.device_kind} chip has {chip.hbm_bytes / GIB:,.2f} GiB; {change}"
    )


def state_floor(config: TrainConfig, vocab_size: int) -> int:
    """Bytes per chip that `config`'s weights, their gradients and its optimizer state need at the least
    (`training_memory`'s, over the chips they are sharded across): a config above a chip's HBM cannot fit it,
    whatever its activations."""
    return training_memory(config, vocab_size).state_bytes // (config.mesh.fsdp * config.mesh.tensor)


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


def _changes(config: TrainConfig, placement: Placement) -> list[tuple[str, TrainConfig]]:
    """The changes that may make `config` fit its slice, by what they cost in speed, least first: parameters
    sharded over every chip, activations recomputed (full remat, scanned blocks), half the microbatch (twice
    grad_accum), the frugal end (Adafactor's factored state with no momentum, and full remat), and that with
    one row per device in each microbatch. Those that do not split over the chips are left out."""
    mesh, chips = config.mesh, placement.chips
    updates = []
    if mesh.fsdp * mesh.tensor < chips:
        fsdp = chips // mesh.tensor
        updates.append((f"mesh.fsdp={fsdp}", {"mesh": {"data": -1, "fsdp": fsdp, "tensor": mesh.tensor}}))
    if config.remat != "full":  # scanned: with full remat it needs less HBM than unrolled (benchmarks page)
        updates.append(("remat=full and scan_layers=true", {"remat": "full", "scan_layers": True}))
    updates.append((f"grad_accum={2 * config.grad_accum}", {"grad_accum": 2 * config.grad_accum}))
    frugal = {"optimizer": {**config.optimizer.model_dump(), "type": "adafactor"}, "remat": "full", "scan_layers": True}
    updates.append(("optimizer.type=adafactor, remat=full and scan_layers=true", frugal))
    one_row = config.batch_size // (chips // mesh.tensor)
    if one_row > config.grad_accum:
        name = f"optimizer.type=adafactor, remat=full, scan_layers=true and grad_accum={one_row}"
        updates.append((name, {**frugal, "grad_accum": one_row}))
    changes = []
    for name, update in updates:
        try:
            change = TrainConfig.model_validate({**config.model_dump(), **update})
            check_splits(change, chips)
        except (ValidationError, InvalidInputError):  # the batch does not split that way
            continue
        changes.append((name, change))
    return changes


@functools.cache  # read once per process: every compile of a launch (and each candidate change) asks for it
def trainer_source_hash() -> str:
    """A hash of the trainer's source, which builds the compiled program (model, step, sharding): a report
    cached before Tradewind itself changed is not reused."""
    package = Path(importlib.util.find_spec("tradewind.trainer").origin).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _program_key(config: TrainConfig, vocab_size: int, tpu_type: str, slices: int) -> str:
    """A hash of what the compiled program depends on: the step's fields, the target, the compiler, and the
    trainer's own code."""
    versions = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "libtpu")}
    what = {
        "config": config.model_dump(mode="json", include=STEP_FIELDS),
        "vocab_size": vocab_size,
        "target": [tpu_type, slices],
        "versions": versions,
        "trainer": trainer_source_hash(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]
