"""What went wrong in a run, read from its metrics rows: the one detector reports, comparisons and
`read_metrics` share.

Rules (each finds rows in `metrics.jsonl` order):

- `loss_spike`: a training loss above both the median of the previous `SPIKE_WINDOW` (20) losses plus
  `SPIKE_MADS` (4) times their median absolute deviation, and `SPIKE_RATIO` (1.2) times that median. Only once
  `SPIKE_WARMUP` (5) losses came before it (the first ones fall fast and would all look like spikes).
- `non_finite`: a row that counts `skipped_steps` (updates dropped for a NaN/inf loss under
  `on_nonfinite: skip`), a log row (one with `tokens_per_s`) whose loss or grad norm is missing
  (the trainer drops a non-finite figure rather than write NaN), or a NaN/inf figure in a row. A run stopped by
  a non-finite loss (`on_nonfinite: stop`) never writes that row; `failure_anomaly` reads the step from the
  run's reason or log instead.
- `stall`: a row whose `step_time_s` is over `STALL_RATIO` (5) times the median step time of the run's rows
  and at least `STALL_MIN_S` (1 s) over it: a millisecond step that a busy machine delays is no stall (needs
  `STALL_MIN_ROWS`, 4, rows with a step time).
- `restart`: a step that is not after the previous row's (steps logged again), or `elapsed` that went back
  (the process started again, from a checkpoint, between the two rows).
- `resume`: the run continues another from one of its checkpoints (`parent` and `parent_step` of its record).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from typing import Literal

from pydantic import BaseModel

from tradewind.runs import MetricRow

SPIKE_WINDOW = 20
SPIKE_MADS = 4.0
SPIKE_RATIO = 1.2
SPIKE_WARMUP = 5
STALL_RATIO = 5.0
STALL_MIN_ROWS = 4
STALL_MIN_S = 1.0
MAX_ANOMALIES = 20  # in a tool result; a report lists them all

AnomalyKind = Literal["loss_spike", "non_finite", "stall", "restart", "resume"]
_LOG_FIELDS = ("loss", "grad_norm")  # every log row has them; param_norm came later
_NON_FINITE = re.compile(r"loss became (nan|inf|-inf) at step (\d+)", re.IGNORECASE)


class Anomaly(BaseModel):
    kind: AnomalyKind
    step: int
    detail: str


def detect_anomalies(
    rows: list[MetricRow],
    *,
    parent: str | None = None,
    parent_step: int | None = None,
    stopped: Anomaly | None = None,
) -> list[Anomaly]:
    """Every anomaly the rules above find in `rows`, the resume a record's `parent` tells of, and the non-finite
    loss that `stopped` a failed run (`failure_anomaly` of its reason: its row was never written), by step."""
    found: list[Anomaly] = []
    if parent is not None:
        where = f"its step {parent_step} checkpoint" if parent_step is not None else "its checkpoint"
        found.append(Anomaly(kind="resume", step=parent_step or 0, detail=f"continues run {parent} from {where}"))
    found += _restarts(rows) + _non_finite(rows) + _spikes(rows) + _stalls(rows)
    if stopped is not None and all((a.kind, a.step) != (stopped.kind, stopped.step) for a in found):
        found.append(stopped)
    return sorted(found, key=lambda anomaly: anomaly.step)


def failure_anomaly(text: str | None) -> Anomaly | None:
    """The non-finite loss that stopped a run, from its reason or log text: 'loss became nan at step 5'."""
    match = _NON_FINITE.search(text or "")
    if match is None:
        return None
    return Anomaly(kind="non_finite", step=int(match.group(2)), detail=f"training loss became {match.group(1)}")


def _restarts(rows: list[MetricRow]) -> list[Anomaly]:
    found = []
    for before, row in itertools.pairwise(rows):
        if row.step <= before.step:
            found.append(Anomaly(kind="restart", step=row.step, detail=f"step went from {before.step} to {row.step}"))
        elif row.elapsed < before.elapsed:
            found.append(
                Anomaly(
                    kind="restart",
                    step=row.step,
                    detail=f"elapsed went from {before.elapsed:.1f} s to {row.elapsed:.1f} s: the process restarted",
                )
            )
    return found


def _non_finite(rows: list[MetricRow]) -> list[Anomaly]:
    found = []
    for row in rows:
        values = row.model_dump().items()
        bad = [name for name, value in values if isinstance(value, float) and not math.isfinite(value)]
        if row.tokens_per_s is not None:
            bad += [name for name in _LOG_FIELDS if getattr(row, name) is None and name not in bad]
        if row.skipped_steps:
            detail = f"{row.skipped_steps} update(s) dropped, loss not finite"
            found.append(Anomaly(kind="non_finite", step=row.step, detail=detail))
        elif bad:
            found.append(Anomaly(kind="non_finite", step=row.step, detail=f"not finite: {', '.join(bad)}"))
    return found


def _spikes(rows: list[MetricRow]) -> list[Anomaly]:
    found, previous = [], []
    for row in rows:
        loss = row.loss
        if loss is None or not math.isfinite(loss):
            continue
        window = previous[-SPIKE_WINDOW:]
        if len(previous) >= SPIKE_WARMUP:
            median = statistics.median(window)
            mad = statistics.median(abs(value - median) for value in window)
            if loss > median + SPIKE_MADS * mad and loss > SPIKE_RATIO * median:
                detail = f"loss {loss:.4g} over {median:.4g}, the median of the {len(window)} losses before"
                found.append(Anomaly(kind="loss_spike", step=row.step, detail=detail))
        previous.append(loss)
    return found


def _stalls(rows: list[MetricRow]) -> list[Anomaly]:
    times = [row.step_time_s for row in rows if row.step_time_s is not None and math.isfinite(row.step_time_s)]
    if len(times) < STALL_MIN_ROWS:
        return []
    median = statistics.median(times)
    return [
        Anomaly(
            kind="stall",
            step=row.step,
            detail=f"{row.step_time_s:.3g} s per step, over {STALL_RATIO:g}x the median {median:.3g} s",
        )
        for row in rows
        if row.step_time_s is not None and row.step_time_s > max(STALL_RATIO * median, median + STALL_MIN_S)
    ]
