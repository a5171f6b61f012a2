"""The experiment ledger on real runs: a baseline, a change of it and a crash, ranked by val_bpb, with what
each changed, its note, its status and cause; keeping and discarding; filters; TSV and CSV export."""

import csv

import pytest
from polling import wait_until
from runs_helpers import finish, workspace_with_dataset

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError, NotFoundError, PathEscapeError, read_json
from tradewind.runs import RunLayout
from tradewind.tools import (
    LaunchTrainingRequest,
    ListExperimentsRequest,
    RunRequest,
    SetExperimentStatusRequest,
    ToolContext,
    cancel_run,
    get_run,
    launch_training,
    list_experiments,
    set_experiment_status,
)


@pytest.fixture(scope="module")
def ledger_ctx(ctx, dataset_id, tmp_path_factory) -> ToolContext:
    return workspace_with_dataset(ctx, dataset_id, tmp_path_factory.mktemp("ledger") / "ws")


@pytest.fixture(scope="module")
def three_runs(ledger_ctx, dataset_id, tiny_run_settings):
    """A baseline, a run that raises its learning rate (parent: the baseline), and one that diverges."""
    base = {"dataset": dataset_id, "steps": 20, **tiny_run_settings}

    def launch(**changes):
        return launch_training(ledger_ctx, LaunchTrainingRequest(**{**base, **changes})).run_id

    baseline = launch(note="baseline")
    faster = launch(optimizer={"learning_rate": 3e-2, "warmup_steps": 5}, parent_run=baseline, note="lr\t3e-2")
    crashed = launch(optimizer={"learning_rate": 1e10, "warmup_steps": 5}, parent_run=baseline, note="lr 1e10")
    for run_id in (baseline, faster, crashed):
        finish(ledger_ctx, run_id)
    return baseline, faster, crashed


@pytest.mark.slow  # trains three tiny runs
def test_the_ledger_ranks_runs_by_val_bpb_with_their_changes_notes_and_crash_cause(ledger_ctx, three_runs):
    baseline, faster, crashed = three_runs
    listed = list_experiments(ledger_ctx, ListExperimentsRequest())
    by_id = {entry.run_id: entry for entry in listed.experiments}
    assert listed.total == 3 and not listed.truncated

    for run_id in (baseline, faster):
        summary = read_json(RunLayout(ledger_ctx.workspace.run_dir(run_id)).summary)
        assert by_id[run_id].status == "finished"
        assert by_id[run_id].val_bpb == summary["val_bpb"] and by_id[run_id].val_loss == summary["val_loss"]
        assert by_id[run_id].load is not None and by_id[run_id].train_s == summary["train_s"]
    ranked = sorted((baseline, faster), key=lambda run_id: by_id[run_id].val_bpb)
    assert [entry.run_id for entry in listed.experiments] == [*ranked, crashed]  # no metric: last

    assert by_id[baseline].parent is None and by_id[baseline].changes == {} and by_id[baseline].note == "baseline"
    assert by_id[faster].parent == baseline and by_id[faster].changes == {"optimizer.learning_rate": 3e-2}
    assert by_id[crashed].status == "crashed" and by_id[crashed].val_bpb is None
    assert "training loss became nan at step" in by_id[crashed].reason
    assert by_id[crashed].changes == {"optimizer.learning_rate": 1e10}
    assert [by_id[r].concurrent_runs for r in three_runs] == [0, 1, 2]  # launched back to back


@pytest.mark.slow
def test_keeping_and_discarding_is_recorded_and_filtered_and_nothing_is_lost(ledger_ctx, three_runs):
    baseline, faster, crashed = three_runs
    kept = set_experiment_status(
        ledger_ctx, SetExperimentStatusRequest(run_id=faster, status="kept", reason="lower val_bpb")
    )
    assert (kept.status, kept.reason) == ("kept", "lower val_bpb")
    set_experiment_status(ledger_ctx, SetExperimentStatusRequest(run_id=baseline, status="discarded", reason="beaten"))

    def ids(**filters):
        return [entry.run_id for entry in list_experiments(ledger_ctx, ListExperimentsRequest(**filters)).experiments]

    assert ids(status="kept") == [faster]
    assert ids(status="discarded") == [baseline]  # discarded runs stay queryable
    assert ids(status="crashed") == [crashed]
    assert sorted(ids(changed="optimizer.learning_rate")) == sorted([faster, crashed])
    assert ids(changed="model.d_model") == []
    assert ids(limit=1) == [ids()[0]]
    assert list_experiments(ledger_ctx, ListExperimentsRequest(limit=1)).truncated


@pytest.mark.slow
def test_the_ledger_exports_every_matching_experiment_as_tsv_and_csv(ledger_ctx, three_runs):
    for form, delimiter in (("tsv", "\t"), ("csv", ",")):
        listed = list_experiments(ledger_ctx, ListExperimentsRequest(export=form, limit=1))
        with open(listed.export_file, newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file, delimiter=delimiter))
        assert listed.export_file.endswith(f"experiments.{form}")
        assert len(rows) == 3  # all that match, not only the page
        by_id = {row["run_id"]: row for row in rows}
        assert set(by_id) == set(three_runs)
        faster = by_id[three_runs[1]]
        assert faster["changes"] == "optimizer.learning_rate=0.03" and faster["parent"] == three_runs[0]
        assert faster["note"] == ("lr 3e-2" if form == "tsv" else "lr\t3e-2")  # a TSV row stays one row
        entries = {e.run_id: e for e in list_experiments(ledger_ctx, ListExperimentsRequest(limit=100)).experiments}
        assert float(faster["val_bpb"]) == entries[three_runs[1]].val_bpb
        assert by_id[three_runs[2]]["val_bpb"] == "" and "nan" in by_id[three_runs[2]]["reason"]


@pytest.mark.slow
def test_a_running_run_cannot_be_decided_and_a_cancelled_one_is_discarded(ledger_ctx, dataset_id, tiny_run_settings):
    run_id = launch_training(
        ledger_ctx, LaunchTrainingRequest(dataset=dataset_id, steps=100_000, **tiny_run_settings)
    ).run_id
    try:
        wait_until(lambda: get_run(ledger_ctx, RunRequest(run_id=run_id)).status is JobStatus.RUNNING, 120, "start")
        with pytest.raises(InvalidInputError, match="still running"):
            set_experiment_status(ledger_ctx, SetExperimentStatusRequest(run_id=run_id, status="kept", reason="x"))
        assert list_experiments(ledger_ctx, ListExperimentsRequest(status="running")).experiments[0].run_id == run_id
    finally:
        cancel_run(ledger_ctx, RunRequest(run_id=run_id))
    entry = next(
        e for e in list_experiments(ledger_ctx, ListExperimentsRequest(limit=100)).experiments if e.run_id == run_id
    )
    assert (entry.status, entry.reason) == ("discarded", "cancelled")


def test_deciding_an_unknown_run_names_it(ctx):
    with pytest.raises(NotFoundError, match="run-nope"):
        set_experiment_status(ctx, SetExperimentStatusRequest(run_id="run-nope", status="kept", reason="x"))


@pytest.mark.slow
def test_a_budgeted_launch_trains_for_its_budget_and_reports_its_steps_and_val_bpb(ctx, dataset_id, tiny_run_settings):
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, time_budget_s=4, **tiny_run_settings))
    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    summary = done.summary
    # The job spent its budget. How close to it a run stops is test_trainer_budget's (a 30 s budget, within 5%,
    # and a clock the test moves): here, with the other tests loading the machine, a stalled last update can end
    # a 4 s run a fifth of a second late, as it did in CI.
    assert summary.train_s >= 4 * 0.95 and summary.time_budget_s == 4
    assert done.total_steps == done.step == summary.steps != 200  # the clock decided, not `steps`
    assert summary.val_bpb is not None and summary.val_tokens > 0


@pytest.mark.parametrize("argument", ["sweep_id", "changed"])
@pytest.mark.parametrize("value", ["x" * 1_000_000, "a\x00b", "../../x", "a b", ""])
def test_list_experiments_refuses_a_sweep_id_or_field_that_is_no_name(tmp_path, argument, value):
    ctx = ToolContext.open(tmp_path / "ws")
    with pytest.raises(InvalidInputError, match=rf"^argument '{argument}': "):
        list_experiments(ctx, ListExperimentsRequest(**{argument: value}))


@pytest.mark.parametrize("reason", ["  ", "\t\n"])
def test_a_blank_reason_is_refused_naming_it(ctx, reason):
    with pytest.raises(InvalidInputError, match=r"argument 'reason': it is blank"):
        set_experiment_status(ctx, SetExperimentStatusRequest(run_id="run-nope", status="kept", reason=reason))


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_the_export_never_writes_through_a_link_leading_out_of_the_workspace(tmp_path, linked):
    ctx = ToolContext.open(tmp_path / "ws")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "experiments.tsv").write_text("mine", encoding="utf-8")
    if linked == "file":
        (ctx.workspace.reports_dir / "experiments.tsv").symlink_to(outside / "experiments.tsv")
    else:
        ctx.workspace.reports_dir.rmdir()
        ctx.workspace.reports_dir.symlink_to(outside)
    with pytest.raises(PathEscapeError, match=r"argument 'export'"):
        list_experiments(ctx, ListExperimentsRequest(export="tsv"))
    assert [p.name for p in outside.iterdir()] == ["experiments.tsv"]
    assert (outside / "experiments.tsv").read_text(encoding="utf-8") == "mine"
