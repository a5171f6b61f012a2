"""read_metrics: a run's rows as bounded series, downsampled keeping what matters, zoomed by step range, and a
summary of every row. The runs are metrics files written as a trainer writes them (runs_helpers.metric_rows)."""

import itertools
import json
from typing import get_args

import pytest
from runs_helpers import STEPS, TOKENS_PER_STEP, metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.runs import RunRecord
from tradewind.tools import (
    ListRunsRequest,
    ReadMetricsRequest,
    RunRequest,
    SummarizeReportRequest,
    TailLogsRequest,
    ToolContext,
    get_run,
    list_runs,
    read_metrics,
    summarize_report,
    tail_logs,
)
from tradewind.tools.metrics import MetricName

ALL_SERIES = list(get_args(MetricName))


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_read_metrics_keeps_the_first_last_lowest_loss_and_every_eval_row_and_is_deterministic(fresh):
    rows = metric_rows()
    write_run(fresh, "run-curve", rows)
    request = ReadMetricsRequest(run_id="run-curve", series=["loss", "eval_loss"], max_points=200)
    result = read_metrics(fresh, request)
    assert result == read_metrics(fresh, request)
    loss_steps = result.series["loss"].steps
    assert len(loss_steps) <= 200 and result.rows_kept == 200 and result.truncated
    assert result.start_step == 0 and result.end_step == STEPS
    assert loss_steps[0] == 1 and loss_steps[-1] == STEPS and 1234 in loss_steps  # first logged, last, lowest
    eval_steps = [row.step for row in rows if row.eval_loss is not None]
    assert result.series["eval_loss"].steps == eval_steps  # every eval row
    assert result.series["loss"].values[loss_steps.index(1234)] == pytest.approx(rows[1234].loss, rel=1e-5)
    # The rest are spread over the whole run, not bunched at its start.
    assert max(b - a for a, b in itertools.pairwise(loss_steps)) <= 2 * STEPS // 200


def test_read_metrics_with_more_eval_rows_than_max_points_keeps_evenly_spaced_ones_and_the_best(fresh):
    rows = metric_rows(eval_every=1)
    write_run(fresh, "run-evals", rows)
    result = read_metrics(fresh, ReadMetricsRequest(run_id="run-evals", series=["eval_loss"], max_points=50))
    steps = result.series["eval_loss"].steps
    assert len(steps) == 50 and {0, 1234, 2000, STEPS} <= set(steps)  # first, lowest loss, best eval, last


def test_read_metrics_zoomed_into_a_step_range_returns_every_row_there(fresh):
    rows = metric_rows()
    write_run(fresh, "run-zoom", rows)
    result = read_metrics(
        fresh, ReadMetricsRequest(run_id="run-zoom", series=ALL_SERIES[:5], start_step=1000, end_step=1150)
    )
    assert not result.truncated and result.hint is None and result.rows_in_range == result.rows_kept == 151
    assert result.series["loss"].steps == list(range(1000, 1151))
    assert result.series["lr"].values == [float(f"{row.lr:.6g}") for row in rows[1000:1151]]


def test_read_metrics_summary_is_what_the_raw_rows_say(fresh):
    rows = metric_rows()
    write_run(fresh, "run-summary", rows)
    summary = read_metrics(fresh, ReadMetricsRequest(run_id="run-summary", start_step=10, end_step=20)).summary
    best = min((row for row in rows if row.eval_loss is not None), key=lambda row: row.eval_loss)
    logged = [row for row in rows if row.step_time_s is not None]  # one update per row here
    seconds = sum(row.step_time_s for row in logged)
    assert summary.rows == len(rows) and summary.last_step == STEPS
    assert summary.last_loss == pytest.approx(rows[-1].loss, rel=1e-5)
    assert summary.best_eval_step == best.step == 2000
    assert summary.best_eval_loss == pytest.approx(best.eval_loss, rel=1e-5)
    assert summary.mean_tokens_per_s == pytest.approx(len(logged) * TOKENS_PER_STEP / seconds, rel=1e-5)
    assert summary.mean_mfu == pytest.approx(sum(r.mfu * r.step_time_s for r in logged) / seconds, rel=1e-5)


@pytest.mark.slow
def test_read_metrics_summary_agrees_with_the_trainers_summary_of_a_finished_run(ctx, finished_run):
    summary = read_metrics(ctx, ReadMetricsRequest(run_id=finished_run.run_id)).summary
    assert summary.mean_tokens_per_s == pytest.approx(finished_run.summary.mean_tokens_per_s, rel=1e-5)
    assert summary.mean_mfu == pytest.approx(finished_run.summary.mfu, rel=1e-5)
    assert summary.best_eval_loss == pytest.approx(finished_run.summary.best_eval_loss, rel=1e-5)
    assert summary.last_step == finished_run.total_steps


def test_read_metrics_refuses_a_step_range_that_ends_before_it_starts():
    with pytest.raises(ValueError, match="start_step 9 is after end_step 3"):
        ReadMetricsRequest(run_id="run-x", start_step=9, end_step=3)


def test_a_corrupt_metrics_row_is_skipped_and_named_with_its_file_and_line_by_every_tool_that_reads_it(fresh):
    # The measured defect: one row with an extra key made get_run, tail_logs, read_metrics and summarize_report fail
    # with "elapsed: Field required / note: Extra inputs are not permitted", naming no file, and list_runs show
    # pydantic's raw dump of it.
    record = RunRecord(run_id="run-torn", backend="process", status=JobStatus.SUCCEEDED)
    layout = write_run(fresh, "run-torn", metric_rows(steps=20), record)
    lines = layout.metrics.read_text().splitlines(keepends=True)
    lines[2:2] = ['{"step": 2, "note": "tw-marker-note"}\n', "not json\n"]
    layout.metrics.write_text("".join(lines))
    expected = [
        "run-torn/metrics.jsonl:3: elapsed: Field required; note: Extra inputs are not permitted",
        "run-torn/metrics.jsonl:4: (top level): Invalid JSON: expected ident at line 1 column 2",
    ]
    info = get_run(fresh, RunRequest(run_id="run-torn"))
    assert info.step == 20 and info.skipped_rows == expected
    metrics = read_metrics(fresh, ReadMetricsRequest(run_id="run-torn"))
    assert metrics.summary.rows == 21 and metrics.skipped_rows == expected
    assert tail_logs(fresh, TailLogsRequest(run_id="run-torn")).status == "SUCCEEDED"
    report = summarize_report(fresh, SummarizeReportRequest(run_id="run-torn", sample=False))
    assert report.runs[0].steps == 20 and report.runs[0].skipped_rows == expected
    listing = list_runs(fresh, ListRunsRequest())
    assert [run.run_id for run in listing.runs] == ["run-torn"] and listing.unreadable == []


def test_more_corrupt_rows_than_are_named_are_counted():
    from tradewind.runs.metrics import MAX_ROW_PROBLEMS, MetricLog

    log = MetricLog(skipped=MAX_ROW_PROBLEMS + 7, problems=[f"m.jsonl:{n}: bad" for n in range(MAX_ROW_PROBLEMS)])
    assert log.skipped_rows()[-1] == "... and 7 more rows skipped"


def test_list_runs_says_which_file_and_field_of_an_unreadable_run_is_wrong_without_a_raw_validation_dump(fresh):
    record = RunRecord(run_id="run-bad-summary", backend="process", status=JobStatus.SUCCEEDED)
    layout = write_run(fresh, "run-bad-summary", metric_rows(steps=5), record)
    summary = {"parameters": 1, "steps": "tw-marker-value", "tokens_seen": 1, "final_loss": None, "extra": 1}
    summary.update(first_eval_loss=None, final_eval_loss=None, best_eval_loss=None, mean_tokens_per_s=None)
    layout.summary.write_text(json.dumps({**summary, "compile_s": 1.0, "wall_s": 2.0}))
    (reason,) = [entry.reason for entry in list_runs(fresh, ListRunsRequest()).unreadable]
    assert reason == (
        "summary.json: steps: Input should be a valid integer, unable to parse string as an integer; "
        "summary.json: extra: Extra inputs are not permitted"
    )
