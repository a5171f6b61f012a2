"""Sweeps: `launch_sweep` (a grid or random search over config fields), `get_sweep` and `cancel_sweep`.

A sweep is planned and checked here, whole, before anything is queued: every trial's arguments (the base
with its overrides) validate as `launch_training`'s, so a bad field fails the call naming the trial. A
controller job on the local backend then runs it (`tradewind.tools.sweep_controller`: concurrency, the
canary gate, successive halving, baseline reruns); its state is `sweeps/<id>/sweep.json`.

Example:
    launch_sweep(ctx, LaunchSweepRequest(base={"dataset": "builtin:tinyshakespeare", "steps": 300},
                                         space={"optimizer.learning_rate": [1e-3, 3e-3, 1e-2]}))
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import random
import shutil
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tradewind.cluster import JobSpec, Resources
from tradewind.cluster.jobs import utc_now
from tradewind.core import InvalidInputError, TradewindError, describe_validation_error, make_id
from tradewind.core.config import set_dotted
from tradewind.runs import RunLayout
from tradewind.runs.record import update_record
from tradewind.tools.bounds import PAGE_CHARS, cut, fitting
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.datasets import resolve_dataset
from tradewind.tools.launching import LaunchTrainingRequest, rerun_arguments, run_folder
from tradewind.tools.limits import check_step_limit
from tradewind.tools.runs import RunRequest, cancel_run, run_record
from tradewind.tools.spec import tool
from tradewind.tools.sweep_controller import (
    CONTROLLER_CALLABLE,
    ENDED,
    LOG_FILE,
    STATE_FILE,
    SweepJob,
    SweepState,
    SweepStatus,
    TrialState,
    TrialStatus,
    read_state,
    trial_outcome,
    write_state,
)

MAX_GRID = 64  # configurations of one grid sweep
MAX_TRIALS = 256  # draws of one random sweep
MAX_ROWS = 64  # trial rows in one get_sweep result
VALUE_CHARS = 200  # one value of the space, as JSON
SWEEP_ONLY = ("note", "parent_run")  # the sweep's own arguments, never a trial's
CONTROLLER_STOP_S = 30.0


class LaunchSweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: dict[str, Any] = Field(description="launch_training's arguments.")
    space: dict[str, list[Any]] = Field(
        min_length=1,
        max_length=16,
        description="Dotted field -> values to try.",
    )
    method: Literal["grid", "random"] = Field("grid", description="grid: every combination; random: `trials` draws.")
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description="Draws, for random only.")
    seed: int = Field(0, ge=0, lt=2**32, description="For random draws.")
    max_concurrent: int = Field(2, ge=1, le=64)
    canary_steps: int = Field(0, ge=0, le=10**9, description=">0: others wait for trial 0 to log this step.")
    halving_tokens: list[Annotated[int, Field(gt=0, le=10**15)]] = Field(
        default_factory=list,
        max_length=16,
        description="Rungs in tokens, increasing.",
    )
    halving_eta: int = Field(2, ge=2, le=16, description="Keep the best 1/eta at each rung.")
    note: str | None = Field(None, max_length=200, description="One line for the ledger.")
    parent_run: str | None = Field(None, description="The run all trials change.")
    baseline_every: int | None = Field(
        None, ge=2, le=1000, description="Every k-th launch reruns parent_run (new seed)."
    )

    @field_validator("space")
    @classmethod
    def _check_space(cls, space: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in space.items():
            if not values or len(values) > MAX_GRID:
                raise ValueError(f"{key!r} needs 1 to {MAX_GRID} values (got {len(values)})")
            if key.split(".")[0] in (*SWEEP_ONLY, "base"):
                raise ValueError(f"{key!r} is the sweep's own argument, not a trial's")
            for value in values:
                if len(json.dumps(value)) > VALUE_CHARS:
                    raise ValueError(f"{key!r}: a value is longer than {VALUE_CHARS} characters as JSON")
        return space

    @field_validator("halving_tokens")
    @classmethod
    def _increasing(cls, rungs: list[int]) -> list[int]:
        if any(rung <= 0 for rung in rungs) or any(b <= a for a, b in itertools.pairwise(rungs)):
            raise ValueError(f"rungs must be positive token counts in increasing order (got {rungs})")
        return rungs

    @model_validator(mode="after")
    def _consistent(self) -> LaunchSweepRequest:
        if self.method == "random" and self.trials is None:
            raise ValueError("method 'random' needs 'trials' (how many draws)")
        if self.method == "grid" and self.trials is not None:
            raise ValueError("method 'grid' runs every combination: leave 'trials' unset, or use method 'random'")
        if self.baseline_every is not None and self.parent_run is None:
            raise ValueError("'baseline_every' reruns parent_run: give 'parent_run' too")
        if clash := sorted(set(SWEEP_ONLY) & set(self.base)):
            raise ValueError(f"give {', '.join(clash)} as the sweep's argument, not inside 'base'")
        return self


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep_id: str


class TrialRow(BaseModel):
    index: int = Field(description="Launch order.")
    run_id: str | None = Field(description="Null until launched.")
    overrides: dict[str, Any]
    baseline: bool = Field(description="A rerun of parent_run, not a trial.")
    status: TrialStatus
    metric: float | None = Field(description="val_bpb.")
    rung_losses: list[float] = Field(description="Eval loss at each rung reached.")
    reason: str | None = Field(description="Why it crashed or was discarded.")
    baseline_metric: float | None = Field(description="The nearest baseline's metric.")


class BestTrial(BaseModel):
    index: int
    run_id: str
    metric: float
    overrides: dict[str, Any]


class SweepInfo(BaseModel):
    sweep_id: str
    status: SweepStatus
    reason: str | None = Field(description="Why it failed or was cancelled.")
    counts: dict[str, int] = Field(description="Launches by trial status.")
    best: BestTrial | None = Field(description="Lowest metric among finished trials.")
    halving_tokens: list[int]
    trials: list[TrialRow] = Field(description=f"In launch order, at most {MAX_ROWS}.")
    truncated: bool = Field(description="True when trials were left out.")
    state_file: str
    log_file: str


@tool("Launch a sweep", open_world=True)
def launch_sweep(ctx: ToolContext, request: LaunchSweepRequest, progress: Progress = no_progress) -> SweepInfo:
    """Runs over a grid or random sample of config values; returns at once. Use it to tune
    hyperparameters.

    Every trial is launch_training(base + its overrides), checked before anything starts. At most
    max_concurrent run at once; canary_steps holds the rest until the first trial logs that step (a crashed
    canary ends the sweep). halving_tokens stops losers: at each rung, a trial whose eval loss is not in the
    best 1/halving_eta of those recorded there so far (at least halving_eta of them) is discarded. A crashed
    trial does not stop the sweep. Follow it with get_sweep; cancel_sweep stops it and its runs.
    """
    limit = ctx.settings().limits.max_active_runs
    if request.max_concurrent > limit:
        raise InvalidInputError(
            f"argument 'max_concurrent': {request.max_concurrent} is more than limits.max_active_runs ({limit}) "
            f"in {ctx.settings_path}; ask for at most {limit}, or raise the limit"
        )
    parent_run = None
    if request.parent_run is not None:
        parent_run = run_folder(ctx, request.parent_run, "parent_run").name
    base = copy.deepcopy(request.base)
    base["backend"] = base.get("backend") or ctx.default_backend()
    ctx.job_backend(base["backend"])  # an unreachable cluster fails now, not in the controller
    trials = _plan(ctx, request, base, parent_run, progress)
    sweep_id = make_id("sweep")
    folder = ctx.workspace.sweep_dir(sweep_id, must_exist=False)
    folder.mkdir(parents=True)
    state = SweepState(
        sweep_id=sweep_id,
        job_id=sweep_id,
        method=request.method,
        backend=base["backend"],
        note=request.note,
        parent_run=parent_run,
        max_concurrent=request.max_concurrent,
        canary_steps=request.canary_steps,
        halving_tokens=request.halving_tokens,
        halving_eta=request.halving_eta,
        trials=trials,
    )
    write_state(ctx, state)
    workspace = ctx.workspace
    job = SweepJob(
        root=str(workspace.root),
        allowed_paths=[*map(str, workspace.allowed_roots), *workspace.allowed_buckets],
        code_paths=[str(p) for p in workspace.code_roots],
        sweep_id=sweep_id,
    )
    spec = JobSpec(
        name=f"sweep {sweep_id}",
        callable=CONTROLLER_CALLABLE,
        kwargs=job.model_dump(),
        log_path=str(folder / LOG_FILE),
        resources=Resources(cpus=0),  # it waits most of the time: it must not hold a CPU its trials could use
        env={"RAY_ADDRESS": os.environ["RAY_ADDRESS"]} if os.environ.get("RAY_ADDRESS") else {},
    )
    try:
        ctx.backend.submit(spec, job_id=sweep_id)
    except TradewindError:
        shutil.rmtree(folder)
        raise
    return get_sweep(ctx, SweepRequest(sweep_id=sweep_id))


def _plan(
    ctx: ToolContext, request: LaunchSweepRequest, base: dict[str, Any], parent_run: str | None, progress: Progress
) -> list[TrialState]:
    """Every launch of the sweep in order, each validated: the trials, with a baseline at every k-th place."""
    keys = list(request.space)
    if request.method == "grid":
        size = math.prod(len(values) for values in request.space.values())
        if size > MAX_GRID:
            shape = " x ".join(str(len(values)) for values in request.space.values())
            raise InvalidInputError(
                f"argument 'space': the grid has {size:,} configurations ({shape}), more than {MAX_GRID}; use fewer "
                "values, or method 'random' with 'trials'"
            )
        combos = list(itertools.product(*request.space.values()))
    else:
        draw = random.Random(request.seed)
        combos = [tuple(draw.choice(request.space[key]) for key in keys) for _ in range(request.trials or 0)]
    datasets: dict[str, str] = {}  # as given -> the cache folder
    trials: list[TrialState] = []
    seeds = random.SystemRandom()  # each baseline rerun draws its own: reruns of one seed would measure no noise
    for combo in combos:
        if request.baseline_every and (len(trials) + 1) % request.baseline_every == 0:
            assert parent_run is not None
            rerun = rerun_arguments(ctx, parent_run, seed=seeds.randrange(2**32), argument="parent_run")
            rerun["backend"] = base["backend"]
            trials.append(_trial(len(trials), {}, rerun, baseline=True))
        overrides = dict(zip(keys, combo, strict=True))
        label = _describe(overrides)
        arguments = copy.deepcopy(base)
        for key, value in overrides.items():
            try:
                set_dotted(arguments, key, value)
            except ValueError as error:
                raise InvalidInputError(f"argument 'space': {key!r}: {error} in base") from None
        arguments["note"] = cut(f"{request.note}: {label}" if request.note else label)
        arguments["parent_run"] = parent_run
        where = f"trial {len(trials)} ({label})"
        try:
            checked = LaunchTrainingRequest.model_validate(arguments)
        except ValidationError as error:
            lines = describe_validation_error(error, "launch_training", arguments_of=LaunchTrainingRequest)
            raise InvalidInputError(f"{where}: {lines}") from None
        check_step_limit(ctx, checked, where=f"{where}: ")
        trials.append(_trial(len(trials), overrides, arguments))
    for trial in trials:  # every field is checked before a builtin dataset is tokenized
        dataset = trial.arguments.get("dataset")
        if dataset is not None and not trial.baseline:
            if dataset not in datasets:
                datasets[dataset] = str(resolve_dataset(ctx, dataset, progress))
            trial.arguments["dataset"] = datasets[dataset]
    return trials


def _trial(index: int, overrides: dict[str, Any], arguments: dict[str, Any], baseline: bool = False) -> TrialState:
    checked = LaunchTrainingRequest.model_validate(arguments)
    return TrialState(
        index=index,
        overrides=overrides,
        baseline=baseline,
        arguments=arguments,
        tokens_per_step=checked.tokens_per_step,
    )


def _describe(overrides: dict[str, Any]) -> str:
    """`learning_rate=0.001, n_layers=4`: each field by its last name."""
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={_short(value)}" for key, value in overrides.items())


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else json.dumps(value) if not isinstance(value, str) else value


@tool("Get a sweep", read_only=True, idempotent=True, open_world=True)
def get_sweep(ctx: ToolContext, request: SweepRequest) -> SweepInfo:
    """A sweep's status, best trial and trials. Use it to follow a sweep.

    Each trial comes with its status, metric, rung losses and reason.

    Trials are listed in launch order (at most 64; `truncated` says when more exist); a baseline rerun's
    metric is shown beside each trial (the nearest baseline in launch order).
    """
    state = read_state(ctx, request.sweep_id)
    if state.status == "running":
        job = ctx.backend.status(state.job_id)
        if job.status.finished:
            state = read_state(ctx, request.sweep_id)  # it may have written its last state as it ended
            if state.status == "running":
                state.status = "failed"
                state.reason = cut(f"its controller job ended ({job.status.value}: {job.reason}) before the sweep did")
    for trial in state.trials:
        if trial.run_id is not None and trial.status not in ENDED:
            with contextlib.suppress(TradewindError, ValueError, OSError):  # else the controller's last word stands
                trial.status, trial.metric, trial.reason = trial_outcome(ctx, trial.run_id)
    return _info(ctx, state)


def _info(ctx: ToolContext, state: SweepState) -> SweepInfo:
    baselines = [t for t in state.trials if t.baseline and t.metric is not None]
    rows = (
        TrialRow(
            **trial.model_dump(include={"index", "run_id", "overrides", "baseline", "status", "metric", "rung_losses"}),
            reason=cut(trial.reason) if trial.reason else None,
            baseline_metric=min(baselines, key=lambda b: abs(b.index - trial.index)).metric if baselines else None,
        )
        for trial in state.trials[:MAX_ROWS]
    )
    shown = fitting(rows, PAGE_CHARS - 4_000)
    finished = [t for t in state.trials if not t.baseline and t.status in ("finished", "kept") and t.metric is not None]
    best = min(finished, key=lambda t: t.metric or 0.0, default=None)
    counts: dict[str, int] = {}
    for trial in state.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    folder = ctx.workspace.sweep_dir(state.sweep_id)
    return SweepInfo(
        sweep_id=state.sweep_id,
        status=state.status,
        reason=state.reason,
        counts=counts,
        best=None if best is None else BestTrial(**best.model_dump(include={"index", "run_id", "metric", "overrides"})),
        halving_tokens=state.halving_tokens,
        trials=shown,
        truncated=len(shown) < len(state.trials),
        state_file=str(folder / STATE_FILE),
        log_file=str(folder / LOG_FILE),
    )


@tool("Cancel a sweep", destructive=True, idempotent=True, open_world=True)
def cancel_sweep(ctx: ToolContext, request: SweepRequest) -> SweepInfo:
    """Stop a sweep and its running trials. Use it to end a sweep early.

    Stops its controller and every trial still running, each marked discarded ('sweep cancelled'). Returns once they
    have stopped. A sweep already ended is returned as it is.
    """
    state = read_state(ctx, request.sweep_id)
    if state.status != "running":
        return get_sweep(ctx, request)
    ctx.backend.cancel(state.job_id)
    ctx.backend.wait(state.job_id, timeout=CONTROLLER_STOP_S)
    state = read_state(ctx, request.sweep_id)  # the controller's last write, now that it has stopped
    reason = "sweep cancelled"
    known = {trial.run_id for trial in state.trials}
    for trial in state.trials:
        if trial.run_id is not None and trial.status not in ENDED:
            _stop(ctx, trial.run_id, reason)
            trial.status, trial.reason = "discarded", reason
    for run_id in _runs_of(ctx, state.sweep_id) - known:  # launched as the controller was killed, if it was
        _stop(ctx, run_id, reason)
    state.status, state.reason = "cancelled", "cancelled on request"
    state.ended_at = state.ended_at or utc_now()
    write_state(ctx, state)
    return _info(ctx, state)


def _stop(ctx: ToolContext, run_id: str, reason: str) -> None:
    path = RunLayout(ctx.workspace.run_dir(run_id)).record
    if run_record(ctx, run_id).decision is None:
        update_record(path, decision="discarded", decision_reason=reason)
    cancel_run(ctx, RunRequest(run_id=run_id))


def _runs_of(ctx: ToolContext, sweep_id: str) -> set[str]:
    """The workspace's unfinished runs whose record says this sweep launched them."""
    found = set()
    for folder in ctx.workspace.runs_dir.iterdir():
        try:
            record = run_record(ctx, folder.name)
        except (TradewindError, ValueError, OSError):
            continue
        if record.sweep_id == sweep_id and not record.status.finished:
            found.add(folder.name)
    return found
