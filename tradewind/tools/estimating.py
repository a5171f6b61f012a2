"""The tool that sizes a run before it queues: `estimate_run`.

It takes launch_training's arguments (or an earlier run's config) and answers what the run needs and what its
budget trains: parameters (a LoRA run's trainable adapters and frozen base apart), FLOPs per token, training
memory against the device's, the step time, the steps, tokens and seconds of the budget, and the compute-optimal
token count for the model (20 tokens per parameter, Hoffmann et al. 2022). A token, FLOP or step budget fixes the
steps, and the step time gives their seconds; a time budget fixes the seconds, and the step time gives the steps
that fit (beside a work budget, it only caps it). The step time comes from a finished run of the same shape in the
workspace, else from a probe (`tradewind.trainer.estimate`: about 2 s of steps in the training loop) run as a job
on the local backend. For a TPU run the probe is a compile instead (`tradewind.trainer.compile`): the steps
compiled for the slice, on this machine, give the HBM per chip it needs and a step time at rates measured on a
chip. Nothing is queued as a run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from tradewind.cluster import JobSpec, Placement
from tradewind.core import InvalidInputError, TradewindError, make_id, read_json
from tradewind.data import open_token_cache
from tradewind.runs import RunLayout, TrainConfig, read_summary, read_train_config
from tradewind.runs.compile import TpuCompileReport
from tradewind.runs.estimate import (
    ESTIMATE_CALLABLE,
    PROBE_S,
    EstimateJob,
    MemoryBytes,
    TrainEstimate,
    estimate_training,
)
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.tools.launching import LaunchTrainingRequest, resolve_launch, training_env
from tradewind.tools.limits import admit_job
from tradewind.tools.runs import run_placement
from tradewind.tools.spec import tool
from tradewind.tools.tpu_fit import SliceFit, can_compile_for_tpu, compile_for_slice, fit_slice

TOKENS_PER_PARAMETER = 20  # compute-optimal training tokens per parameter (Chinchilla)
# How far from compute-optimal the tokens per parameter may be before the advice suggests a direction: the
# ratio is a large-model result, and a tiny model's loss may well disagree with it within a few times.
FAR_OFF = 4
GIB = 2**30


class EstimateRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Validated as launch_training's request; listed as a bare object, since launch_training's own listing names
    # its arguments and a second copy would not fit tools/list's budget.
    config: Annotated[LaunchTrainingRequest | None, WithJsonSchema({"type": ["object", "null"]})] = Field(
        None, description="launch_training's arguments."
    )
    run_id: str | None = Field(None, description="Or an earlier run's config.")
    time_budget_s: float | None = Field(None, gt=0, le=10**8, description="Seconds to plan for; null: the config's.")
    probe: bool = Field(True, description="Time steps (TPU: compile) unless a same-shape run did.")
    timeout_s: float = Field(600, gt=0, le=3600, description="For the probe.")

    @model_validator(mode="after")
    def _config_or_run(self) -> EstimateRunRequest:
        if (self.config is None) == (self.run_id is None):
            raise ValueError("give exactly one of 'config' (launch_training's arguments) and 'run_id'")
        return self


class RunEstimate(TrainEstimate):
    """The trainer's estimate, with where its step time came from and what the budget buys."""

    step_time_source: str | None = Field(description="'probe', 'run <id>' (same shape), a TPU compile, or null.")
    tokens_per_s: float | None
    budget_kind: Literal["tokens", "flops", "time", "steps"] = Field(description="What fixes the run's length.")
    budget_s: float | None = Field(description="Seconds of training the budget takes.")
    steps_in_budget: int | None = Field(description="Steps the budget trains.")
    tokens_in_budget: int | None = Field(description="Tokens those steps train.")
    compute_optimal_tokens: int = Field(description="20 per model parameter, frozen included.")
    compute_optimal_budget_s: float | None = Field(description="Seconds to train those.")
    hbm_per_chip_bytes: int | None = Field(description="TPU, compiled: HBM per chip the train step needs.")
    estimated_mfu: float | None = Field(description="TPU, compiled: model FLOP utilisation by the estimate.")
    advice: str


@tool("Estimate a run", idempotent=True, open_world=True)
def estimate_run(ctx: ToolContext, request: EstimateRunRequest, progress: Progress = no_progress) -> RunEstimate:
    """A run's size, memory fit, step time and what a budget trains. Use it before launching.

    Give launch_training's arguments as `config` (or an earlier `run_id`). Returns the trainable parameters
    (`frozen_parameters`: a LoRA run's base, held in bfloat16 without gradients or moments), FLOPs per
    token, memory against the device's, seconds per step, the steps and tokens the budget buys, the
    compute-optimal token count (20 per parameter) and one sentence of advice. A token, FLOP or step budget
    fixes the steps, and `budget_s` says how long they take; a time budget (the config's `time_budget_s`, or
    this request's) fixes the seconds, and the steps are those that fit (beside a token or FLOP budget it is a
    cap). The step time, as the run's loop takes it with its evaluations, comes from a finished run of the same
    shape, else from a probe that compiles the model, warms it up and times about 2 s of steps (at least 10:
    `probed_steps`); that costs about as long as a run's start, and nothing is queued as a run. A config that
    does not fit memory is not probed, and the probe is refused where the workspace's limits (settings.yaml)
    would refuse the run. For a TPU accelerator the probe compiles the steps for the slice here, with no TPU:
    fits and the step time (an estimate) come from that compile.
    """
    config, placement = _launch(ctx, request, progress)
    vocab_size = open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size
    estimate, source, compiled, fitted = estimate_training(config, placement), None, None, None
    earlier = _same_shape_run(ctx, config, placement, vocab_size)
    on_tpu = placement.accelerator.kind == "tpu"
    if earlier is not None:
        step_time_s, source = earlier
        estimate = estimate.model_copy(update={"step_time_s": step_time_s})
    elif request.probe and on_tpu and can_compile_for_tpu():
        fit = _fit(ctx, config, placement, vocab_size, request.timeout_s, progress)
        config, compiled, fitted = fit.config, fit.report, fit.note(placement)
        estimate = _compiled_estimate(estimate_training(config, placement), config, compiled)
        source = "TPU compile, calibrated estimate"
    # A config that does not fit is never probed: the analytic estimate already says what to change.
    elif request.probe and estimate.fits is not False:
        what, instead = "estimate_run's probe", " use probe=false,"
        admit_job(ctx, config, placement, vocab_size=vocab_size, what=what, instead=instead)
        estimate, source = _probe(ctx, config, placement, request.timeout_s, progress), "probe"
    if request.time_budget_s is not None:  # as if launched with it
        config = config.model_copy(update={"time_budget_s": request.time_budget_s})
    return _plan(estimate, source, config, on_tpu, compiled, fitted)


def _fit(
    ctx: ToolContext, config: TrainConfig, placement: Placement, vocab_size: int, timeout_s: float, progress: Progress
) -> SliceFit:
    """The run as launch_training would train it on its slice (`fit_slice`); where nothing fits, as given, with
    the compiler's numbers."""
    try:
        return fit_slice(ctx, config, placement, vocab_size, progress)
    except InvalidInputError:
        return SliceFit(
            config, compile_for_slice(ctx, config, placement, vocab_size, timeout_s=timeout_s, progress=progress)
        )


def _launch(ctx: ToolContext, request: EstimateRunRequest, progress: Progress) -> tuple[TrainConfig, Placement]:
    """The run's config, its dataset resolved to a folder, and its placement, as launch_training would train it."""
    if request.run_id is not None:
        folder = ctx.workspace.run_folder(request.run_id, argument="run_id")
        config = read_train_config(RunLayout(folder).config, ctx.workspace.reader("run_id"))
        return config, run_placement(ctx, folder, "run_id")
    resolved = resolve_launch(ctx, request.config, progress)
    return resolved.config, resolved.placement


def _shape(config: TrainConfig, placement: Placement, vocab_size: int | None) -> dict[str, Any]:
    """What sets a step's time: the model (with its vocabulary) and what it trains (all, or LoRA adapters), the
    batch and how it is laid on devices."""
    model = config.model.model_copy(update={"vocab_size": config.model.vocab_size or vocab_size})
    fields = ("batch_size", "seq_len", "grad_accum", "compute_dtype", "mesh", "lora")
    return {
        "model": model.model_dump(mode="json"),
        **config.model_dump(mode="json", include=set(fields)),
        **placement.model_dump(mode="json", include={"accelerator", "replicas", "slices"}),
    }


def _same_shape_run(
    ctx: ToolContext, config: TrainConfig, placement: Placement, vocab_size: int
) -> tuple[float, str] | None:
    """Seconds per step of the newest finished run of the same shape, and 'run <id>'; None if there is none.

    A run's seconds per step are its training seconds (the updates and its loop's evaluations, as a probe times
    them) over the steps it trained in them (since it resumed, if it did).
    """
    wanted = _shape(config, placement, vocab_size)
    found: list[tuple[float, float, str]] = []  # (finished at, seconds per step, run id)
    for folder in ctx.workspace.runs_dir.iterdir():
        layout = RunLayout(folder)
        try:
            summary = read_summary(layout.summary)
            trained = summary.steps - (summary.resumed_from_step or 0) if summary is not None else 0
            if summary is None or not summary.train_s or trained <= 0:
                continue
            earlier = read_train_config(layout.config, ctx.workspace.reader("run_id"))
            vocab = None if earlier.model.vocab_size else _vocab_size(earlier)
            if _shape(earlier, run_placement(ctx, folder, "run_id"), vocab) == wanted:
                found.append((layout.summary.stat().st_mtime, summary.train_s / trained, folder.name))
        except (TradewindError, ValueError, OSError):  # not a readable run: list_runs reports those
            continue
    if not found:
        return None
    _, seconds, run_id = max(found)
    return seconds, f"run {run_id}"


def _vocab_size(config: TrainConfig) -> int | None:
    try:
        return open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size
    except (TradewindError, OSError):  # its dataset is gone: only an explicit vocab_size can match
        return None


def _probe(
    ctx: ToolContext, config: TrainConfig, placement: Placement, timeout_s: float, progress: Progress
) -> TrainEstimate:
    """`estimate_training` with the probe, in a job on the local backend (JAX stays out of this process)."""
    job_id = make_id("estimate")
    out_path = ctx.workspace.jobs_dir / job_id / "estimate.json"
    job = EstimateJob(config=config, placement=placement, output_file=str(out_path))
    spec = JobSpec(
        name=f"estimate {job_id}",
        callable=ESTIMATE_CALLABLE,
        kwargs=job.model_dump(mode="json"),
        log_path=str(out_path.with_name("estimate.log")),
        resources=placement.resources(),
        env=training_env(ctx, placement, ctx.backend),  # as the run will train, sharing its compiled programs
    )
    activity = f"timing about {PROBE_S:g} s of training steps"
    run_job(ctx, spec, job_id=job_id, timeout_s=timeout_s, activity=activity, progress=progress)
    return TrainEstimate.model_validate(read_json(out_path, ctx.workspace.reader("config")))


def _compiled_estimate(estimate: TrainEstimate, config: TrainConfig, compiled: TpuCompileReport) -> TrainEstimate:
    """The analytic estimate with what the compile found: the fit, one chip's memory and HBM, and the step time."""
    where = f"HBM of one {compiled.device_kind} chip ({compiled.slices} x {compiled.target}, compiled)"
    return estimate.model_copy(
        update={
            "memory_bytes": _compiled_memory(estimate, config, compiled),
            "fits": compiled.fits,
            "device_memory_bytes": compiled.hbm_available_bytes,
            "device_memory_source": where,
            "step_time_s": compiled.step.seconds if compiled.step else None,
            "compile_s": compiled.compile_s,
        }
    )


def _compiled_memory(estimate: TrainEstimate, config: TrainConfig, compiled: TpuCompileReport) -> MemoryBytes:
    """One chip's memory as the compile found it, in the estimate's parts: the weights and their gradients as
    counted, over the chips that shard them; the optimizer state, the rest of the step's arguments (after the
    weights and the chip's rows of the batch); the activations, the rest of its HBM (with XLA's temporaries)."""
    shards = config.mesh.fsdp * config.mesh.tensor
    gradients = 4 * estimate.parameters // shards  # float32, of the trained weights
    weights = estimate.memory_bytes.params // shards - gradients
    batch = 4 * config.batch_size * (config.seq_len + 1) // (compiled.chips // config.mesh.tensor)
    optimizer = max(compiled.arguments_bytes - weights - batch, 0)
    activations = max(compiled.hbm_bytes - weights - gradients - optimizer, 0)
    return MemoryBytes(
        params=weights + gradients, optimizer=optimizer, activations=activations, total=compiled.hbm_bytes
    )


def _plan(
    estimate: TrainEstimate,
    source: str | None,
    config: TrainConfig,
    on_tpu: bool,
    compiled: TpuCompileReport | None = None,
    fitted: str | None = None,
) -> RunEstimate:
    """The estimate with what the config's budget trains (its steps, tokens and seconds), and the advice (after
    `fitted`, what the preflight changed so that it fits)."""
    step_s, tokens_per_step = estimate.step_time_s, estimate.tokens_per_step
    steps, seconds = config.total_steps, None  # the steps a token, FLOP or step budget fixes; None for time alone
    if steps is not None and step_s:
        seconds = steps * step_s
    cap = config.time_budget_s
    if cap is not None and (steps is None or (seconds is not None and seconds > cap)):
        # A time budget alone, or a cap that ends the work sooner: the steps that fit.
        seconds, steps = cap, math.floor(cap / step_s) if step_s else None
    tokens = steps * tokens_per_step if steps is not None else None
    tokens_per_s = tokens_per_step / step_s if step_s else None
    optimal = TOKENS_PER_PARAMETER * _model_parameters(estimate)
    return RunEstimate(
        **estimate.model_dump(exclude={"memory_bytes"}),
        memory_bytes=estimate.memory_bytes,
        step_time_source=source,
        tokens_per_s=tokens_per_s,
        budget_kind=config.budget.kind,
        budget_s=seconds,
        steps_in_budget=steps,
        tokens_in_budget=tokens,
        compute_optimal_tokens=optimal,
        compute_optimal_budget_s=optimal / tokens_per_s if tokens_per_s else None,
        hbm_per_chip_bytes=compiled.hbm_bytes if compiled else None,
        estimated_mfu=compiled.step.mfu if compiled and compiled.step else None,
        advice=_advice(estimate, config, steps, seconds, on_tpu, compiled, fitted),
    )


def _advice(
    estimate: TrainEstimate,
    config: TrainConfig,
    steps: int | None,
    seconds: float | None,
    on_tpu: bool,
    compiled: TpuCompileReport | None = None,
    fitted: str | None = None,
) -> str:
    """One or two sentences: what to change first when it does not fit; else what the budget trains, in tokens per
    parameter against the compute-optimal 20, with a direction only when that is far off; after what the preflight
    changed so that it fits (`fitted`), when it did."""
    if fitted:
        return f"{fitted[0].upper()}{fitted[1:]}. {_advice(estimate, config, steps, seconds, on_tpu, compiled)}"
    if compiled is not None and not compiled.fits:
        return (
            f"It does not fit a chip: the compiled step needs {compiled.hbm_bytes / GIB:,.2f} GiB of HBM per chip "
            f"(or more), one {compiled.device_kind} chip has {compiled.hbm_available_bytes / GIB:,.2f} GiB; shard "
            f"parameters over more chips (mesh.fsdp, now {compiled.mesh['fsdp']}), lower batch_size and raise "
            "grad_accum, or take a larger slice."
        )
    if estimate.fits is False:
        return (
            f"It does not fit in memory: it needs about {estimate.memory_bytes.total / GIB:,.1f} GiB per process, "
            f"the device has {(estimate.device_memory_bytes or 0) / GIB:,.1f} GiB ({estimate.device_memory_source}); "
            "shrink the model, batch_size or seq_len, or raise grad_accum."
        )
    if estimate.step_time_s is None and on_tpu:
        untimed = "No step time: install the `tpu` extra, and estimate with probe=true to compile for the slice."
    elif estimate.step_time_s is None:
        untimed = "No step time: no finished run has this shape; estimate with probe=true to time its steps."
    else:
        untimed = ""
    if steps is None:
        return f"The steps that {_seconds(seconds)} of training fit are unknown. {untimed}"
    tokens = steps * estimate.tokens_per_step
    per_parameter = tokens / _model_parameters(estimate)
    if per_parameter < TOKENS_PER_PARAMETER / FAR_OFF:
        optimal_steps = math.ceil(TOKENS_PER_PARAMETER * _model_parameters(estimate) / estimate.tokens_per_step)
        took = f" ({_seconds(optimal_steps * estimate.step_time_s)})" if estimate.step_time_s else ""
        verdict = (
            f"far below the compute-optimal {TOKENS_PER_PARAMETER}, so the model will be undertrained; about "
            f"{optimal_steps:,} steps{took} would reach {TOKENS_PER_PARAMETER}"
        )
    elif per_parameter > TOKENS_PER_PARAMETER * FAR_OFF:
        verdict = f"far above the compute-optimal {TOKENS_PER_PARAMETER}: a larger model would likely use them better"
    else:
        verdict = f"within {FAR_OFF}x of the compute-optimal {TOKENS_PER_PARAMETER}"
    trains = _trains(config, steps, seconds, tokens)
    return " ".join(filter(None, [f"{trains}: {_ratio(per_parameter)} tokens per parameter, {verdict}.", untimed]))


def _trains(config: TrainConfig, steps: int, seconds: float | None, tokens: int) -> str:
    """What the budget trains, to begin a sentence: '60 s of training fit 1,200 steps (307,200 tokens)'."""
    budget, total = config.budget, config.total_steps
    if budget.kind == "time":
        return f"{_seconds(seconds)} of training fit {steps:,} steps ({tokens:,} tokens)"
    if steps < total:  # a time cap ends the work sooner
        return (
            f"The {_seconds(config.time_budget_s)} cap ends the run after {steps:,} of the {total:,} steps that "
            f"{budget.describe()} take ({tokens:,} tokens)"
        )
    if budget.kind == "steps":
        about = f" (about {_seconds(seconds)})" if seconds is not None else ""
        return f"{steps:,} steps{about} train {tokens:,} tokens"
    details = [f"{tokens:,} tokens"] if budget.kind == "flops" else []  # a token budget's say themselves
    details += [f"about {_seconds(seconds)}"] if seconds is not None else []
    return f"A budget of {budget.describe()} takes {steps:,} steps" + (f" ({', '.join(details)})" if details else "")


def _ratio(value: float) -> str:
    """Tokens per parameter as a person writes them: '0.03', '1.4', '180'."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}" if value >= 0.1 else f"{value:.2g}"


def _seconds(value: float | None) -> str:
    """Seconds as a person reads them: '2.345 ms', '1.234 s', '1,234 s', or 'unknown'."""
    if value is None:
        return "unknown"
    return f"{value * 1000:,.3f} ms" if value < 0.1 else f"{value:,.3f} s" if value < 10 else f"{value:,.0f} s"


def _model_parameters(estimate: TrainEstimate) -> int:
    """The model's size, which the compute-optimal token count scales with: what trains and a LoRA run's frozen
    base together."""
    return estimate.parameters + estimate.frozen_parameters


def describe_estimate(result: RunEstimate) -> str:
    """The estimate as a person reads it: one figure a line, then the advice."""

    def count(value: int | None) -> str:
        return "unknown" if value is None else f"{value:,}"

    memory = result.memory_bytes
    device = "unknown" if result.device_memory_bytes is None else f"{result.device_memory_bytes / GIB:,.2f} GiB"
    fits = {True: "fits", False: "DOES NOT FIT", None: "fit unknown"}[result.fits]
    source = result.step_time_source or "not measured"
    parameters = f"{result.parameters:,}"
    if result.frozen_parameters:
        parameters = f"{result.parameters:,} trainable (LoRA), {result.frozen_parameters:,} frozen (bfloat16)"
    rows = [
        ("parameters", parameters),
        ("FLOPs per token", f"{result.flops_per_token:,.0f}"),
        (
            "memory",
            f"{memory.total / GIB:,.2f} GiB (params+grads {memory.params / GIB:,.2f}, optimizer "
            f"{memory.optimizer / GIB:,.2f}, activations {memory.activations / GIB:,.2f})",
        ),
        ("device memory", f"{device}: {fits}"),
        *(
            [("HBM per chip (compiled)", f"{result.hbm_per_chip_bytes / GIB:,.2f} GiB")]
            if result.hbm_per_chip_bytes is not None
            else []
        ),
        ("step time", f"{_seconds(result.step_time_s)} ({source})"),
        *([("estimated MFU", f"{result.estimated_mfu:.1%}")] if result.estimated_mfu is not None else []),
        ("compile", _seconds(result.compile_s)),
        ("tokens per step", f"{result.tokens_per_step:,}"),
        ("tokens per second", "unknown" if result.tokens_per_s is None else f"{result.tokens_per_s:,.0f}"),
        ("budget", f"{result.budget_kind}; training time {_seconds(result.budget_s)}"),
        ("steps in budget", count(result.steps_in_budget)),
        ("tokens in budget", count(result.tokens_in_budget)),
        ("compute-optimal tokens", f"{result.compute_optimal_tokens:,}"),
        ("compute-optimal time", _seconds(result.compute_optimal_budget_s)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join([*(f"{name:<{width}}  {value}" for name, value in rows), result.advice])
