"""How the ledger judges runs it did not see train: run folders written here, as a Python call of `train` leaves
them, with their records, configs and summaries. Reruns are found from the configs, their spread pooled, and odd
ledgers (a missing parent, a continuation, a rerun cycle, a run its time cap stopped) never break it."""

import math
import shutil
import statistics

import pytest

from tradewind.cluster import JobStatus
from tradewind.core import atomic_write_json
from tradewind.runs import RunLayout, RunRecord, TrainConfig, TrainSummary, write_record
from tradewind.tools import ListExperimentsRequest, ToolContext, list_experiments
from tradewind.tools.noise import pooled

BUDGET = 4096  # tokens: 2 steps of the default batch


def made_run(ctx, run_id, val_bpb, *, seed=0, parent_run=None, parent=None, budget_met=True, **config):
    """A finished run folder: its record, its config (a token budget) and its summary."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    record = RunRecord(
        run_id=run_id, backend="process", status=JobStatus.SUCCEEDED, parent_run=parent_run, parent=parent
    )
    write_record(layout.record, record)
    values = {"dataset": "datasets/ds-1", "token_budget": BUDGET, "seed": seed, **config}
    atomic_write_json(layout.config, TrainConfig(**values).model_dump(mode="json"))
    summary = TrainSummary(
        parameters=1000,
        steps=2,
        tokens_seen=BUDGET,
        final_loss=1.0,
        first_eval_loss=2.0,
        final_eval_loss=1.0,
        best_eval_loss=1.0,
        mean_tokens_per_s=1000.0,
        compile_s=1.0,
        wall_s=3.0,
        val_bpb=val_bpb,
        budget_kind="tokens",
        budget=BUDGET,
        budget_met=budget_met,
    )
    atomic_write_json(layout.summary, summary.model_dump(mode="json"))
    return run_id


@pytest.fixture
def ledger_of(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")

    def judged():
        return {e.run_id: e for e in list_experiments(ctx, ListExperimentsRequest(limit=100)).experiments}

    return ctx, judged


def test_reruns_found_from_their_configs_give_sigma_and_each_change_its_delta(ledger_of):
    ctx, judged = ledger_of
    base = made_run(ctx, "run-a", 2.00)
    for index, value in enumerate([2.02, 1.99, 2.03]):
        made_run(ctx, f"run-a{index}", value, seed=index + 1, parent_run=base)
    made_run(ctx, "run-a-again", 2.50, seed=0, parent_run=base)  # the baseline's own seed: a repeat, counted once
    made_run(ctx, "run-lr", 1.50, parent_run=base, optimizer={"learning_rate": 1e-2})
    made_run(ctx, "run-wd", 2.01, parent_run=base, optimizer={"weight_decay": 0.2})
    ledger = judged()

    values = [2.00, 2.02, 1.99, 2.03]
    noise = pooled([values])
    assert noise.reruns == 3 and ledger["run-a"].reruns == 3
    assert ledger["run-a"].sigma == pytest.approx(statistics.stdev(values))
    assert {ledger[r].rerun_of for r in ("run-a0", "run-a1", "run-a2", "run-a-again")} == {"run-a"}
    threshold = noise.threshold(1, 4)
    lr, wd = ledger["run-lr"], ledger["run-wd"]
    assert lr.delta == pytest.approx(1.50 - statistics.fmean(values)) and lr.beyond_noise
    assert wd.delta == pytest.approx(2.01 - statistics.fmean(values)) and wd.beyond_noise is False
    assert abs(lr.delta) > threshold > abs(wd.delta)
    assert f"{threshold:.4f}" in lr.verdict and "beyond noise" in lr.verdict


def test_with_fewer_than_three_reruns_nothing_is_decided(ledger_of):
    ctx, judged = ledger_of
    base = made_run(ctx, "run-a", 2.00)
    made_run(ctx, "run-a0", 2.02, seed=1, parent_run=base)
    made_run(ctx, "run-a1", 1.99, seed=2, parent_run=base)
    made_run(ctx, "run-lr", 1.00, parent_run=base, optimizer={"learning_rate": 1e-2})
    change = judged()["run-lr"]
    assert change.reruns == 2 and change.beyond_noise is None
    assert "noise not measured: 2 reruns" in change.verdict and "rerun_baseline run-a" in change.verdict


def test_a_missing_parent_a_continuation_and_a_rerun_cycle_are_judged_without_breaking_the_ledger(ledger_of):
    ctx, judged = ledger_of
    made_run(ctx, "run-gone", 2.0)
    made_run(ctx, "run-orphan", 1.9, seed=1, parent_run="run-gone")  # a seed change of a run then deleted
    made_run(ctx, "run-child", 1.8, parent_run="run-orphan", optimizer={"learning_rate": 1e-2})
    shutil.rmtree(ctx.workspace.runs_dir / "run-gone")
    made_run(ctx, "run-long", 1.7, steps=10, parent="run-x")  # continues a run
    made_run(ctx, "run-fresh", 1.6, seed=3, parent_run="run-long", steps=10)
    made_run(ctx, "run-p", 2.1, seed=4, parent_run="run-q")
    made_run(ctx, "run-q", 2.2, seed=5, parent_run="run-p")  # each claims the other: a cycle
    ledger = judged()

    assert ledger["run-orphan"].rerun_of is None and "run-gone is unreadable" in ledger["run-orphan"].verdict
    assert ledger["run-child"].delta == pytest.approx(1.8 - 1.9)  # its parent is a run, not a rerun
    assert ledger["run-fresh"].rerun_of is None  # a new run is no rerun of a continuation
    assert {ledger["run-p"].rerun_of, ledger["run-q"].rerun_of} <= {"run-p", "run-q"}


def test_a_run_its_time_cap_stopped_is_neither_compared_nor_counted_in_the_noise(ledger_of):
    ctx, judged = ledger_of
    base = made_run(ctx, "run-a", 2.00)
    for index, value in enumerate([2.02, 1.99, 2.03]):
        made_run(ctx, f"run-a{index}", value, seed=index + 1, parent_run=base)
    made_run(ctx, "run-cut", 3.00, seed=9, parent_run=base, budget_met=False, time_budget_s=1)
    made_run(ctx, "run-lr", 2.5, parent_run=base, budget_met=False, optimizer={"learning_rate": 1e-2})
    ledger = judged()
    assert ledger["run-a"].sigma == pytest.approx(statistics.stdev([2.00, 2.02, 1.99, 2.03]))
    assert ledger["run-lr"].delta is None and "a time cap stopped it" in ledger["run-lr"].verdict
    assert math.isclose(ledger["run-a"].val_bpb, 2.00)
