"""The experiment ledger: every run of the workspace as an experiment, its metric, what it changed, and what
became of it. Tools `list_experiments` (a leaderboard) and `set_experiment_status` (keep or discard).

Nothing is kept anywhere else: an experiment is a run folder, read from its record (`run.json`: the note,
parent run, sweep, decision and machine load, see `tradewind.trainer.record`), its `config.json` and its
`summary.json`. Its status:

    running    the run is pending or training
    finished   it succeeded and nobody has decided yet
    kept       set_experiment_status (or a sweep) kept it
    discarded  discarded, with the reason; a run cancelled without a decision is discarded as "cancelled"
    crashed    it failed; `reason` is the cause, in the trainer's words

The metric is `val_bpb`, bits per byte on the dataset's fixed val tokens, lower is better and comparable
across tokenizers; `changes` lists the config fields (dotted) whose values differ from the parent run's.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, TradewindError, check_id
from tradewind.tools.bounds import cut
from tradewind.tools.context import ToolContext
from tradewind.tools.report_data import changes_from
from tradewind.tools.runs import RunInfo, RunRequest, get_run, run_record
from tradewind.tools.spec import tool
from tradewind.trainer import RunLayout
from tradewind.trainer.record import RunRecord, update_record

Status = Literal["running", "finished", "kept", "discarded", "crashed"]
REASON_CHARS = 300  # a crash cause in the ledger; get_run and tail_logs have the whole story
FIELD_CHARS = 200  # a dotted config field name, far longer than any TrainConfig has
_FIELD_NAME = re.compile(rf"(?=.{{1,{FIELD_CHARS}}}$)[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
EXPORT_COLUMNS = (
    "run_id", "status", "val_bpb", "val_loss", "parent", "changes", "note", "reason", "sweep_id", "baseline",
    "steps", "train_s", "load", "concurrent_runs", "created_at",
)  # fmt: skip


class Experiment(BaseModel):
    """One run as an experiment."""

    run_id: str
    status: Status
    val_bpb: float | None = Field(default=None, description="The metric: bits per byte on the fixed val tokens.")
    val_loss: float | None = None
    parent: str | None = Field(default=None, description="The run it changes (parent_run) or continues.")
    changes: dict[str, Any] = Field(default_factory=dict, description="Config fields that differ from the parent's.")
    note: str | None = None
    reason: str | None = Field(default=None, description="The crash cause, or why it was kept or discarded.")
    sweep_id: str | None = None
    baseline: bool = Field(default=False, description="A rerun of its parent, to compare under the same load.")
    steps: int | None = None
    train_s: float | None = None
    load: float | None = Field(default=None, description="Highest 1-minute load per core seen at its start or end.")
    concurrent_runs: int | None = Field(default=None, description="Other active runs when it launched.")
    created_at: str


class ListExperimentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Status | None = Field(default=None, description="Only this status.")
    changed: str | None = Field(
        default=None, description="Only runs changing this dotted field (e.g. optimizer.learning_rate)."
    )
    sweep_id: str | None = Field(default=None, description="Only this sweep's runs.")
    limit: int = Field(default=20, ge=1, le=100, description="Best first.")
    export: Literal["tsv", "csv"] | None = Field(
        default=None, description="Also write matches to reports/experiments.<tsv|csv>."
    )


class ExperimentList(BaseModel):
    experiments: list[Experiment] = Field(description="Best val_bpb first; runs without one last, newest first.")
    total: int = Field(description="Experiments that match.")
    truncated: bool
    export_file: str | None = None


class SetExperimentStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(description="An ended run.")
    status: Literal["kept", "discarded"]
    reason: str = Field(min_length=1, max_length=REASON_CHARS, description="Why, in one line.")


@tool("List experiments", idempotent=True, open_world=True)
def list_experiments(ctx: ToolContext, request: ListExperimentsRequest) -> ExperimentList:
    """Runs by val_bpb with status, parent, changes, note, crash cause. Use it to pick the run to
    build on.

    Filter by status, by a changed config field or by sweep; export writes every match as TSV or CSV.
    """
    if request.sweep_id is not None:
        check_id(request.sweep_id, "sweep_id")
    if request.changed is not None and not _FIELD_NAME.fullmatch(request.changed):
        raise InvalidInputError(
            f"argument 'changed': {cut(request.changed, 80)!r} is not a config field; give a dotted field name of "
            f"at most {FIELD_CHARS} characters, such as optimizer.learning_rate"
        )
    entries = [entry for entry in _experiments(ctx) if _matches(entry, request)]
    entries.sort(key=lambda entry: entry.created_at, reverse=True)
    entries.sort(key=lambda entry: (entry.val_bpb is None, entry.val_bpb or 0.0))
    export_file = _export(ctx, entries, request.export) if request.export else None
    return ExperimentList(
        experiments=entries[: request.limit],
        total=len(entries),
        truncated=len(entries) > request.limit,
        export_file=export_file,
    )


@tool("Keep or discard an experiment", idempotent=True, open_world=True)
def set_experiment_status(ctx: ToolContext, request: SetExperimentStatusRequest) -> Experiment:
    """Keep or discard an ended run, with a reason. Use it after comparing its val_bpb with its parent's.

    The ledger keeps both the status and the reason."""
    if not request.reason.strip():
        raise InvalidInputError("argument 'reason': it is blank; say in one line why the run is kept or discarded")
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    if not get_run(ctx, RunRequest(run_id=request.run_id)).status.finished:
        raise InvalidInputError(
            f"argument 'run_id': run {request.run_id} is still running; wait_for_run first, or cancel_run it"
        )
    update_record(layout.record, decision=request.status, decision_reason=request.reason)
    return experiment(ctx, request.run_id)


def experiment(ctx: ToolContext, run_id: str, info: RunInfo | None = None) -> Experiment:
    """Run `run_id` as the ledger shows it (`info`: its `get_run`, if the caller has it already)."""
    record = run_record(ctx, run_id)
    info = info or get_run(ctx, RunRequest(run_id=run_id))
    summary = info.summary
    status, reason = _status(record, info)
    parent = record.parent_run or record.parent
    loads = [load for load in (record.load_start, record.load_end) if load is not None]
    return Experiment(
        run_id=run_id,
        status=status,
        val_bpb=summary.val_bpb if summary else None,
        val_loss=summary.val_loss if summary else None,
        parent=parent,
        changes=changes_from(ctx, run_id, parent),
        note=record.note,
        reason=reason,
        sweep_id=record.sweep_id,
        baseline=record.baseline,
        steps=summary.steps if summary else info.step,
        train_s=summary.train_s if summary else None,
        load=max(loads) if loads else None,
        concurrent_runs=record.concurrent_runs,
        created_at=record.created_at,
    )


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


def _experiments(ctx: ToolContext) -> list[Experiment]:
    """Every readable run of the workspace (list_runs reports the unreadable ones)."""
    found = []
    for folder in sorted(ctx.workspace.runs_dir.iterdir()):
        try:
            found.append(experiment(ctx, folder.name))
        except (TradewindError, ValueError, OSError):
            continue
    return found


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
