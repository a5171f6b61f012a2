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
from tradewind.cluster.tpus import TPU_COMPILE_ENV
from tradewind.core import InvalidInputError, get_logger, make_id, read_json
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.trainer import TrainConfig
from tradewind.trainer.compile import COMPILE_CALLABLE, CompileJob, TpuCompileReport

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
    require_libtpu()
    tpu_type, slices = placement.accelerator.tpu_type, placement.slices
    check_splits(config, placement.chips)
    job = CompileJob(config=config, vocab_size=vocab_size, tpu_type=tpu_type, slices=slices, output_file="")
    cached = ctx.workspace.root / "cache" / "tpu" / f"{_program_key(job)}.json"
    if cached.is_file():
        return TpuCompileReport.model_validate(read_json(cached, ctx.workspace.reader("accelerator")))
    job_id = make_id("compile")
    out_path = ctx.workspace.jobs_dir / job_id / "compile.json"
    spec = JobSpec(
        name=f"compile {job_id}",
        callable=COMPILE_CALLABLE,
        kwargs=job.model_copy(update={"output_file": str(out_path)}).model_dump(mode="json"),
        log_path=str(out_path.with_name("compile.log")),
        resources=Resources(cpus=1),  # compiled here, on this machine's CPU
        env=TPU_COMPILE_ENV,
    )
    activity = f"compiling for {slices} x {tpu_type}"
    run_job(ctx, spec, job_id=job_id, timeout_s=timeout_s, activity=activity, progress=progress)
    report = TpuCompileReport.model_validate(read_json(out_path, ctx.workspace.reader("config")))
    ctx.workspace.make_dir(cached.parent, argument="accelerator")
    ctx.workspace.write_atomic(cached, report.model_dump_json(), argument="accelerator")
    return report


def check_fits_slice(
    ctx: ToolContext, config: TrainConfig, placement: Placement, vocab_size: int, progress: Progress = no_progress
) -> None:
    """Refuse a TPU run whose train step does not fit one chip's HBM, saying by how much and what would fit.

    Without libtpu nothing can be compiled here: the run is let through, with a warning in the server's log.

    Raises:
        InvalidInputError: it does not fit; the message names the bytes needed and available and one change
            (fsdp over every chip, full remat, or twice the gradient accumulation) that compiles within the chip.
    """
    if not can_compile_for_tpu():
        log.warning("libtpu is not installed: %s is launched without checking that it fits", placement.accelerator)
        return
    report = compile_for_slice(ctx, config, placement, vocab_size, progress=progress)
    if report.fits:
        return
    raise InvalidInputError(
        f"argument 'accelerator': the run does not fit {report.slices} x {report.target}: its train step needs "
        f"{report.hbm_bytes / GIB:,.2f} GiB of HBM per chip (compiled here for the slice), and a "
        f"{report.device_kind} chip has {report.hbm_available_bytes / GIB:,.2f} GiB; "
        f"{_change_that_fits(ctx, config, placement, vocab_size, report, progress)}"
    )


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


def _change_that_fits(
    ctx: ToolContext,
    config: TrainConfig,
    placement: Placement,
    vocab_size: int,
    report: TpuCompileReport,
    progress: Progress,
) -> str:
    """One change that makes the run fit, found by compiling it: parameters sharded over every chip, else
    activations recomputed (full remat, scanned blocks), else half the microbatch (twice grad_accum), else all of
    the frugal end (Adafactor's small state, full remat, one row per microbatch). Names what else to try when
    none does."""
    mesh = config.mesh
    changes = []
    if mesh.fsdp * mesh.tensor < report.chips:
        fsdp = report.chips // mesh.tensor
        changes.append((f"mesh.fsdp={fsdp}", {"mesh": {"data": -1, "fsdp": fsdp, "tensor": mesh.tensor}}))
    if config.remat != "full":  # scanned: with full remat it needs less HBM than unrolled (benchmarks page)
        changes.append(("remat=full and scan_layers=true", {"remat": "full", "scan_layers": True}))
    changes.append((f"grad_accum={2 * config.grad_accum}", {"grad_accum": 2 * config.grad_accum}))
    # The frugal end: no momentum and a factored second moment (a quarter of Adam's state), every activation
    # recomputed, and one row per device per microbatch (the logits of one row at a time).
    one_row = config.batch_size // (report.chips // mesh.tensor)
    frugal = {"optimizer": {**config.optimizer.model_dump(), "type": "adafactor"}, "remat": "full"}
    frugal |= {"scan_layers": True, "grad_accum": one_row}
    changes.append((f"optimizer.type=adafactor, remat=full, scan_layers=true and grad_accum={one_row}", frugal))
    for name, update in changes:
        try:
            candidate = TrainConfig.model_validate({**config.model_dump(), **update})
            fitted = compile_for_slice(ctx, candidate, placement, vocab_size, progress=progress)
        except (ValidationError, InvalidInputError):  # the batch does not split that way
            continue
        if fitted.fits:
            return f"with {name} it fits ({fitted.hbm_bytes / GIB:,.2f} GiB per chip, compiled)"
    tried = " or ".join(name for name, _ in changes)
    return f"{tried} does not fit either: take a larger slice, or a smaller model, batch_size or seq_len"


@functools.cache  # read once per process: every compile of a launch (and each candidate change) asks for it
def trainer_source_hash() -> str:
    """A hash of the trainer's source, which builds the compiled program (model, step, sharding): a report
    cached before Tradewind itself changed is not reused."""
    package = Path(importlib.util.find_spec("tradewind.trainer").origin).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _program_key(job: CompileJob) -> str:
    """A hash of what the compiled program depends on: the step's fields, the target, the compiler, and the
    trainer's own code."""
    versions = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "libtpu")}
    what = {
        "config": job.config.model_dump(mode="json", include=STEP_FIELDS),
        "vocab_size": job.vocab_size,
        "target": [job.tpu_type, job.slices],
        "versions": versions,
        "trainer": trainer_source_hash(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]
