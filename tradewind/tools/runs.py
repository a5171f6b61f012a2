"""Tools that watch training runs and stop them: `get_run`, `wait_for_run`, `list_runs` and `cancel_run`.

Every run is a folder `runs/<id>/` with its record (`run.json`, see `tradewind.runs.record`) and, when a
job runs it, a job on the backend the record names. These tools read both, so they work the same on runs
started by `launch_training`, `tradewind train` or a Python call of `tradewind.trainer.train`.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import AcceleratorName, JobRecord, JobStatus, Placement
from tradewind.cluster.process import process_alive
from tradewind.core import (
    InvalidInputError,
    TradewindError,
    check_id,
    tail_lines,
)
from tradewind.core.buckets import is_remote
from tradewind.runs import RunLayout, RunRecord, TrainSummary, read_record, read_summary, read_train_config
from tradewind.runs.layout import bucket_checkpoint_steps
from tradewind.runs.metrics import MAX_ROW_PROBLEMS, load_metrics, planned_steps
from tradewind.runs.record import checkpoints_of
from tradewind.tools.bounds import LINE_CHARS, PAGE_CHARS, PageRequest, cut, fitting
from tradewind.tools.buckets import pull_run_outputs
from tradewind.tools.context import LOG_TAIL_LINES, Progress, ToolContext, no_progress
from tradewind.tools.spec import tool

CANCEL_WAIT_S = 60.0
REASON_CHARS = 2_000  # a run's reason in get_run; the whole story is in its log (tail_logs)
MAX_STEP = 1_000_000_000


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str  # no description: the name says it, and tools/list has a character budget


class WaitForRunRequest(RunRequest):
    timeout_s: float = Field(default=120, gt=0, le=3600, description="The run goes on after.")


class ListRunsRequest(PageRequest):
    """list_runs's page of the listing."""


class RunInfo(BaseModel):
    run_id: str
    status: JobStatus
    run_dir: str
    log_file: str
    dataset: str
    total_steps: int
    step: int = Field(description="Updates done so far, from the latest metrics row (0 before the first).")
    loss: float | None = Field(default=None, description="Latest training loss.")
    eval_loss: float | None = Field(default=None, description="Latest held-out loss.")
    backend: str = Field(description="'local' or 'ray' (a job runs it), or 'process' (a Python call trains it).")
    job_id: str | None = Field(default=None, description="The backend job that runs it.")
    accelerator: AcceleratorName
    accelerator_note: str | None = Field(
        default=None, description=RunRecord.model_fields["accelerator_note"].description
    )
    processes: int = Field(description="Processes (hosts) training it together.")
    platform: str | None = Field(default=None, description="JAX platform it trains on, once started.")
    parent: str | None = Field(default=None, description="The run this one continues (resume_from).")
    parent_run: str | None = Field(default=None, description="The run this experiment changes.")
    attempts: int = Field(default=0, description="Times its job started (1 + restarts after kills).")
    submitted_at: str
    started_at: str | None = None
    ended_at: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = Field(
        default=None, description=f"Why it failed, was cancelled or waits (cut to {REASON_CHARS:,} characters)."
    )
    log_tail: list[str] = Field(
        default_factory=list,
        description=f"Last {LOG_TAIL_LINES} log lines if it failed, cut to {LINE_CHARS} characters; see tail_logs.",
    )
    summary: TrainSummary | None = Field(default=None, description="Final figures, once the run has finished.")
    skipped_rows: list[str] = Field(
        default_factory=list,
        description=f"Unreadable metrics.jsonl rows, as 'file:line: problem' (first {MAX_ROW_PROBLEMS}, then a count).",
    )
    storage: str | None = Field(default=None, description="Bucket prefix of its files.")


class WaitForRunResult(RunInfo):
    timed_out: bool = Field(description="True when the run was still going at the timeout; call again to wait on.")


class RunEntry(BaseModel):
    """One run in list_runs: get_run tells the rest."""

    run_id: str
    status: JobStatus
    step: int
    total_steps: int
    loss: float | None = Field(description="Latest training loss.")
    eval_loss: float | None = Field(description="Latest held-out loss.")
    backend: str
    accelerator: AcceleratorName
    submitted_at: str
    reason: str | None = Field(description=f"Why it failed or waits, cut to {LINE_CHARS} characters.")


class UnreadableRun(BaseModel):
    run_id: str = Field(description="The folder's name under runs/.")
    reason: str = Field(description=f"Why it could not be read, cut to {LINE_CHARS} characters.")


class RunList(BaseModel):
    runs: list[RunEntry] = Field(description="Newest first.")
    unreadable: list[UnreadableRun] = Field(
        default_factory=list, description="Folders in runs/ on this page that are not readable runs."
    )
    total: int = Field(description="Folders in runs/, all pages together.")
    next_cursor: str | None = Field(
        description="Pass as cursor to list the older runs after this page; null when there are none."
    )


@tool("Get a run's status", read_only=True, idempotent=True, open_world=True, links=("logs", "metrics"), dashboard=True)
def get_run(ctx: ToolContext, request: RunRequest) -> RunInfo:
    """A run's status and losses. Use it to check a run without waiting."""
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    read = ctx.workspace.reader("run_id")
    record = run_record(ctx, request.run_id)
    # A run in a bucket: copy its outputs back until the trainer's summary is here (a failed attempt may be retried).
    if record.placement.storage is not None and not (record.status.finished and layout.summary.is_file()):
        pull_run_outputs(ctx, layout, record.placement.storage)
        record = run_record(ctx, request.run_id)
    config = read_train_config(layout.config, read)
    job, reason = _job(ctx, record)
    if job is not None and job.status.finished and _trained_again_after(record, job):
        job, reason = None, None  # resumed by hand (python -m tradewind.trainer) after its job ended
    status = job.status if job else _process_status(record)
    if status is JobStatus.FAILED and record.status is JobStatus.FAILED and record.reason:
        reason = record.reason  # the trainer's own words beat an exit code
    elif status is JobStatus.FAILED and job is None:
        reason = record.reason or f"the training process {record.pid} on {record.host} ended without finishing"
    metrics = load_metrics(layout.metrics, read)
    rows = metrics.rows
    summary = read_summary(layout.summary, read)
    losses = [row.loss for row in rows if row.loss is not None]
    eval_losses = [row.eval_loss for row in rows if row.eval_loss is not None]
    return RunInfo(
        run_id=request.run_id,
        status=status,
        run_dir=str(layout.root),
        log_file=str(layout.log),
        dataset=config.dataset,
        total_steps=summary.steps if summary else planned_steps(config, rows),
        step=rows[-1].step if rows else 0,
        loss=losses[-1] if losses else None,
        eval_loss=eval_losses[-1] if eval_losses else None,
        backend=record.backend,
        job_id=record.job_id,
        accelerator=record.placement.accelerator,
        accelerator_note=record.accelerator_note,
        storage=record.placement.storage,
        processes=record.processes,
        platform=record.platform,
        parent=record.parent,
        parent_run=record.parent_run,
        attempts=job.attempts if job else int(record.started_at is not None),
        submitted_at=job.submitted_at if job and job.submitted_at else record.created_at,
        started_at=job.started_at if job and job.started_at else record.started_at,
        ended_at=job.ended_at if job else record.ended_at,
        pid=job.pid if job else record.pid,
        exit_code=job.exit_code if job else None,
        reason=cut(reason, REASON_CHARS) if reason else None,
        log_tail=[cut(line) for line in tail_lines(layout.log, LOG_TAIL_LINES, read)]
        if status is JobStatus.FAILED
        else [],
        summary=summary,
        skipped_rows=[cut(problem) for problem in metrics.skipped_rows()],
    )


def run_record(ctx: ToolContext, run_id: str) -> RunRecord:
    """The record (`run.json`) of run `run_id`, read through the workspace's confined open.

    Raises:
        NotFoundError: the folder holds no record (not a run folder, or one made by an older Tradewind).
    """
    return read_record(RunLayout(ctx.workspace.run_dir(run_id)).record, ctx.workspace.reader("run_id"))


def run_placement(ctx: ToolContext, run_dir: Path, argument: str) -> Placement:
    """Where the run in `run_dir` was placed (its record's placement); the default, one CPU process, for a
    folder trained by hand, which has no record. `argument` names the request field in a refusal."""
    record = RunLayout(run_dir).record
    return read_record(record, ctx.workspace.reader(argument)).placement if os.path.lexists(record) else Placement()


def _job(ctx: ToolContext, record: RunRecord) -> tuple[JobRecord | None, str | None]:
    """The run's job record and its reason; (None, None) for a run without a job.

    Raises:
        TradewindError: the job's backend cannot be reached or does not know the job; the message says which.
    """
    if record.job_id is None:
        return None, None
    try:
        job = ctx.job_backend(record.backend, record.address).status(record.job_id)
    except TradewindError as error:
        raise TradewindError(f"run {record.run_id}: its {record.backend} job {record.job_id!r}: {error}") from None
    return job, job.reason


def _trained_again_after(record: RunRecord, job: JobRecord) -> bool:
    """Whether the run trained again after its job ended: its record ended later (timestamps are ISO-8601
    UTC), or a trainer of it is alive on this machine now."""
    if record.ended_at is not None:
        return job.ended_at is not None and record.ended_at > job.ended_at
    return _alive_here(record)


def _process_status(record: RunRecord) -> JobStatus:
    """The status of a run trained by a Python call: its record's, unless its process died while RUNNING."""
    if record.status is not JobStatus.RUNNING or record.host != socket.gethostname() or record.pid is None:
        return record.status
    return record.status if _alive_here(record) else JobStatus.FAILED


def _alive_here(record: RunRecord) -> bool:
    """Whether the record's trainer process is RUNNING on this machine now (pid and start time)."""
    return (
        record.status is JobStatus.RUNNING
        and record.host == socket.gethostname()
        and record.pid is not None
        and process_alive(record.pid, record.pid_start)
    )


@tool("Wait for a run", read_only=True, idempotent=True, open_world=True, links=("logs", "metrics"))
def wait_for_run(ctx: ToolContext, request: WaitForRunRequest, progress: Progress = no_progress) -> WaitForRunResult:
    """Wait up to timeout_s for a run to end. Use it instead of polling get_run.

    The run goes on either way. Returns the same fields as get_run plus `timed_out`. Waiting costs nothing; after a
    timeout or a cancelled call, call again to keep waiting.
    """
    deadline = time.monotonic() + request.timeout_s
    record = run_record(ctx, request.run_id)
    backend = ctx.job_backend(record.backend, record.address) if record.job_id else None
    info = get_run(ctx, request)
    while True:
        loss = "n/a" if info.loss is None else f"{info.loss:.4f}"
        progress(info.step, info.total_steps, f"step {info.step}/{info.total_steps}, loss {loss}")
        left = deadline - time.monotonic()
        if info.status.finished or left <= 0:
            return WaitForRunResult(**info.model_dump(), timed_out=not info.status.finished)
        # Look again within half a second, reporting each time: the callback sends only a higher step and
        # raises once the caller has cancelled, which stops this wait (never the run) promptly.
        if backend is not None:
            backend.wait(record.job_id, timeout=min(0.5, left))
        else:
            time.sleep(min(0.5, left))  # a Python-call run has no job to wait on
        info = get_run(ctx, request)


@tool("Cancel a run", destructive=True, idempotent=True, open_world=True, links=("logs",))
def cancel_run(ctx: ToolContext, request: RunRequest) -> RunInfo:
    """Stop a run (checkpoints stay). Use it on a diverging or unneeded run.

    Returns once the run has stopped; resume_from can continue it later, from its checkpoints. A run already finished is
    returned as it is. Waits up to a minute for the processes to end; a run still stopping then is
    returned RUNNING with reason 'cancelled on request'.
    """
    record = run_record(ctx, request.run_id)
    if record.job_id is None:
        raise InvalidInputError(
            f"argument 'run_id': run {request.run_id} is trained by a Python call in process {record.pid} on "
            f"{record.host}, not by a job; stop that program to stop it"
        )
    backend = ctx.job_backend(record.backend, record.address)
    backend.cancel(record.job_id)
    backend.wait(record.job_id, timeout=CANCEL_WAIT_S)
    return get_run(ctx, request)


@tool("List runs", read_only=True, idempotent=True, open_world=True)
def list_runs(ctx: ToolContext, request: ListRunsRequest) -> RunList:
    """Runs, newest first. Use it to find a run id.

    A page at a time; get_run tells the rest. A folder in runs/ that is not a readable run is listed under `unreadable`
    with the reason. Pass next_cursor on for older runs.
    """
    with os.scandir(ctx.workspace.runs_dir) as entries:  # a DirEntry knows whether it is a folder without a stat
        names = sorted((entry.name for entry in entries if entry.is_dir()), reverse=True)
    folders = [ctx.workspace.runs_dir / name for name in names]
    if request.cursor is not None:
        cursor = check_id(request.cursor, "cursor")
        folders_left = [p for p in folders if p.name < cursor]  # run ids sort by the time they were made
    else:
        folders_left = folders
    page = fitting((_entry(ctx, folder) for folder in folders_left[: request.limit]), PAGE_CHARS)
    return RunList(
        runs=[entry for entry in page if isinstance(entry, RunEntry)],
        unreadable=[entry for entry in page if isinstance(entry, UnreadableRun)],
        total=len(folders),
        next_cursor=page[-1].run_id if len(page) < len(folders_left) else None,
    )


def _entry(ctx: ToolContext, folder: Path) -> RunEntry | UnreadableRun:
    try:
        info = get_run(ctx, RunRequest(run_id=folder.name))
    except (TradewindError, ValueError, OSError) as error:  # one bad folder must not hide the others
        return unreadable_run(folder, error)
    return RunEntry(
        **info.model_dump(include=set(RunEntry.model_fields) - {"reason"}),
        reason=cut(info.reason) if info.reason else None,
    )


def unreadable_run(folder: Path, error: Exception) -> UnreadableRun:
    """Folder `folder` of runs/, which `error` said is no readable run."""
    # Tradewind's errors name the file and field; of any other only its first line, never a raw dump of the
    # file's content (pydantic's carries the input and a URL).
    why = str(error) if isinstance(error, TradewindError) else str(error).splitlines()[0]
    why = why.replace(f"{folder}{os.sep}", "")  # files by their names in the run's folder: short, and enough
    return UnreadableRun(run_id=folder.name, reason=cut(why.replace("\n", "; ")))


def checkpoint_steps(ctx: ToolContext, layout: RunLayout, argument: str) -> list[int]:
    """Steps of the run's complete checkpoints, oldest first: in its folder (orbax names a finished one by its
    step alone), or in its bucket for a run with `storage`.

    Raises:
        PathEscapeError: the folder, or anything in it, is a symlink that leads outside the workspace; the
            message names `argument`.
    """
    location = checkpoints_of(layout, ctx.workspace.reader(argument))
    if is_remote(location):
        return bucket_checkpoint_steps(str(location))
    if not (layout.checkpoints.exists() or layout.checkpoints.is_symlink()):
        return []
    # Whoever reads them reads them whole: nothing in them may lead out of the workspace.
    folder = ctx.workspace.check_tree(layout.checkpoints, argument=argument)
    if not folder.is_dir():
        return []
    return sorted(int(path.name) for path in folder.iterdir() if path.is_dir() and path.name.isdigit())
