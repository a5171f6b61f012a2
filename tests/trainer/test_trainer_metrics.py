"""Reading a run's metrics and summary while it trains or after it has finished."""

import json

from tradewind.runs import MetricRow, TrainConfig, TrainSummary, read_metrics, read_summary
from tradewind.runs.metrics import planned_steps


def test_read_metrics_returns_complete_rows_and_skips_a_half_written_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "eval_loss": 5.5, "elapsed": 1.0}, {"step": 10, "loss": 4.0, "lr": 0.01, "elapsed": 2.0}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 20, "lo', encoding="utf-8")
    assert read_metrics(path) == [
        MetricRow(step=0, eval_loss=5.5, elapsed=1.0),
        MetricRow(step=10, loss=4.0, lr=0.01, elapsed=2.0),
    ]


def test_read_metrics_of_a_run_that_has_not_logged_yet_is_empty(tmp_path):
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_read_summary_is_none_until_the_summary_exists(tmp_path):
    path = tmp_path / "summary.json"
    assert read_summary(path) is None
    summary = TrainSummary(
        parameters=10,
        steps=2,
        tokens_seen=64,
        final_loss=3.0,
        first_eval_loss=5.0,
        final_eval_loss=3.5,
        best_eval_loss=3.5,
        mean_tokens_per_s=100.0,
        compile_s=1.0,
        wall_s=2.0,
    )
    path.write_text(summary.model_dump_json(), encoding="utf-8")
    assert read_summary(path) == summary


def test_a_budgeted_runs_planned_steps_are_what_fits_in_the_budget_left_at_its_latest_step_time():
    rows = [
        MetricRow(step=0, eval_loss=5.0, elapsed=1.0),
        MetricRow(step=10, loss=4.0, step_time_s=0.2, elapsed=3.0),  # 2 s of updates
        MetricRow(step=20, loss=3.0, step_time_s=0.1, elapsed=4.0),  # 1 s more
    ]

    def config(**length):
        return TrainConfig(dataset="data", **length)

    assert planned_steps(config(steps=200), rows) == 200  # a run of steps makes its steps
    assert planned_steps(config(time_budget_s=10.0), rows) == 20 + 70  # 7 s left at 0.1 s a step
    assert planned_steps(config(time_budget_s=2.0), rows) == 20  # spent: at least the step reached
    assert planned_steps(config(time_budget_s=10.0), rows[:1]) == 0  # no step time yet
