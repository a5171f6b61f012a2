"""What reports and comparisons say about a run, gathered from its folder: figures from its metrics rows, its
config flattened to dotted names, its checkpoints, a sample from its last one, and why it failed.

Every figure of a run's metrics is computed from `metrics.jsonl` itself (not `summary.json`), so a report of a
run still training, or one that failed, reads the same way as a finished one. The one exception is `val_bpb`,
which the run scores once, at its end, into `summary.json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tradewind.cluster import JobStatus
from tradewind.core import NotFoundError, TradewindError, read_json, read_json_config, tail_lines
from tradewind.core.files import Opener
from tradewind.runs import MetricRow, ProfileSummary, RunLayout, TrainConfig, read_train_config
from tradewind.runs.metrics import load_metrics
from tradewind.tools.anomalies import MAX_ANOMALIES, Anomaly, detect_anomalies, failure_anomaly
from tradewind.tools.bounds import cut
from tradewind.tools.context import Cancelled, Progress, ToolContext, no_progress
from tradewind.tools.logs import failure_hints
from tradewind.tools.metrics import metrics_summary
from tradewind.tools.report_plots import Curve
from tradewind.tools.runs import RunInfo, RunRequest, checkpoint_steps, get_run, run_record
from tradewind.tools.sampling import SampleTextRequest, sample_text

SAMPLE_PROMPT = "The"
SAMPLE_TOKENS = 60
SAMPLE_TIMEOUT_S = 180
LOG_LINES_READ = 400  # of a failed run's log, searched for its cause
# Config fields that differ between any two runs whatever was changed on purpose.
UNCOMPARED_FIELDS = frozenset({"resume_from", "init_from", "run_id", "output_dir"})
MAX_CHANGES = 20  # changed fields listed per run
LABEL_CHARS = 60  # of a run's legend label: its id and what it changes

# The metric to decide on, defined once for reports, comparisons and the experiment ledger.
VAL_BPB_MEANING = (
    "val_bpb is bits per UTF-8 byte on the dataset's fixed val tokens after the last update (the run's "
    "summary.json): the metric to decide on, lower is better, comparable across tokenizers."
)
# The periodic evals draw other, fewer tokens than val_bpb, so their figures differ from it a little.
EVAL_CURVE_MEANING = (
    "The eval curve is the periodic eval on eval_batches val batches during training: it shows the trend, "
    "val_bpb decides."
)


class RunFigures(BaseModel):
    """One run's headline figures, each from its metrics rows."""

    run_id: str
    status: JobStatus
    cause: str | None = Field(default=None, description="Why a failed run failed, from its log.")
    steps: int = Field(description="Step of the latest row.")
    tokens_seen: int = Field(description="Training tokens up to the latest row: step x batch_size x seq_len.")
    val_bpb: float | None = Field(description="Bits per byte on the fixed val tokens at the end; null until then.")
    final_loss: float | None
    best_loss: float | None
    first_eval_loss: float | None = Field(description="The eval curve's (periodic evals on val batches).")
    final_eval_loss: float | None
    best_eval_loss: float | None
    best_eval_step: int | None
    tokens_per_s: float | None = Field(description="Mean training throughput.")
    mfu: float | None = Field(description="Mean model FLOPs utilisation (0 to 1).")
    checkpoints: list[int] = Field(description="Steps of the checkpoints the run keeps.")
    sample: str | None = Field(default=None, description="Text sampled from the last checkpoint.")
    anomalies: list[Anomaly]
    skipped_rows: list[str] = Field(
        default_factory=list, description="Unreadable metrics rows skipped, each 'file:line: what was wrong'."
    )


@dataclass
class RunData:
    """A run's files as a report reads them."""

    info: RunInfo
    config: TrainConfig
    rows: list[MetricRow]
    figures: RunFigures
    profile: ProfileSummary | None

    def tokens(self, step: int) -> int:
        return step * self.config.tokens_per_step

    @property
    def curve(self) -> Curve:
        """The run as its plots draw it."""
        return Curve(self.rows, self.config.tokens_per_step, self.figures.val_bpb)


def load_run(ctx: ToolContext, run_id: str, *, sample: bool = True, progress: Progress = no_progress) -> RunData:
    """The run's figures; with `sample`, text sampled from its last checkpoint (a failure to sample is noted).

    Every file is read through the workspace's confined open. `progress` goes on to the sampling, so a cancelled
    call stops there (`Cancelled` propagates).
    """
    info = get_run(ctx, RunRequest(run_id=run_id))
    layout = RunLayout(Path(info.run_dir))
    read = ctx.workspace.reader("run_id")
    metrics = load_metrics(layout.metrics, read)
    rows = metrics.rows
    if not rows:
        raise NotFoundError(f"run {run_id!r} has logged no metrics yet; wait for it, then ask again")
    config = read_train_config(layout.config, read)
    profile_file = layout.profile / "summary.json"
    present = profile_file.exists() or profile_file.is_symlink()  # a link is read to be refused, never followed
    profile = read_json_config(ProfileSummary, profile_file, read) if present else None
    summary = metrics_summary(rows)
    cause, stopped = failure_cause(layout, info.reason, read) if info.status is JobStatus.FAILED else (None, None)
    parent_step = _parent_step(ctx, run_id) if info.parent else None
    anomalies = detect_anomalies(rows, parent=info.parent, parent_step=parent_step, stopped=stopped)
    checkpoints = checkpoint_steps(ctx, layout, argument="run_id")
    last = rows[-1]
    figures = RunFigures(
        run_id=run_id,
        status=info.status,
        cause=cause,
        steps=last.step,
        tokens_seen=last.step * config.tokens_per_step,
        val_bpb=info.summary.val_bpb if info.summary else None,
        final_loss=_last(rows, "loss"),
        best_loss=_best(rows, "loss")[0],
        first_eval_loss=next((row.eval_loss for row in rows if _finite(row.eval_loss)), None),
        final_eval_loss=_last(rows, "eval_loss"),
        best_eval_loss=_best(rows, "eval_loss")[0],
        best_eval_step=_best(rows, "eval_loss")[1],
        tokens_per_s=summary.mean_tokens_per_s,
        mfu=summary.mean_mfu,
        checkpoints=checkpoints,
        sample=_sample(ctx, run_id, progress) if sample and checkpoints else None,
        anomalies=anomalies,
        skipped_rows=[cut(problem) for problem in metrics.skipped_rows()],
    )
    return RunData(info=info, config=config, rows=rows, figures=figures, profile=profile)


def failure_cause(layout: RunLayout, reason: str | None, opener: Opener) -> tuple[str | None, Anomaly | None]:
    """Why a failed run failed, in words, and the non-finite loss that stopped it if one did.

    The log names the cause ('training loss became nan at step 5'); the record's reason often only says how
    the process ended ('exited with code 1'), so the log comes first.
    """
    lines = tail_lines(layout.log, LOG_LINES_READ, opener)
    hints = failure_hints([*lines, *([reason] if reason else [])])
    stopped = next((a for line in lines if (a := failure_anomaly(line))), None) or failure_anomaly(reason)
    if hints:
        return f"{hints[0].meaning}: `{hints[0].matched}`", stopped
    last_error = next((line.strip() for line in reversed(lines) if "Error" in line), None)
    return (f"{reason}: `{last_error[:200]}`" if last_error and reason else reason or last_error), stopped


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted names: {'optimizer': {'lr': 1}} -> {'optimizer.lr': 1}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def config_differences(configs: dict[str, TrainConfig]) -> dict[str, dict[str, Any]]:
    """The dotted config fields whose values are not the same in every run: {field: {run_id: value}}."""
    flat = {run_id: flatten(config.model_dump(mode="json")) for run_id, config in configs.items()}
    names = sorted(set().union(*flat.values()) - UNCOMPARED_FIELDS)
    differing = {}
    for name in names:
        values = {run_id: fields.get(name) for run_id, fields in flat.items()}
        if len({repr(value) for value in values.values()}) > 1:
            differing[name] = values
    return differing


def changes_from(ctx: ToolContext, run_id: str, parent: str | None) -> dict[str, Any] | None:
    """The dotted config fields of run `run_id` whose values differ from run `parent`'s (its new values), at most
    `MAX_CHANGES` of them; empty with no parent; None when either config is unreadable (nothing is known)."""
    if parent is None:
        return {}
    read = ctx.workspace.reader("run_id")  # confined: a config.json linked out of the workspace reads as unreadable
    try:
        mine, theirs = (
            flatten(read_json(RunLayout(ctx.workspace.run_dir(run)).config, read)) for run in (run_id, parent)
        )
    except (TradewindError, ValueError, OSError):
        return None
    differing = {name: value for name, value in mine.items() if theirs.get(name) != value}
    return dict(sorted(item for item in differing.items() if item[0] not in UNCOMPARED_FIELDS)[:MAX_CHANGES])


def legend_labels(ctx: ToolContext, runs: list[RunData]) -> dict[str, str]:
    """Each run's label in a figure of several runs, by run id: the id and the config fields the run changes
    (`field=value`), against its parent run (`parent_run`, else the run it continues) or, with none, where it
    differs from the other runs in the figure; cut to `LABEL_CHARS`."""
    differences = config_differences({data.figures.run_id: data.config for data in runs})
    labels = {}
    for data in runs:
        run_id, parent = data.figures.run_id, data.info.parent_run or data.info.parent
        if parent is None:
            changes = {name: values[run_id] for name, values in differences.items()}
        else:
            changes = changes_from(ctx, run_id, parent) or {}
        described = ", ".join(f"{name}={value}" for name, value in changes.items())
        labels[run_id] = cut(f"{run_id}: {described}" if described else run_id, LABEL_CHARS)
    return labels


def value_at_tokens(data: RunData, name: str, tokens: int) -> tuple[float | None, int | None]:
    """The latest finite `name` of a row at or below `tokens` training tokens, and that row's step."""
    found = None, None
    for row in data.rows:
        value = getattr(row, name)
        if data.tokens(row.step) <= tokens and _finite(value):
            found = value, row.step
    return found


def fmt(value: float | None, digits: int = 4) -> str:
    """A figure as reports print it: `digits` decimals with thousands separators, or n/a."""
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _sample(ctx: ToolContext, run_id: str, progress: Progress) -> str:
    request = SampleTextRequest(
        run_id=run_id, prompt=SAMPLE_PROMPT, max_tokens=SAMPLE_TOKENS, seed=0, timeout_s=SAMPLE_TIMEOUT_S
    )
    try:
        result = sample_text(ctx, request, progress)
    except Cancelled:
        raise  # the caller cancelled the whole report, not just this sample
    except TradewindError as error:
        return f"(sampling failed: {error})"
    return result.prompt + result.text


def _parent_step(ctx: ToolContext, run_id: str) -> int | None:
    """The parent's checkpoint step a resumed run started from (its record), for the restart anomaly."""
    return run_record(ctx, run_id).parent_step


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _last(rows: list[MetricRow], name: str) -> float | None:
    return next((getattr(row, name) for row in reversed(rows) if _finite(getattr(row, name))), None)


def _best(rows: list[MetricRow], name: str) -> tuple[float | None, int | None]:
    finite = [(getattr(row, name), row.step) for row in rows if _finite(getattr(row, name))]
    return min(finite) if finite else (None, None)


def bounded(figures: RunFigures) -> RunFigures:
    """`figures` as a tool result carries them: the first `MAX_ANOMALIES` anomalies (reports list all)."""
    return figures.model_copy(update={"anomalies": figures.anomalies[:MAX_ANOMALIES]})
