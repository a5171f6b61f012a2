"""compare_runs: the config fields that differ, each run's figures and anomalies, losses overlaid against
tokens seen, and the better run at equal tokens."""

from pathlib import Path

import pytest

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, atomic_write_json
from tradewind.tools import CompareRunsRequest, ToolContext, compare_runs
from tradewind.tools.report_data import flatten
from tradewind.trainer import MetricRow, RunLayout, RunRecord, TrainConfig, write_record


def write_run(ctx: ToolContext, run_id: str, rows: list[MetricRow], **config) -> None:
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    write_record(layout.record, RunRecord(run_id=run_id, backend="process", status=JobStatus.SUCCEEDED))
    settings = {"dataset": "datasets/ds-x", "steps": 30, "batch_size": 8, "seq_len": 32} | config
    atomic_write_json(layout.config, TrainConfig(**settings).model_dump(mode="json"))
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))


def rows(losses: dict[int, float], evals: dict[int, float]) -> list[MetricRow]:
    steps = sorted(set(losses) | set(evals))
    return [MetricRow(step=s, loss=losses.get(s), eval_loss=evals.get(s), elapsed=float(s)) for s in steps]


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_flatten_names_nested_fields_with_dots():
    assert flatten({"a": 1, "optimizer": {"learning_rate": 0.1, "betas": {"b1": 0.9}}, "empty": {}}) == {
        "a": 1,
        "optimizer.learning_rate": 0.1,
        "optimizer.betas.b1": 0.9,
        "empty": {},
    }


def test_two_runs_differ_in_exactly_the_fields_their_configs_set_differently(fresh):
    curve = rows({10: 3.0, 20: 2.5}, {0: 5.0, 20: 2.6})
    write_run(fresh, "run-a", curve, optimizer={"learning_rate": 1e-3})
    write_run(fresh, "run-b", curve, optimizer={"learning_rate": 3e-3}, model={"n_layers": 6})
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-a", "run-b"]))
    assert result.config_differences == {
        "model.n_layers": {"run-a": 4, "run-b": 6},
        "optimizer.learning_rate": {"run-a": 1e-3, "run-b": 3e-3},
    }
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "| optimizer.learning_rate | `0.001` | `0.003` |" in markdown
    assert "| model.n_layers | `4` | `6` |" in markdown
    table = markdown.split("## Config differences")[1].split("## Results")[0]
    assert len([line for line in table.splitlines() if line.startswith("| ") and "field" not in line]) == 2


def test_the_better_run_is_chosen_at_the_most_tokens_every_run_reached(fresh):
    # run-long trains twice as far and ends lower, but at the tokens run-short reached it was behind.
    write_run(fresh, "run-short", rows({10: 3.0, 20: 2.4}, {0: 5.0, 20: 2.5}), steps=20)
    write_run(fresh, "run-long", rows({10: 3.2, 20: 2.8, 40: 2.0}, {0: 5.0, 20: 2.9, 40: 2.1}), steps=40)
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-long", "run-short"]))
    assert result.at_tokens == 20 * 8 * 32
    assert result.values == {"run-long": 2.9, "run-short": 2.5} and result.best_run == "run-short"
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "Compared on eval_loss at 5,120 tokens seen" in markdown and "**run-short** is better" in markdown
    by_loss = compare_runs(fresh, CompareRunsRequest(run_ids=["run-long", "run-short"], metric="loss"))
    assert by_loss.values == {"run-long": 2.8, "run-short": 2.4} and by_loss.best_run == "run-short"
    assert [run.run_id for run in result.runs] == ["run-long", "run-short"]
    (plot,) = result.plot_paths
    assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Path(result.html_path).read_text(encoding="utf-8")
    assert "data:image/png;base64," in page and 'src="http' not in page


def test_runs_with_the_same_value_tie_and_none_is_better(fresh):
    curve = rows({10: 3.0, 20: 2.5}, {0: 5.0, 20: 2.6})
    write_run(fresh, "run-a", curve)
    write_run(fresh, "run-b", curve, seed=1)
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-a", "run-b"]))
    assert result.best_run is None and result.config_differences == {"seed": {"run-a": 0, "run-b": 1}}
    assert "run-a, run-b tie at 2.6000" in Path(result.report_path).read_text(encoding="utf-8")


def test_anomalies_are_listed_per_run(fresh):
    spiky = {step: 3.0 for step in range(1, 30)} | {25: 9.0}
    write_run(fresh, "run-spiky", rows(spiky, {0: 5.0}))
    write_run(fresh, "run-calm", rows({step: 3.0 for step in range(1, 30)}, {0: 5.0}))
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-spiky", "run-calm"]))
    assert [(a.kind, a.step) for a in result.runs[0].anomalies] == [("loss_spike", 25)]
    assert result.runs[1].anomalies == []
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "- run-spiky: step 25 loss_spike" in markdown and "- run-calm: none" in markdown


def test_a_run_named_twice_or_a_single_run_is_refused(fresh):
    write_run(fresh, "run-a", rows({10: 3.0}, {0: 5.0}))
    with pytest.raises(InvalidInputError, match="run_ids"):
        compare_runs(fresh, CompareRunsRequest(run_ids=["run-a", "run-a"]))
    with pytest.raises(ValueError, match="run_ids"):
        CompareRunsRequest(run_ids=["run-a"])


@pytest.mark.slow
def test_two_real_runs_compare_on_what_their_launches_set_differently(ctx, finished_run, constant_run):
    done, _ = constant_run
    result = compare_runs(ctx, CompareRunsRequest(run_ids=[finished_run.run_id, done.run_id]))
    assert set(result.config_differences) == {
        "optimizer.schedule",
        "checkpoints.every_steps",
        "checkpoints.keep_last",
    }, result.config_differences
    assert result.at_tokens == 30 * 8 * 32 and result.best_run in (finished_run.run_id, done.run_id)
    rows_a = [run.final_eval_loss for run in result.runs]
    assert rows_a == [finished_run.summary.final_eval_loss, done.summary.final_eval_loss]
