"""The anomaly detector reports, comparisons and read_metrics share: spikes, non-finite values, stalls,
restarts and resumes, each with its step, by the rules in `tradewind.tools.anomalies`."""

import math

import pytest
from runs_helpers import metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.runs import MetricRow, RunRecord
from tradewind.tools import ReadMetricsRequest, ToolContext, detect_anomalies, read_metrics
from tradewind.tools.anomalies import MAX_ANOMALIES, failure_anomaly


def log_row(step: int, loss: float | None = 2.0, **fields) -> MetricRow:
    """A log row as the trainer writes it (a non-finite loss is left out: None)."""
    values = (
        dict(step=step, loss=loss, lr=1e-3, grad_norm=1.0, param_norm=10.0, tokens_per_s=1000.0, step_time_s=0.1)
        | fields
    )
    return MetricRow(elapsed=step * 0.1, **values)


def kinds(anomalies) -> list[tuple[str, int]]:
    return [(anomaly.kind, anomaly.step) for anomaly in anomalies]


def test_a_smooth_run_has_no_anomalies():
    assert detect_anomalies(metric_rows(steps=400)) == []
    assert detect_anomalies([log_row(step, loss=5.0 / step) for step in range(1, 60)]) == []


def test_a_loss_jump_after_warm_up_is_a_spike_at_its_step_and_a_small_wobble_is_not():
    losses = [3.0 - 0.01 * i for i in range(30)]
    losses[25] = 4.5  # far above the median of the 20 before, and 1.2x it
    losses[12] = losses[11] * 1.1  # above median + 4 MAD, but under 1.2x the median: noise
    rows = [log_row(step, loss) for step, loss in enumerate(losses, start=1)]
    (spike,) = detect_anomalies(rows)
    assert (spike.kind, spike.step) == ("loss_spike", 26) and "median" in spike.detail


def test_the_first_losses_are_warm_up_and_never_spikes():
    rows = [log_row(step, loss) for step, loss in enumerate([2.0, 2.0, 9.0, 2.0, 9.0], start=1)]
    assert detect_anomalies(rows) == []


def test_skipped_steps_and_dropped_figures_are_non_finite_at_their_steps():
    rows = [
        log_row(5),
        log_row(10, loss=None, skipped_steps=3),  # the skip policy dropped updates; their loss was NaN
        log_row(15, grad_norm=None),  # the trainer dropped a non-finite grad norm
        MetricRow(step=20, eval_loss=2.0, elapsed=3.0),  # an eval-only row lacks training fields: fine
    ]
    found = detect_anomalies(rows)
    assert kinds(found) == [("non_finite", 10), ("non_finite", 15)]
    assert "3 update(s) dropped" in found[0].detail and "grad_norm" in found[1].detail
    nan = MetricRow.model_construct(step=25, loss=math.nan, elapsed=4.0)  # a NaN that reached a row
    assert kinds(detect_anomalies([nan])) == [("non_finite", 25)]


def test_a_step_five_times_slower_than_the_median_and_a_second_over_it_is_a_stall():
    rows = [log_row(step, step_time_s=0.3) for step in range(1, 9)] + [log_row(9, step_time_s=1.6)]
    assert kinds(detect_anomalies(rows)) == [("stall", 9)]
    assert detect_anomalies([log_row(1, step_time_s=0.1), log_row(2, step_time_s=9.0)]) == []  # too few rows
    # A 4 ms step that a busy machine delayed to 22 ms is six times slower but no stall.
    busy = [log_row(step, step_time_s=0.0036) for step in range(1, 9)] + [log_row(9, step_time_s=0.022)]
    assert detect_anomalies(busy) == []


def test_the_non_finite_loss_that_stopped_a_run_is_an_anomaly_at_its_step_once():
    rows = [log_row(step) for step in (5, 10)]
    stopped = failure_anomaly("training loss became nan at step 13; lower optimizer.learning_rate")
    assert kinds(detect_anomalies(rows, stopped=stopped)) == [("non_finite", 13)]
    assert kinds(detect_anomalies([*rows, log_row(13, loss=math.nan)], stopped=stopped)) == [("non_finite", 13)]


def test_steps_going_back_or_elapsed_going_back_are_restarts_and_a_parent_is_a_resume():
    rows = [log_row(5), log_row(10), log_row(10), log_row(15), log_row(20).model_copy(update={"elapsed": 0.5})]
    assert kinds(detect_anomalies(rows)) == [("restart", 10), ("restart", 20)]
    (resume,) = detect_anomalies([log_row(25)], parent="run-a", parent_step=20)
    assert (resume.kind, resume.step) == ("resume", 20) and "run-a" in resume.detail


def test_the_non_finite_loss_that_stopped_a_run_is_read_from_its_log_line():
    line = "TradewindError: training loss became nan at step 7; lower optimizer.learning_rate, add warmup"
    stopped = failure_anomaly(line)
    assert (stopped.kind, stopped.step, stopped.detail) == ("non_finite", 7, "training loss became nan")
    assert failure_anomaly("exited with code 1") is None and failure_anomaly(None) is None


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_read_metrics_summary_lists_the_anomalies_first_ones_first_bounded(fresh):
    rows = [log_row(step, loss=None, skipped_steps=1) for step in range(1, 31)]
    record = RunRecord(run_id="run-bad", backend="process", status=JobStatus.FAILED, parent="run-a", parent_step=0)
    write_run(fresh, "run-bad", rows, record)
    summary = read_metrics(fresh, ReadMetricsRequest(run_id="run-bad")).summary
    assert len(summary.anomalies) == MAX_ANOMALIES
    assert kinds(summary.anomalies)[:3] == [("resume", 0), ("non_finite", 1), ("non_finite", 2)]
    write_run(fresh, "run-fine", metric_rows(steps=100))
    assert read_metrics(fresh, ReadMetricsRequest(run_id="run-fine")).summary.anomalies == []
