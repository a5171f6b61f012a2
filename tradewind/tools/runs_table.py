"""The runs table of the dashboard's front page: one row a run, with what a person sorts, filters and compares by.

A finished run's row comes from three small files, its record, config and summary; a run still going, or one that
ended without a summary (it crashed), from `get_run` and `read_metrics`' summary (its best eval loss and MFU so
far). A row of a run that has ended is kept for as long as its files stay as they are; a running one's is read
afresh each time, as its figures move. So a workspace of 1,000 finished runs costs one read of each run's small
files, never of their metrics, and then nothing until a file changes.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from tradewind.cluster import AcceleratorName, JobStatus
from tradewind.core import TradewindError
from tradewind.core.files import file_state
from tradewind.runs import RunLayout, RunRecord, TrainConfig, TrainSummary, read_record, read_summary, read_train_config
from tradewind.tools.context import ToolContext
from tradewind.tools.metrics import ReadMetricsRequest, read_metrics
from tradewind.tools.runs import RunRequest, UnreadableRun, get_run, unreadable_run


class RunRow(BaseModel):
    """One run as the front page's table shows it."""

    run_id: str
    status: JobStatus
    created_at: str
    note: str | None = Field(description="The launch's one line for the ledger.")
    sweep_id: str | None = Field(description="The sweep that launched it: the table groups its runs.")
    model: str = Field(description="Its preset, or architecture and shape; the Hugging Face folder it starts from.")
    parameters: int | None = Field(description="Trainable parameters, once its summary says.")
    accelerator: AcceleratorName
    devices: int | None = Field(description="Chips (JAX devices) over all its processes, once it has started.")
    step: int
    total_steps: int
    tokens: int = Field(description="Training tokens done: steps x tokens a step.")
    tokens_per_step: int
    final_eval_loss: float | None
    best_eval_loss: float | None
    bits_per_byte: float | None = Field(description="val_bpb, else the last eval's bits per byte.")
    mfu: float | None = Field(description="Mean model FLOPs utilisation (0 to 1).")
    wall_s: float | None = Field(description="Seconds from its start to its end, or to now while it runs.")
    decision: Literal["kept", "discarded"] | None = Field(description="The experiment ledger's.")
    decision_reason: str | None


class RunsTable(BaseModel):
    rows: list[RunRow] = Field(description="Newest first.")
    unreadable: list[UnreadableRun]


FileStamps = tuple[tuple[int, int] | None, ...]
_finished_rows: dict[Path, tuple[FileStamps, RunRow]] = {}  # by run folder: the row and the files it was read from
_lock = threading.Lock()  # the dashboard answers from several threads
# One reading of the table at a time: a page that comes while the server reads every run's files at its start
# waits for those rows rather than reading the same files beside it.
_reading = threading.Lock()


def runs_table(ctx: ToolContext) -> RunsTable:
    """Every run of the workspace as a table row, newest first; folders that are not readable runs apart."""
    with os.scandir(ctx.workspace.runs_dir) as entries:
        folders = sorted((Path(entry.path) for entry in entries if entry.is_dir()), reverse=True)
    rows, unreadable = [], []
    with _reading:
        for folder in folders:
            try:
                rows.append(run_row(ctx, folder))
            except (TradewindError, ValueError, OSError) as error:  # one bad folder must not hide the others
                unreadable.append(unreadable_run(folder, error))
    with _lock:  # forget the rows of runs deleted since
        for gone in [path for path in _finished_rows if path.parent == ctx.workspace.runs_dir and not path.is_dir()]:
            del _finished_rows[gone]
    return RunsTable(rows=rows, unreadable=unreadable)


def run_row(ctx: ToolContext, folder: Path) -> RunRow:
    """The row of the run in `folder`: kept from an earlier call while it has ended and its files are unchanged."""
    layout = RunLayout(folder)
    stamps = tuple(file_state(path) for path in (layout.record, layout.config, layout.summary, layout.metrics))
    with _lock:
        kept = _finished_rows.get(folder)
    if kept is not None and kept[0] == stamps:
        return kept[1]
    read = ctx.workspace.reader("run_id")
    record = read_record(layout.record, read)
    config = read_train_config(layout.config, read)
    summary = read_summary(layout.summary, read)
    if record.status.finished and summary is not None:
        row = _finished_row(record, config, summary)
    else:
        row = _live_row(ctx, record, config)
    if row.status.finished:  # a crashed run's too: nothing of it moves until one of its files changes
        with _lock:
            _finished_rows[folder] = (stamps, row)
    return row


def _finished_row(record: RunRecord, config: TrainConfig, summary: TrainSummary) -> RunRow:
    return RunRow(
        **row_facts(record, config),
        status=record.status,
        parameters=summary.parameters,
        step=summary.steps,
        total_steps=summary.steps,
        tokens=summary.tokens_seen,
        final_eval_loss=summary.final_eval_loss,
        best_eval_loss=summary.best_eval_loss,
        bits_per_byte=summary.val_bpb if summary.val_bpb is not None else summary.final_eval_bits_per_byte,
        mfu=summary.mfu,
        wall_s=summary.wall_s,
    )


def _live_row(ctx: ToolContext, record: RunRecord, config: TrainConfig) -> RunRow:
    """A run that has not finished, or ended without a summary: its job's status and its metrics so far."""
    info = get_run(ctx, RunRequest(run_id=record.run_id))
    series = read_metrics(ctx, ReadMetricsRequest(run_id=record.run_id, series=["eval_bits_per_byte"], max_points=4))
    bits = [value for value in series.series["eval_bits_per_byte"].values if value is not None]
    return RunRow(
        **row_facts(record, config),
        status=info.status,
        parameters=info.summary.parameters if info.summary else None,
        step=info.step,
        total_steps=info.total_steps,
        tokens=info.step * config.tokens_per_step,
        final_eval_loss=info.eval_loss,
        best_eval_loss=series.summary.best_eval_loss,
        bits_per_byte=bits[-1] if bits else None,
        mfu=series.summary.mean_mfu,
        wall_s=_seconds_between(info.started_at, info.ended_at),
    )


def row_facts(record: RunRecord, config: TrainConfig) -> dict[str, object]:
    """The fields of a run's row that its record and config fix (the run page takes its tokens a step and
    devices from them)."""
    model = config.model
    shape = model.preset or f"{model.type} {model.n_layers}x{model.d_model}"
    return {
        "run_id": record.run_id,
        "created_at": record.created_at,
        "note": record.note,
        "sweep_id": record.sweep_id,
        "model": f"{shape} from {Path(config.init_from).name}" if config.init_from else shape,
        "accelerator": record.placement.accelerator,
        "devices": record.devices,
        "tokens_per_step": config.tokens_per_step,
        "decision": record.decision,
        "decision_reason": record.decision_reason,
    }


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if start is None:
        return None
    until = datetime.fromisoformat(end) if end else datetime.now(UTC)
    return round((until - datetime.fromisoformat(start)).total_seconds(), 1)
