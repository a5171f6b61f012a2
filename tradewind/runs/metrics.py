"""What a training run reports: the rows of `metrics.jsonl` and the `summary.json` written at the end.

This module imports no JAX, so tools can read a run's progress while it trains, from another process.

Rows of `metrics.jsonl`, one JSON object per line, in step order:

- step 0 carries `eval_loss` only: the loss of the freshly initialised model;
- every `log_every` steps and at the last step, a row carries the training fields (`loss`, `lr`,
  `grad_norm`, `tokens_per_s`);
- every `eval_every` steps and at the last step, a row carries `eval_loss` (and `eval_perplexity`,
  `eval_bits_per_byte` when the dataset records its text's byte count);
- log rows also carry `param_norm`, `step_time_s`, `mfu` and, when updates were dropped under
  `on_nonfinite="skip"`, `skipped_steps`.

A resumed run first drops the rows past the checkpoint it resumed from, then goes on appending.

A step that is both a log step and an eval step has one row with both; fields that do not apply are left
out of the JSON rather than written as null. Readers skip a row that is not a `MetricRow` (a hand edit, a
torn write) and name it with its file and line (`load_metrics`), so one bad row hides no run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tradewind.core import ConfigError, describe_validation_error, parse_config, read_json
from tradewind.core.files import Opener, open_plain
from tradewind.core.storage import complete_lines

if TYPE_CHECKING:
    from tradewind.runs.config import TrainConfig

MAX_ROW_PROBLEMS = 5  # skipped rows named one by one; the rest are counted


class MetricRow(BaseModel):
    """One line of `metrics.jsonl`: what was measured after `step` optimizer updates."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="Optimizer updates done when this row was written (0 = before training).")
    loss: float | None = Field(None, description="Mean training loss over the updates since the previous log row.")
    eval_loss: float | None = Field(None, description="Mean loss on the fixed val batches after `step` updates.")
    lr: float | None = Field(None, description="Learning rate of the latest update.")
    grad_norm: float | None = Field(
        None, description="Global L2 norm of the latest update's gradient, before clipping."
    )
    tokens_per_s: float | None = Field(
        None, description="Training tokens (not padding) per second since the previous row, evaluation excluded."
    )
    param_norm: float | None = Field(None, description="Global L2 norm of the parameters after the latest update.")
    step_time_s: float | None = Field(None, description="Mean seconds per update since the previous log row.")
    mfu: float | None = Field(
        None,
        description=(
            "Model FLOPs utilisation (0 to 1): training tokens/s x model FLOPs per token over the devices' peak "
            "FLOP/s. Per token: 6 a matmul weight (4 a LoRA run's frozen weight, whose gradient is not computed) "
            "+ 12 x layers x heads x head_dim x seq_len for attention; packed documents' padding is not a token."
        ),
    )
    skipped_steps: int | None = Field(None, description="Updates dropped for a non-finite loss since the last row.")
    eval_perplexity: float | None = Field(None, description="exp(eval_loss).")
    eval_bits_per_byte: float | None = Field(
        None, description="eval_loss in bits per UTF-8 byte of val text (comparable across tokenizers)."
    )
    elapsed: float = Field(description="Seconds since the run started, compilation included.")


class TrainSummary(BaseModel):
    """`summary.json`: the outcome of a finished training run."""

    model_config = ConfigDict(extra="forbid")

    parameters: int = Field(description="Number of trainable parameters.")
    steps: int = Field(description="Optimizer updates done.")
    tokens_seen: int = Field(description="Training tokens predicted: steps * batch_size * seq_len.")
    final_loss: float | None = Field(
        description="Mean training loss over the last log interval (null if no loss in it was finite)."
    )
    first_eval_loss: float | None = Field(description="Val loss before the first update.")
    final_eval_loss: float | None = Field(description="Val loss after the last update.")
    best_eval_loss: float | None = Field(description="Lowest val loss of the run.")
    mean_tokens_per_s: float | None = Field(
        description="Training tokens per second of step time (no compile, no eval), over the logged steps."
    )
    compile_s: float = Field(description="Seconds spent compiling the train and eval steps.")
    wall_s: float = Field(description="Seconds the whole run took, from reading the data to the last write.")
    model_flops_per_token: float | None = Field(
        None, description="Forward + backward, attention included: 6 a matmul weight, 4 a LoRA run's frozen one."
    )
    mfu: float | None = Field(None, description="Mean model FLOPs utilisation over the run's step time (as a row's).")
    peak_flops: float | None = Field(None, description="Peak FLOP/s of all devices together, used for `mfu`.")
    peak_flops_source: str | None = Field(None, description="Where the peak FLOP/s figure came from.")
    final_eval_perplexity: float | None = Field(None, description="exp(final_eval_loss).")
    final_eval_bits_per_byte: float | None = Field(None, description="final_eval_loss in bits per UTF-8 byte.")
    resumed_from_step: int | None = Field(None, description="Checkpoint step this run resumed from, if it did.")
    skipped_steps: int | None = Field(None, description="Updates dropped for non-finite losses (skip policy).")
    train_s: float | None = Field(None, description="Seconds of training: the updates and what the loop did between.")
    time_budget_s: float | None = Field(None, description="The run's training budget, if it had one.")
    budget_kind: Literal["tokens", "flops", "time", "steps"] | None = Field(
        None, description="What fixed the run's length (`TrainConfig.budget`)."
    )
    budget: float | None = Field(None, description="Its size: tokens, FLOPs, seconds or steps.")
    budget_met: bool | None = Field(
        None, description="A token or FLOP budget: all its steps done (false: the time cap ran out first)."
    )
    val_loss: float | None = Field(None, description="Final loss on the dataset's fixed val tokens (`val_tokens`).")
    val_bpb: float | None = Field(None, description="val_loss in bits per UTF-8 byte of the text those tokens are.")
    val_tokens: int | None = Field(None, description="Val tokens scored for val_loss and val_bpb.")
    val_s: float | None = Field(None, description="Seconds the final evaluation on the fixed val tokens took.")
    first_update_s: float | None = Field(
        None, description="Seconds from this attempt's start (its process's, for a job) to its first update's end."
    )
    startup_s: dict[str, float] | None = Field(
        None, description="Those seconds by stage: imports, devices, data, model, compile, first eval, first update."
    )
    step_memory_bytes: int | None = Field(
        None, description="Device memory the compiled train step needs on each device (XLA's memory analysis)."
    )
    device_memory_bytes: int | None = Field(
        None, description="Memory of one device, as JAX reports it (a TPU chip's HBM); null on the CPU."
    )


class OpTime(BaseModel):
    """One XLA op or fusion of the profiler trace and the time it took over the traced steps."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The op as the trace names it, e.g. 'ynn_fusion.134'.")
    category: str = Field(description="The name without its numeric suffix, e.g. 'ynn_fusion'.")
    total_ms: float = Field(description="Milliseconds it ran over all traced steps.")
    count: int = Field(description="Times it ran.")
    share: float = Field(description="Its fraction of all op time in the trace.")


class PartTime(BaseModel):
    """One part of the model (a named scope of the step, `MODEL_PARTS`), or the host and idle time."""

    part: str
    seconds: float = Field(description="Device seconds per step.")
    share: float = Field(description="Of the step's time.")
    mfu_lost: float = Field(description="(seconds - its FLOPs at the peak) / step time; the parts' sum is 1 - MFU.")


Verdict = Literal["data-bound", "host-bound", "recompiling", "checkpoint-bound", "compute-bound"]


class StepSplit(BaseModel):
    """Where the traced steps' time went, as shares of it (summing to 1), measured in the loop for each step."""

    compute: float = Field(description="Blocked on the device's result.")
    data_wait: float = Field(description="Reading and placing the next batch.")
    host: float = Field(description="The rest: dispatch and Python.")
    checkpoint: float = Field(description="Saving checkpoints (0 when profiling: it saves none).")


class CheckedChange(BaseModel):
    """A change to the run's config, timed for a few steps beside the profiled step."""

    change: dict[str, Any] = Field(description="The config fields changed, e.g. {'batch_size': 32, 'model.n_heads': 4}")
    tokens_per_s: float | None = Field(description="Its training tokens per second; null when it did not run.")
    speedup: float | None = Field(description="Its tokens/s over the profiled step's.")
    error: str | None = Field(default=None, description="Why it did not run (e.g. out of memory).")


class Diagnosis(BaseModel):
    """What limits the step, the numbers that say so, and one change to try first."""

    verdict: Verdict
    evidence: str
    suggestion: str
    checked: list[CheckedChange] = Field(default_factory=list, description="Changes timed before suggesting one.")


class ProfileSummary(BaseModel):
    """`profile/summary.json`: step timing measured under the JAX profiler, where it goes, and a verdict.

    Fields after `backend` are absent from summaries written before they existed.
    """

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(description="Train steps timed (after compilation).")
    compile_s: float = Field(description="Seconds spent compiling the train and eval steps.")
    mean_step_s: float = Field(description="Mean seconds per train step, waiting for each to finish.")
    tokens_per_s: float = Field(description="Training tokens per second at that step time.")
    parameters: int = Field(description="Number of trainable parameters.")
    trace_dir: str = Field(description="Folder of the profiler trace (open it with TensorBoard's profile plugin).")
    backend: str = Field(description="JAX backend the steps ran on: 'cpu', 'gpu' or 'tpu'.")
    start_step: int = Field(default=2, description="First traced step.")
    median_step_s: float | None = Field(default=None, description="Median seconds per traced step.")
    first_step_s: float | None = Field(default=None, description="Seconds of the first traced step.")
    split: StepSplit | None = Field(
        default=None, description="Shares of the step: compute, data wait, host, checkpoint."
    )
    compiles: int | None = Field(default=None, description="XLA compilations during the traced steps.")
    top_ops: list[OpTime] = Field(default_factory=list, description="The 10 ops that took longest in the trace.")
    trace_file: str | None = Field(default=None, description="The trace as Chrome-trace JSON (Perfetto opens it).")
    peak_memory_bytes: int | None = Field(default=None, description="Peak memory, as `peak_memory_source` says.")
    peak_memory_source: str | None = Field(
        default=None, description="'device peak_bytes_in_use' or 'process peak RSS' (host memory, on CPU)."
    )
    mfu: float | None = Field(default=None, description="Model FLOP utilisation at the mean step time.")
    diagnosis: Diagnosis | None = Field(default=None, description="The verdict, its evidence and one suggestion.")
    parts: list[PartTime] = Field(default_factory=list, description="Time per model part, most MFU lost first.")
    kinds: dict[str, float] = Field(default_factory=dict, description="Device seconds per step by kind of op.")


def logged_updates(rows: list[MetricRow]) -> list[tuple[int, MetricRow]]:
    """Each row with a step time, and the updates it covers (since the row before it)."""
    logged = [row for row in rows if row.step_time_s is not None]
    return [(row.step - previous.step, row) for previous, row in zip([rows[0], *logged], logged, strict=False)]


def train_seconds(rows: list[MetricRow]) -> float:
    """Seconds of updates the rows cover: each row's mean step time times the updates it covers."""
    return sum(updates * row.step_time_s for updates, row in logged_updates(rows))


def planned_steps(config: TrainConfig, rows: list[MetricRow]) -> int:
    """The updates a run of `config` makes: those its steps or work budget fix (`config.total_steps`). With a
    time budget, an estimate from its rows so far, the last row's step plus the updates that fit in the budget
    left at its step time (at least the step it has reached), and no more than a work budget's steps, which the
    time only caps."""
    total = config.total_steps
    reached = rows[-1].step if rows else 0
    timed = [row for row in rows if row.step_time_s]
    if config.time_budget_s and timed:
        left = max(0.0, config.time_budget_s - train_seconds(rows))
        fitting = reached + int(left / timed[-1].step_time_s)
        return fitting if total is None else min(total, fitting)
    return reached if total is None else total  # before its speed is known, a time cap cuts nothing


@dataclass
class MetricLog:
    """The rows of a `metrics.jsonl` that are `MetricRow`s, and those skipped because they are not."""

    rows: list[MetricRow] = field(default_factory=list)
    skipped: int = 0
    problems: list[str] = field(default_factory=list)  # 'file:line: what was wrong', the first MAX_ROW_PROBLEMS

    def skipped_rows(self) -> list[str]:
        """The skipped rows as a result reports them: each named, then how many more there were."""
        more = self.skipped - len(self.problems)
        return [*self.problems, *([f"... and {more} more rows skipped"] if more else [])]


def load_metrics(path: str | os.PathLike[str], opener: Opener = open_plain) -> MetricLog:
    """Read the complete rows of a `metrics.jsonl`, opened with `opener`; a last line still being written is left
    out, and a line that is not a `MetricRow` is skipped and counted (the first few named with file and line).

    An empty log when the file does not exist yet (the run has not logged anything).
    """
    path = Path(path)
    log = MetricLog()
    for number, line in complete_lines(path, opener):
        try:
            log.rows.append(MetricRow.model_validate_json(line))
        except ValidationError as error:
            log.skipped += 1
            if len(log.problems) < MAX_ROW_PROBLEMS:
                problems = describe_validation_error(error, f"{path.parent.name}/{path.name}:{number}").splitlines()
                # one line per row: 'run-x/metrics.jsonl:7: elapsed: Field required; note: Extra inputs ...'
                log.problems.append(problems[0] + "".join(f"; {p.partition(': ')[2]}" for p in problems[1:]))
    return log


def read_metrics(path: str | os.PathLike[str], opener: Opener = open_plain) -> list[MetricRow]:
    """The rows of a `metrics.jsonl` (see `load_metrics`, which also tells of the rows skipped)."""
    return load_metrics(path, opener).rows


def read_summary(path: str | os.PathLike[str], opener: Opener = open_plain) -> TrainSummary | None:
    """Read a run's `summary.json` (opened with `opener`), or None if the run has not finished.

    Raises:
        ConfigError: it is not a summary; the message names the file and each bad field.
    """
    if not os.path.exists(path):
        return None
    try:
        data = read_json(path, opener)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    return parse_config(TrainSummary, data, source=str(path))
