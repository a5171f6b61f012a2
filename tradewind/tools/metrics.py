"""The tool that reads a run's metrics: bounded series, downsampled the same way every time, and a summary.

A run may log thousands of rows; an agent gets at most `MAX_POINTS` points of all the series it asks for,
keeping the rows that matter (the first, the last, the lowest loss, every evaluation), and zooms into a
step range for full resolution.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from pydantic import BaseModel, Field, model_validator

from tradewind.core import ConfigError, NotFoundError
from tradewind.runs import MetricRow, RunLayout, RunRecord
from tradewind.runs.metrics import MAX_ROW_PROBLEMS, load_metrics
from tradewind.tools.anomalies import MAX_ANOMALIES, Anomaly, detect_anomalies, failure_anomaly
from tradewind.tools.bounds import cut
from tradewind.tools.context import ToolContext
from tradewind.tools.runs import MAX_STEP, RunRequest, run_record
from tradewind.tools.spec import tool

# The series read_metrics can return, in MetricRow's order; the first five unless asked.
MetricName = Literal[
    "loss",
    "eval_loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "param_norm",
    "step_time_s",
    "mfu",
    "skipped_steps",
    "eval_perplexity",
    "eval_bits_per_byte",
    "elapsed",
]
DEFAULT_SERIES: tuple[MetricName, ...] = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_s")
# Points of all series together in one read_metrics result: at most ~25 characters each (a step, a value of
# 6 significant figures, two commas), so 1,000 of them leave room for the rest in a result's 31,000 characters.
MAX_POINTS = 1_000
SIGNIFICANT_DIGITS = 6


class ReadMetricsRequest(RunRequest):
    series: list[MetricName] = Field(
        default=list(DEFAULT_SERIES),
        min_length=1,
        max_length=len(get_args(MetricName)),
    )
    max_points: int = Field(
        default=200,
        ge=4,
        le=MAX_POINTS,
        description=f"Points per series at most; {MAX_POINTS:,} in all.",
    )
    start_step: int | None = Field(default=None, ge=0, le=MAX_STEP)
    end_step: int | None = Field(default=None, ge=0, le=MAX_STEP)

    @model_validator(mode="after")
    def _ordered(self) -> ReadMetricsRequest:
        if self.start_step is not None and self.end_step is not None and self.start_step > self.end_step:
            raise ValueError(f"start_step {self.start_step} is after end_step {self.end_step}")
        return self


class Series(BaseModel):
    steps: list[int]
    values: list[float | None] = Field(
        description=f"The metric at each step, rounded to {SIGNIFICANT_DIGITS} significant figures; null where it "
        "was not finite."
    )


class MetricsSummary(BaseModel):
    """Figures of the whole run, from every row (whatever range and downsampling the series show)."""

    rows: int = Field(description="Rows logged so far.")
    last_step: int | None = Field(description="Step of the latest row.")
    last_loss: float | None = Field(description="Latest training loss.")
    best_eval_loss: float | None = Field(description="Lowest held-out loss.")
    best_eval_step: int | None = Field(description="Step of the lowest held-out loss.")
    mean_tokens_per_s: float | None = Field(
        description="Training tokens per second of step time, over the logged steps (as get_run's summary at the end)."
    )
    mean_mfu: float | None = Field(description="Model FLOPs utilisation over the logged steps' time (0 to 1).")
    anomalies: list[Anomaly] = Field(
        description=f"Loss spikes, non-finite values, stalls and restarts with their steps (the first {MAX_ANOMALIES})."
    )


class Metrics(BaseModel):
    run_id: str
    start_step: int | None = Field(description="Step of the first row in the range shown.")
    end_step: int | None = Field(description="Step of the last row in the range shown.")
    rows_in_range: int = Field(description="Rows logged in the range.")
    rows_kept: int = Field(description="Rows of the range the series draw on (all of them unless truncated).")
    series: dict[str, Series] = Field(description="Each metric asked for, at the rows kept where it was logged.")
    truncated: bool = Field(description="True when rows of the range were left out; `hint` says how to see them.")
    hint: str | None = Field(default=None, description="How to see the rows left out, when some were.")
    summary: MetricsSummary
    skipped_rows: list[str] = Field(
        default_factory=list,
        description=f"Unreadable rows skipped, each 'file:line: what was wrong' (the first {MAX_ROW_PROBLEMS}, then "
        "how many more).",
    )


@tool("Read a run's metrics", read_only=True, idempotent=True, links=("metrics",), dashboard=True)
def read_metrics(ctx: ToolContext, request: ReadMetricsRequest) -> Metrics:
    """A run's metric curves, downsampled, with anomalies. Use it to read loss curves.

    The summary gives the last step and loss, the best eval loss and its step, mean tokens/s and MFU, and
    anomalies (loss spikes, non-finite values, stalls, restarts) with their steps. A long run is downsampled
    keeping the first, last, lowest-loss and eval rows; a range given with start_step/end_step shows every row
    of it, up to max_points.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    metrics = load_metrics(layout.metrics, ctx.workspace.reader("run_id"))
    rows = metrics.rows
    low = request.start_step if request.start_step is not None else -1
    high = request.end_step if request.end_step is not None else math.inf
    in_range = [row for row in rows if low <= row.step <= high]
    names = list(dict.fromkeys(request.series))
    budget = min(request.max_points, MAX_POINTS // len(names))
    kept = [in_range[index] for index in _rows_to_keep(in_range, budget)]
    truncated = len(kept) < len(in_range)
    hint = None
    if truncated:
        hint = (
            f"kept {len(kept)} of the {len(in_range)} rows of steps {in_range[0].step}-{in_range[-1].step}; pass "
            f"start_step and end_step spanning at most {budget} rows to see every row there (or fewer series, "
            f"for up to {MAX_POINTS:,} rows); the resource tradewind://runs/{request.run_id}/metrics holds the "
            "raw metrics.jsonl (its end, when long)"
        )
    return Metrics(
        run_id=request.run_id,
        start_step=in_range[0].step if in_range else None,
        end_step=in_range[-1].step if in_range else None,
        rows_in_range=len(in_range),
        rows_kept=len(kept),
        series={name: _series(kept, name) for name in names},
        truncated=truncated,
        hint=hint,
        summary=metrics_summary(rows, _record(ctx, request.run_id)),
        skipped_rows=[cut(problem) for problem in metrics.skipped_rows()],
    )


def _record(ctx: ToolContext, run_id: str) -> RunRecord | None:
    """The run's record: the run it continues, and why it failed (none without a readable one; one that leads
    outside the workspace is refused)."""
    try:
        return run_record(ctx, run_id)
    except (NotFoundError, ConfigError):
        return None


def _rows_to_keep(rows: list[MetricRow], budget: int) -> list[int]:
    """Indexes of at most `budget` (>= 4) rows to show, the same for the same rows.

    All of them when they fit. Otherwise the first, the last, the lowest training loss and every eval row,
    the rest evenly spaced; when the eval rows alone are too many, evenly spaced ones and the best.
    """
    if len(rows) <= budget:
        return list(range(len(rows)))
    anchors = {0, len(rows) - 1}
    if (lowest := _argmin(rows, "loss")) is not None:
        anchors.add(lowest)
    evals = [index for index, row in enumerate(rows) if row.eval_loss is not None]
    if len(anchors.union(evals)) <= budget:
        kept = anchors.union(evals)
        rest = [index for index in range(len(rows)) if index not in kept]
    else:
        best = _argmin(rows, "eval_loss")
        kept = anchors if best is None else anchors | {best}
        rest = [index for index in evals if index not in kept]
    return sorted(kept.union(_evenly_spaced(rest, budget - len(kept))))


def _argmin(rows: list[MetricRow], name: str) -> int | None:
    """Index of the row with the lowest finite value of `name` (the first such), or None if none has one."""
    finite = [(value, index) for index, row in enumerate(rows) if _finite(value := getattr(row, name))]
    return min(finite)[1] if finite else None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _evenly_spaced(items: list[int], count: int) -> list[int]:
    """`count` of `items`, evenly spaced, the first and last included; all of them if there are no more."""
    if count >= len(items):
        return items
    if count <= 0:
        return []
    if count == 1:
        return [items[len(items) // 2]]
    # Floor division: positions at least one apart stay distinct (round() would merge 1.5 and 2.5).
    return [items[i * (len(items) - 1) // (count - 1)] for i in range(count)]


def _series(rows: list[MetricRow], name: str) -> Series:
    logged = [row for row in rows if getattr(row, name) is not None]
    return Series(steps=[row.step for row in logged], values=[_rounded(getattr(row, name)) for row in logged])


def _rounded(value: float | None) -> float | None:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if _finite(value) else None


def metrics_summary(rows: list[MetricRow], record: RunRecord | None = None) -> MetricsSummary:
    """The run's figures from all its rows (and the anomalies its `record` tells of: a resume, the non-finite
    loss that stopped it). Throughput and MFU are weighted by the time of each log interval (its updates times
    its step time), which is what the trainer's summary reports at the end."""
    losses = [row.loss for row in rows if row.loss is not None]
    best = _argmin(rows, "eval_loss")
    weights, tokens_per_s, mfu = [], [], []
    previous = rows[0].step if rows else 0
    for row in rows:
        if row.step_time_s is None or row.tokens_per_s is None:
            continue
        weights.append((row.step - previous) * row.step_time_s)
        tokens_per_s.append(row.tokens_per_s)
        mfu.append(row.mfu)
        previous = row.step
    return MetricsSummary(
        rows=len(rows),
        last_step=rows[-1].step if rows else None,
        last_loss=_rounded(losses[-1]) if losses else None,
        best_eval_loss=_rounded(rows[best].eval_loss) if best is not None else None,
        best_eval_step=rows[best].step if best is not None else None,
        mean_tokens_per_s=_rounded(_weighted_mean(tokens_per_s, weights)),
        mean_mfu=_rounded(_weighted_mean(mfu, weights)),
        anomalies=detect_anomalies(
            rows,
            parent=record.parent if record else None,
            parent_step=record.parent_step if record else None,
            stopped=failure_anomaly(record.reason) if record else None,
        )[:MAX_ANOMALIES],
    )


def _weighted_mean(values: list[float | None], weights: list[float]) -> float | None:
    pairs = [(value, weight) for value, weight in zip(values, weights, strict=True) if value is not None]
    total = sum(weight for _, weight in pairs)
    return sum(value * weight for value, weight in pairs) / total if total > 0 else None
