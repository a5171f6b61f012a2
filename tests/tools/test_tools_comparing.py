"""compare_runs: the config fields that differ, each run's figures and anomalies, eval curves overlaid against
tokens seen under labels naming each run's change, and the better run on val_bpb (or another metric) at equal
tokens."""

from pathlib import Path

import pytest

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, atomic_write_json
from tradewind.runs import MetricRow, RunLayout, RunRecord, TrainConfig, TrainSummary, write_record
from tradewind.tools import CompareRunsRequest, ToolContext, compare_runs
from tradewind.tools.report_data import LABEL_CHARS, VAL_BPB_MEANING, flatten, legend_labels, load_run


def write_run(
    ctx: ToolContext, run_id: str, rows: list[MetricRow], val_bpb: float | None = None, parent_run=None, **config
) -> None:
    """A finished run's folder; with `val_bpb`, the summary it ends with."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    record = RunRecord(run_id=run_id, backend="process", status=JobStatus.SUCCEEDED, parent_run=parent_run)
    write_record(layout.record, record)
    settings = {"dataset": "datasets/ds-x", "steps": 30, "batch_size": 8, "seq_len": 32} | config
    atomic_write_json(layout.config, TrainConfig(**settings).model_dump(mode="json"))
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    if val_bpb is not None:
        last = rows[-1].step
        summary = TrainSummary(
            parameters=1_000,
            steps=last,
            tokens_seen=last * 8 * 32,
            final_loss=None,
            first_eval_loss=None,
            final_eval_loss=None,
            best_eval_loss=None,
            mean_tokens_per_s=None,
            compile_s=1.0,
            wall_s=2.0,
            val_bpb=val_bpb,
        )
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))


def rows(losses: dict[int, float], evals: dict[int, float], bits: dict[int, float] | None = None) -> list[MetricRow]:
    """Rows with these train losses, eval losses and eval bits per byte, by step."""
    bits = bits or {}
    steps = sorted(set(losses) | set(evals) | set(bits))
    return [
        MetricRow(step=s, loss=losses.get(s), eval_loss=evals.get(s), eval_bits_per_byte=bits.get(s), elapsed=float(s))
        for s in steps
    ]


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
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-long", "run-short"], metric="eval_loss"))
    assert result.at_tokens == 20 * 8 * 32 and result.compared_on == "eval_loss"
    assert result.values == {"run-long": 2.9, "run-short": 2.5} and result.best_run == "run-short"
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "Compared on the eval curve's loss (eval_loss) at 5,120 tokens seen" in markdown
    assert "**run-short** is better" in markdown
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
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-a", "run-b"], metric="eval_loss"))
    assert result.best_run is None and result.config_differences == {"seed": {"run-a": 0, "run-b": 1}}
    assert "run-a, run-b tie at 2.6000" in Path(result.report_path).read_text(encoding="utf-8")


def test_runs_that_ended_at_the_same_tokens_are_compared_on_their_val_bpb_by_default(fresh):
    # The eval curves rank them the other way: val_bpb, on the fixed val tokens, decides.
    write_run(fresh, "run-a", rows({30: 3.0}, {30: 2.6}, {30: 2.30}), val_bpb=2.3653, token_budget=7_680)
    write_run(fresh, "run-b", rows({30: 3.0}, {30: 2.7}, {30: 2.40}), val_bpb=2.3601, token_budget=7_680, seed=1)
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-a", "run-b"]))
    assert (result.compared_on, result.at_tokens) == ("val_bpb", 30 * 8 * 32)
    assert result.values == {"run-a": 2.3653, "run-b": 2.3601} and result.best_run == "run-b"
    assert [run.val_bpb for run in result.runs] == [2.3653, 2.3601]
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "Compared on val_bpb: every run trained the same work (7,680 tokens or more): **run-b** is" in markdown
    assert VAL_BPB_MEANING in markdown and VAL_BPB_MEANING in Path(result.html_path).read_text(encoding="utf-8")


def test_runs_that_ended_apart_are_compared_on_the_eval_curves_bits_per_byte_at_equal_tokens(fresh):
    # run-long ends with the lower val_bpb after twice the tokens; at the tokens run-short reached it was behind.
    write_run(fresh, "run-short", rows({20: 3.0}, {20: 2.6}, {20: 1.30}), val_bpb=1.31, steps=20)
    write_run(
        fresh, "run-long", rows({20: 3.0, 40: 2.0}, {20: 2.7, 40: 2.0}, {20: 1.40, 40: 1.0}), val_bpb=1.01, steps=40
    )
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-long", "run-short"]))
    assert (result.compared_on, result.at_tokens) == ("eval_bits_per_byte", 20 * 8 * 32)
    assert result.values == {"run-long": 1.40, "run-short": 1.30} and result.best_run == "run-short"
    markdown = Path(result.report_path).read_text(encoding="utf-8")
    assert "Compared on the eval curve's bits per byte (eval_bits_per_byte) at 5,120 tokens seen" in markdown
    assert "not on val_bpb: the runs did not all train the same work to a val_bpb" in markdown


def test_runs_of_one_token_budget_are_compared_on_val_bpb_though_their_batches_end_them_apart(fresh):
    # 7,000 tokens: 28 steps of 8 x 32 end at 7,168, 55 steps of 4 x 32 at 7,040 (the budget rounds up to a step).
    write_run(fresh, "run-8", rows({28: 3.0}, {28: 2.6}, {28: 1.30}), val_bpb=1.31, token_budget=7_000)
    write_run(fresh, "run-4", rows({55: 3.0}, {55: 2.5}, {55: 1.20}), val_bpb=1.21, token_budget=7_000, batch_size=4)
    result = compare_runs(fresh, CompareRunsRequest(run_ids=["run-8", "run-4"]))
    assert result.compared_on == "val_bpb" and result.best_run == "run-4"


def test_each_runs_legend_label_names_what_it_changes_from_its_parent_or_else_from_the_other_runs(fresh):
    curve = rows({10: 3.0}, {10: 2.6}, {10: 1.3})
    write_run(fresh, "run-a", curve)
    write_run(fresh, "run-b", curve, parent_run="run-a", optimizer={"learning_rate": 1e-3})
    write_run(fresh, "run-c", curve, parent_run="run-a", model={"n_layers": 6, "d_model": 256, "n_heads": 8}, seed=7)
    runs = [load_run(fresh, run_id, sample=False) for run_id in ("run-a", "run-b", "run-c")]
    labels = legend_labels(fresh, runs)
    assert labels["run-b"] == "run-b: optimizer.learning_rate=0.001"
    assert labels["run-c"].startswith("run-c: model.d_model=256, model.n_heads=8, model.n_layers=6")
    assert len(labels["run-c"]) <= LABEL_CHARS and labels["run-c"].endswith("…")  # seed=7 did not fit
    # run-a has no parent: its label names where it differs from the others in the figure.
    assert labels["run-a"].startswith("run-a: model.d_model=128, ") and len(labels["run-a"]) <= LABEL_CHARS


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
