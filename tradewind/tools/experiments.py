"""The experiment ledger: every run of the workspace as an experiment, its metric, what it changed, whether
that beats the noise, and what became of it. Tools `list_experiments` (a leaderboard), `set_experiment_status`
(keep or discard) and `rerun_baseline` (measure the noise).

Nothing is kept anywhere else: an experiment is a run folder, read from its record (`run.json`: the note,
parent run, sweep, decision and machine load, see `tradewind.runs.record`), its `config.json` and its
`summary.json`. Its status:

    running    the run is pending or training
    finished   it succeeded and nobody has decided yet
    kept       set_experiment_status (or a sweep) kept it
    discarded  discarded, with the reason; a run cancelled without a decision is discarded as "cancelled"
    crashed    it failed; `reason` is the cause, in the trainer's words

The metric is `val_bpb` (`report_data.VAL_BPB_MEANING`), lower is better, comparable across tokenizers; `changes` lists
the config fields (dotted) whose values differ from the parent run's. A run whose only change is its seed is a
*rerun* of its parent's config (`rerun_of`, the config's first run): it measures noise and never ranks as an
improvement. A run's `delta` is the mean val_bpb of it and its reruns minus its parent's, judged against the
spread of reruns at its dataset and budget by the rule in `tradewind.tools.noise`; runs of different budgets
or datasets are not compared.
"""

from __future__ import annotations

import csv
import io
import random
import re
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, TradewindError, check_id
from tradewind.runs import RunLayout, read_train_config
from tradewind.runs.config import Budget
from tradewind.runs.record import RunRecord, update_record
from tradewind.tools.bounds import cut
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.launching import LaunchTrainingRequest, launch_training, rerun_arguments, run_folder
from tradewind.tools.noise import MIN_RERUNS, Noise, pooled
from tradewind.tools.report_data import changes_from
from tradewind.tools.runs import RunInfo, RunRequest, get_run, run_record
from tradewind.tools.spec import tool

Status = Literal["running", "finished", "kept", "discarded", "crashed"]
REASON_CHARS = 300  # a crash cause in the ledger; get_run and tail_logs have the whole story
FIELD_CHARS = 200  # a dotted config field name, far longer than any TrainConfig has
MAX_RERUNS = 8  # reruns one rerun_baseline call launches
_FIELD_NAME = re.compile(rf"(?=.{{1,{FIELD_CHARS}}}$)[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
EXPORT_COLUMNS = (
    "run_id", "status", "val_bpb", "budget", "parent", "changes", "rerun_of", "delta", "sigma", "reruns",
    "beyond_noise", "verdict", "val_loss", "note", "reason", "sweep_id", "steps", "train_s", "load",
    "concurrent_runs", "created_at",
)  # fmt: skip


class Experiment(BaseModel):
    """One run as an experiment."""

    run_id: str
    status: Status
    val_bpb: float | None = Field(
        default=None, description="The decision metric: bits per byte on the fixed val tokens."
    )
    budget: str | None = Field(default=None, description="What fixed its length: tokens, FLOPs, seconds or steps.")
    parent: str | None = Field(default=None, description="The run it changes (parent_run) or continues.")
    changes: dict[str, Any] = Field(default_factory=dict, description="Config fields that differ from the parent's.")
    rerun_of: str | None = Field(default=None, description="The run whose config it reruns with another seed.")
    delta: float | None = Field(default=None, description="Mean val_bpb of it and its reruns minus its parent's.")
    sigma: float | None = Field(default=None, description="One run's val_bpb spread at its dataset and budget.")
    reruns: int = Field(default=0, description="Reruns behind sigma (runs less one per config).")
    beyond_noise: bool | None = Field(default=None, description="Whether |delta| beats the noise; null: unknown.")
    verdict: str | None = Field(default=None, description="The comparison with its parent, in words.")
    val_loss: float | None = None
    note: str | None = None
    reason: str | None = Field(default=None, description="The crash cause, or why it was kept or discarded.")
    sweep_id: str | None = None
    steps: int | None = None
    train_s: float | None = None
    load: float | None = Field(default=None, description="Highest 1-minute load per core seen at its start or end.")
    concurrent_runs: int | None = Field(default=None, description="Other active runs when it launched.")
    created_at: str


class ListExperimentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Status | None = None
    changed: str | None = Field(default=None, description="Only runs changing this dotted field.")
    sweep_id: str | None = None
    limit: int = Field(default=20, ge=1, le=100, description="Best first.")
    export: Literal["tsv", "csv"] | None = Field(default=None, description="Also write reports/experiments.<ext>.")


class ExperimentList(BaseModel):
    experiments: list[Experiment] = Field(description="Best val_bpb first (reruns after), then runs without one.")
    total: int = Field(description="Experiments that match.")
    truncated: bool
    export_file: str | None = None


class SetExperimentStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="An ended run.")
    status: Literal["kept", "discarded"]
    reason: str = Field(min_length=1, max_length=REASON_CHARS, description="Why, in one line.")

    @field_validator("status", mode="before")
    @classmethod
    def _verb(cls, status: Any) -> Any:
        """'keep' and 'discard' say the same as the statuses they set. Any other value goes to the type check
        unchanged, which names the argument (a list is no dict key)."""
        if not isinstance(status, str):
            return status
        return {"keep": "kept", "discard": "discarded"}.get(status, status)


class RerunBaselineRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="The baseline (or one of its reruns).")
    count: int = Field(default=2, ge=1, le=MAX_RERUNS)


class Reruns(BaseModel):
    rerun_of: str = Field(description="The config's first run.")
    run_ids: list[str] = Field(description="The reruns launched, one per seed.")
    seeds: list[int]


@tool("List experiments", idempotent=True, open_world=True)
def list_experiments(ctx: ToolContext, request: ListExperimentsRequest) -> ExperimentList:
    """Runs by val_bpb, each change's delta vs noise. Use it to pick the run to build
    on.

    Filter by status, by a changed config field or by sweep; export writes every match as TSV or CSV. A run's
    `delta` is its mean val_bpb (with its reruns) minus its parent's; `sigma` is the spread of one run at its
    dataset and budget, from `reruns` runs of rerun configs; `beyond_noise` says whether the delta beats it
    (null: not enough reruns, or not comparable). Reruns are listed after every other run with a val_bpb.
    """
    if request.sweep_id is not None:
        check_id(request.sweep_id, "sweep_id")
    if request.changed is not None and not _FIELD_NAME.fullmatch(request.changed):
        raise InvalidInputError(
            f"argument 'changed': {cut(request.changed, 80)!r} is not a config field; give a dotted field name of "
            f"at most {FIELD_CHARS} characters, such as optimizer.learning_rate"
        )
    entries = [entry for entry in ledger(ctx).values() if _matches(entry, request)]
    entries.sort(key=lambda entry: entry.created_at, reverse=True)
    entries.sort(key=lambda entry: (entry.val_bpb is None, entry.rerun_of is not None, entry.val_bpb or 0.0))
    export_file = _export(ctx, entries, request.export) if request.export else None
    return ExperimentList(
        experiments=entries[: request.limit],
        total=len(entries),
        truncated=len(entries) > request.limit,
        export_file=export_file,
    )


@tool("Keep or discard an experiment", idempotent=True, open_world=True)
def set_experiment_status(ctx: ToolContext, request: SetExperimentStatusRequest) -> Experiment:
    """Keep or discard an ended run, with a reason. Use it after list_experiments.

    The ledger keeps both the status and the reason. Keeping a run whose delta does not beat the noise (or
    whose noise is not measured: fewer than 3 reruns at its dataset and budget) succeeds, and its `verdict`
    says so. A rerun cannot be kept: it measures noise; keep or discard the run it reruns."""
    if not request.reason.strip():
        raise InvalidInputError("argument 'reason': it is blank; say in one line why the run is kept or discarded")
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    if not get_run(ctx, RunRequest(run_id=request.run_id)).status.finished:
        raise InvalidInputError(
            f"argument 'run_id': run {request.run_id} is still running; wait_for_run first, or cancel_run it"
        )
    entry = ledger(ctx).get(request.run_id)
    if entry is None:
        raise InvalidInputError(f"argument 'run_id': run {request.run_id} is unreadable; get_run says why")
    if request.status == "kept" and entry.rerun_of is not None:
        raise InvalidInputError(
            f"argument 'run_id': run {request.run_id} reruns {entry.rerun_of}'s config with another seed: it "
            f"measures noise, so it is not an improvement to keep; keep or discard {entry.rerun_of} instead"
        )
    update_record(layout.record, decision=request.status, decision_reason=request.reason)
    entry.status, entry.reason = request.status, request.reason  # what the record now says; no judgement moves
    if request.status == "kept" and not (entry.beyond_noise and (entry.delta or 0.0) < 0):
        entry.verdict = f"Kept, but not shown better than its parent beyond noise. {entry.verdict or ''}".strip()
    return entry


@tool("Rerun a baseline", open_world=True)
def rerun_baseline(ctx: ToolContext, request: RerunBaselineRequest, progress: Progress = no_progress) -> Reruns:
    """Rerun a config with new seeds to measure noise. Use it on a baseline before judging
    changes.

    Each rerun is launch_training with the run's config and placement, a seed no run of that config has had,
    and parent_run set to the config's first run, so the ledger counts it as a rerun (`rerun_of`). Reruns of a
    run on a time budget cannot share the machine: with `limits.shared_devices: refuse` ask for one at a time.
    """
    folder = run_folder(ctx, request.run_id, "run_id")
    read = _read_all(ctx)
    first = read[folder.name][0].rerun_of or folder.name if folder.name in read else folder.name
    timed = first in read and read[first][1].budget.kind == "time"
    if timed and request.count > 1 and ctx.settings().limits.shared_devices == "refuse":
        raise InvalidInputError(
            f"argument 'count': run {first} is on a time budget, so its reruns run one at a time, and "
            f"limits.shared_devices in {ctx.settings_path} refuses a second beside the first; ask for count=1 "
            "and call again when it ends, set shared_devices to 'wait', or rerun it on a token_budget"
        )
    used = {facts.seed for entry, facts in read.values() if first in (entry.run_id, entry.rerun_of)}
    draw, seeds = random.SystemRandom(), []
    while len(seeds) < request.count:
        if (seed := draw.randrange(2**32)) not in used:
            used.add(seed)
            seeds.append(seed)
    run_ids: list[str] = []
    for index, seed in enumerate(seeds):
        progress(index, len(seeds), f"launching rerun {index + 1} of {first}")
        arguments = rerun_arguments(ctx, first, seed=seed, argument="run_id")
        try:
            run_ids.append(launch_training(ctx, LaunchTrainingRequest.model_validate(arguments), progress).run_id)
        except TradewindError as error:
            if not run_ids:
                raise
            launched = ", ".join(run_ids)  # they train: say so, or the caller would lose them
            raise type(error)(f"reruns {launched} of {first} were launched; the next was refused: {error}") from None
    return Reruns(rerun_of=first, run_ids=run_ids, seeds=seeds)


def experiment(ctx: ToolContext, run_id: str, info: RunInfo | None = None) -> Experiment:
    """Run `run_id` as the ledger shows it, without comparing it with other runs (`ledger` does that);
    `info` is its `get_run`, if the caller has it already."""
    return _read(ctx, run_id, info)[0]


@dataclass(frozen=True)
class _Facts:
    """What judging a run needs beyond its `Experiment`: where its noise is measured, whether it trained all of
    its budget, its seed, and what it starts from (a rerun starts where its parent does)."""

    dataset: str
    budget: Budget
    budget_met: bool | None
    seed: int
    init_from: str | None
    continues: bool  # it continues a run (resume_from)


def _read(ctx: ToolContext, run_id: str, info: RunInfo | None = None) -> tuple[Experiment, _Facts]:
    record = run_record(ctx, run_id)
    config = read_train_config(RunLayout(ctx.workspace.run_dir(run_id)).config, ctx.workspace.reader("run_id"))
    info = info or get_run(ctx, RunRequest(run_id=run_id))
    summary = info.summary
    status, reason = _status(record, info)
    parent = record.parent_run or record.parent
    changes = changes_from(ctx, run_id, parent)
    seed_only = changes is not None and set(changes) <= {"seed"}
    loads = [load for load in (record.load_start, record.load_end) if load is not None]
    entry = Experiment(
        run_id=run_id,
        status=status,
        val_bpb=summary.val_bpb if summary else None,
        budget=config.budget.describe(),
        parent=parent,
        changes=changes or {},
        # a new run (no continuation) of its parent's config whose only change is its seed; `_judge` checks that
        # the parent is no continuation either, and that both start from the same weights
        rerun_of=parent if record.parent_run and record.parent is None and seed_only else None,
        val_loss=summary.val_loss if summary else None,
        note=record.note,
        reason=reason,
        sweep_id=record.sweep_id,
        steps=summary.steps if summary else info.step,
        train_s=summary.train_s if summary else None,
        load=max(loads) if loads else None,
        concurrent_runs=record.concurrent_runs,
        created_at=record.created_at,
    )
    facts = _Facts(
        dataset=config.dataset,
        budget=config.budget,
        budget_met=summary.budget_met if summary else None,
        seed=config.seed,
        init_from=config.init_from,
        continues=record.parent is not None,
    )
    return entry, facts


def _status(record: RunRecord, info: RunInfo) -> tuple[Status, str | None]:
    if not info.status.finished:
        return "running", None
    if record.decision is not None:
        return record.decision, record.decision_reason
    if info.status is JobStatus.SUCCEEDED:
        return "finished", None
    if info.status is JobStatus.CANCELLED:
        return "discarded", "cancelled"
    return "crashed", cut(info.reason or info.status.value.lower(), REASON_CHARS)


def ledger(ctx: ToolContext) -> dict[str, Experiment]:
    """Every readable run of the workspace (list_runs reports the unreadable ones), each judged against its
    parent and the noise at its dataset and budget."""
    return {run_id: entry for run_id, (entry, _) in _read_all(ctx).items()}


def _read_all(ctx: ToolContext) -> dict[str, tuple[Experiment, _Facts]]:
    """`ledger`'s runs with what judging them used."""
    read = {}
    for folder in sorted(ctx.workspace.runs_dir.iterdir()):
        try:
            read[folder.name] = _read(ctx, folder.name)
        except (TradewindError, ValueError, OSError):
            continue
    _judge(read)
    return read


def _judge(read: dict[str, tuple[Experiment, _Facts]]) -> None:
    """Fill in each run's rerun root, delta, noise and verdict, from every run in `read`."""
    entries = {run_id: entry for run_id, (entry, _) in read.items()}
    for entry, facts in read.values():  # a rerun's parent must be readable, new, and start as it does
        parent = read.get(entry.rerun_of) if entry.rerun_of else None
        if entry.rerun_of and (parent is None or parent[1].continues or parent[1].init_from != facts.init_from):
            entry.rerun_of = None
    for entry in entries.values():  # a rerun of a rerun reruns the config's first run
        seen = {entry.run_id}
        while entry.rerun_of in entries and entries[entry.rerun_of].rerun_of not in (None, *seen):
            seen.add(entry.rerun_of)
            entry.rerun_of = entries[entry.rerun_of].rerun_of
    values = {run_id: _group_values(run_id, read) for run_id, entry in entries.items() if entry.rerun_of is None}
    place = {run_id: (facts.dataset, facts.budget) for run_id, (_, facts) in read.items()}
    noise: dict[tuple[str, Budget], Noise] = {}
    for key in set(place.values()):
        noise[key] = pooled(group for run_id, group in values.items() if place[run_id] == key)
    for run_id, (entry, facts) in read.items():
        if entry.rerun_of is not None:
            entry.verdict = f"rerun of {entry.rerun_of}'s config: it measures noise and is not ranked"
            continue
        measured = noise[place[run_id]]
        entry.sigma, entry.reruns = measured.sigma, measured.reruns
        if facts.budget_met is False:
            entry.verdict = f"not compared: a time cap stopped it before its {facts.budget.describe()}"
            continue
        entry.delta, entry.beyond_noise, entry.verdict = _compare(run_id, entry, entries, values, place, measured)


def _group_values(first: str, read: dict[str, tuple[Experiment, _Facts]]) -> list[float]:
    """The val_bpb of `first` and of its reruns that trained their whole budget. A run that fixes its work
    (tokens, FLOPs, steps) repeats itself exactly from one seed, so each seed counts once there; a run on a
    time budget does not."""
    by_seed: dict[int, float] = {}
    times: list[float] = []
    for run_id, (entry, facts) in read.items():
        if (run_id != first and entry.rerun_of != first) or entry.val_bpb is None or facts.budget_met is False:
            continue
        if facts.budget.kind == "time":
            times.append(entry.val_bpb)
        else:
            by_seed.setdefault(facts.seed, entry.val_bpb)
    return [*by_seed.values(), *times]


def _compare(
    run_id: str,
    entry: Experiment,
    entries: dict[str, Experiment],
    values: dict[str, list[float]],
    place: dict[str, tuple[str, Budget]],
    noise: Noise,
) -> tuple[float | None, bool | None, str | None]:
    """The run's delta against its parent's config, whether it beats `noise`, and the verdict in words."""
    mine = values[run_id]
    parent = entry.parent
    if parent is None:
        baseline = f"baseline: mean {statistics.fmean(mine):.4f} over {len(mine)} runs" if len(mine) > 1 else None
        return None, None, baseline
    first = entries[parent].rerun_of or parent if parent in entries else parent
    if first not in place:
        return None, None, f"not compared: its parent {first} is unreadable (get_run says why)"
    theirs = values.get(first, [])
    (dataset, budget), (parent_dataset, parent_budget) = place[run_id], place[first]
    if budget != parent_budget or dataset != parent_dataset:
        budgets = f"{parent_budget.describe()}, not {budget.describe()}"
        other = "dataset" if budget == parent_budget else f"budget ({budgets})"
        return None, None, f"not compared with {first}, which has another {other}: compare runs of one budget"
    if not mine or not theirs:
        return None, None, None
    delta = statistics.fmean(mine) - statistics.fmean(theirs)
    said = f"delta {delta:+.4f} against {first} (means of {len(mine)} and {len(theirs)} runs)"
    if not noise.measured:
        return (
            delta,
            None,
            (
                f"{said}; noise not measured: {noise.reruns} reruns at this dataset and budget, {MIN_RERUNS} needed; "
                f"rerun_baseline {first}"
            ),
        )
    threshold = noise.threshold(len(mine), len(theirs))
    beyond = abs(delta) > threshold
    judged = "beyond noise" if beyond else "within noise"
    measured = f"sigma {noise.sigma:.4f} from {noise.reruns} reruns; |delta| must exceed {threshold:.4f}"
    return delta, beyond, f"{said}: {judged} ({measured})"


def _matches(entry: Experiment, request: ListExperimentsRequest) -> bool:
    return (
        (request.status is None or entry.status == request.status)
        and (request.changed is None or request.changed in entry.changes)
        and (request.sweep_id is None or entry.sweep_id == request.sweep_id)
    )


def _export(ctx: ToolContext, entries: list[Experiment], form: Literal["tsv", "csv"]) -> str:
    """Write `entries` as one row each (changes as `field=value; ...`) to reports/experiments.<form>."""
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t" if form == "tsv" else ",", lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for entry in entries:
        row = entry.model_dump()
        row["changes"] = "; ".join(f"{name}={value}" for name, value in entry.changes.items())
        # A tab or a newline in a note would break a TSV row; CSV quotes them, TSV gets spaces.
        writer.writerow(["" if row[c] is None else _one_line(str(row[c]), form) for c in EXPORT_COLUMNS])
    path = ctx.workspace.write_atomic(f"reports/experiments.{form}", text.getvalue(), argument="export")
    return str(path)


def _one_line(value: str, form: str) -> str:
    return " ".join(value.split()) if form == "tsv" else value
