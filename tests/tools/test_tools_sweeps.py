"""Sweeps: a grid with a canary and successive halving run to the end on the local backend and on Ray, a
crashed trial, cancelling, and the checks that refuse a sweep before anything is queued.

The sweeps train for real: tiny models, 20 steps, an eval every 10; each sweep's runs live in a workspace of
its own (the session's dataset copied in), so its runs do not crowd the other tests' listings.
"""

import pytest
from polling import wait_until
from runs_helpers import finish_sweep, workspace_with_dataset, write_run, write_sweep

from tradewind.cluster import JobSpec, JobStatus
from tradewind.core import InvalidInputError, NotFoundError, atomic_write_json
from tradewind.runs import RunLayout, RunRecord, TrainConfig, read_record, read_train_config
from tradewind.tools import (
    LaunchTrainingRequest,
    ListExperimentsRequest,
    RunRequest,
    ToolContext,
    cancel_run,
    get_run,
    launch_training,
    list_experiments,
)
from tradewind.tools.experiments import experiment
from tradewind.tools.sweep_controller import TrialState, halving_verdict, read_state
from tradewind.tools.sweeps import LaunchSweepRequest, SweepRequest, cancel_sweep, get_sweep, launch_sweep

TINY = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
    "batch_size": 8,
    "seq_len": 32,  # 256 tokens a step
    "eval_every": 10,
    "eval_batches": 2,
    "log_every": 5,
    "checkpoint": False,
    "optimizer": {"warmup_steps": 5},
}
# In launch order: a canary that trains, a learning rate whose loss turns NaN, one too small to learn (it
# loses at the rung to the canary, whose loss there is recorded before anyone else launches), and the best,
# which wins there whichever of the trials after the canary reaches the rung first.
RATES = [3e-3, 1e10, 1e-5, 3e-2]


@pytest.fixture
def sweep_ctx(ctx, dataset_id, tmp_path) -> ToolContext:
    return workspace_with_dataset(ctx, dataset_id, tmp_path / "ws")


def run_halving_sweep(ctx: ToolContext, dataset_id: str, backend: str) -> None:
    base = {"dataset": dataset_id, "steps": 20, "backend": backend, **TINY}
    request = LaunchSweepRequest(
        base=base,
        space={"optimizer.learning_rate": RATES},
        canary_steps=10,
        halving_tokens=[10 * 256],
        note="lr scan",
    )
    launched = launch_sweep(ctx, request)
    assert launched.status == "running" and launched.counts == {"pending": 4}
    done = finish_sweep(ctx, launched.sweep_id)

    assert (done.status, done.reason, done.truncated) == ("succeeded", None, False)
    assert done.counts == {"finished": 2, "crashed": 1, "discarded": 1}
    canary, crashed, halved, best = done.trials
    assert [t.overrides for t in done.trials] == [{"optimizer.learning_rate": rate} for rate in RATES]
    assert canary.status == "finished" and canary.metric is not None and len(canary.rung_losses) == 1
    assert crashed.status == "crashed" and "training loss became nan at step" in crashed.reason
    assert crashed.rung_losses == []
    assert halved.status == "discarded" and halved.rung_losses[0] > canary.rung_losses[0]
    assert halved.reason.startswith(f"successive halving: eval loss {halved.rung_losses[0]:.4g} at 2,560 tokens, rank")
    assert best.status == "finished" and best.rung_losses[0] < canary.rung_losses[0]
    assert done.best.model_dump() == {
        "index": 3,
        "run_id": best.run_id,
        "metric": best.metric,
        "overrides": {"optimizer.learning_rate": 3e-2},
    }

    # The ledger's side: each run's record says which sweep launched it, its note, and the decision.
    records = [read_record(RunLayout(ctx.workspace.run_dir(t.run_id)).record) for t in done.trials]
    assert {r.sweep_id for r in records} == {launched.sweep_id} and {r.backend for r in records} == {backend}
    assert [r.note for r in records] == [f"lr scan: learning_rate={rate:g}" for rate in RATES]
    assert [r.decision for r in records] == [None, None, "discarded", None]
    assert records[2].decision_reason == halved.reason
    # Stopped if it was still training when it lost at the rung; a fast machine may have finished it by then.
    assert get_run(ctx, RunRequest(run_id=halved.run_id)).status in (JobStatus.CANCELLED, JobStatus.SUCCEEDED)
    assert get_run(ctx, RunRequest(run_id=crashed.run_id)).status is JobStatus.FAILED

    # The ledger lists all four as the sweep does, the crash with its cause.
    ledger = list_experiments(ctx, ListExperimentsRequest(sweep_id=launched.sweep_id))
    entries = {entry.run_id: entry for entry in ledger.experiments}
    assert ledger.total == 4
    assert [entries[t.run_id].status for t in done.trials] == ["finished", "crashed", "discarded", "finished"]
    assert entries[crashed.run_id].reason == crashed.reason and entries[halved.run_id].reason == halved.reason
    assert entries[best.run_id].val_bpb == best.metric

    # The canary gate: nothing else was created before the canary logged step 10.
    state = read_state(ctx, launched.sweep_id)
    assert state.canary_passed_at is not None
    assert all(r.created_at > state.canary_passed_at > records[0].created_at for r in records[1:])


@pytest.mark.slow
def test_a_four_config_sweep_with_a_canary_and_halving_runs_to_the_end_locally(sweep_ctx, dataset_id):
    run_halving_sweep(sweep_ctx, dataset_id, "local")


@pytest.mark.slow
@pytest.mark.ray
def test_a_four_config_sweep_with_a_canary_and_halving_runs_to_the_end_on_ray(ray_address, sweep_ctx, dataset_id):
    run_halving_sweep(sweep_ctx, dataset_id, "ray")


@pytest.mark.slow
def test_cancel_sweep_stops_the_controller_and_every_running_trial_and_baseline(sweep_ctx, dataset_id):
    parent = "run-parent"
    config = TrainConfig(dataset=str(sweep_ctx.workspace.dataset_dir(dataset_id)), steps=100_000, **TINY)
    layout = write_run(sweep_ctx, parent, [], RunRecord(run_id=parent, backend="process", status="SUCCEEDED"))
    atomic_write_json(layout.config, config.model_dump(mode="json"))
    request = LaunchSweepRequest(
        base={"dataset": dataset_id, "steps": 100_000, **TINY},
        space={"seed": [1, 2]},
        parent_run=parent,
        baseline_every=2,
    )
    launched = launch_sweep(sweep_ctx, request)
    assert [(t.index, t.baseline, t.overrides) for t in launched.trials] == [
        (0, False, {"seed": 1}),
        (1, True, {}),
        (2, False, {"seed": 2}),
    ]

    def launched_runs():
        return [t.run_id for t in get_sweep(sweep_ctx, SweepRequest(sweep_id=launched.sweep_id)).trials if t.run_id]

    running = wait_until(lambda: len(launched_runs()) == 2 and launched_runs(), 120, "the first trial and a baseline")
    wait_until(
        lambda: all(get_run(sweep_ctx, RunRequest(run_id=r)).status is JobStatus.RUNNING for r in running),
        120,
        "both runs to start",
    )

    done = cancel_sweep(sweep_ctx, SweepRequest(sweep_id=launched.sweep_id))
    assert (done.status, done.reason) == ("cancelled", "cancelled on request")
    first, baseline, unlaunched = done.trials
    assert [first.status, baseline.status, unlaunched.status] == ["discarded", "discarded", "pending"]
    assert unlaunched.run_id is None and first.reason == baseline.reason == "sweep cancelled"
    assert sweep_ctx.backend.status(launched.sweep_id).status is JobStatus.CANCELLED
    for trial in (first, baseline):
        assert get_run(sweep_ctx, RunRequest(run_id=trial.run_id)).status is JobStatus.CANCELLED
        record = read_record(RunLayout(sweep_ctx.workspace.run_dir(trial.run_id)).record)
        assert (record.decision, record.decision_reason, record.parent_run) == ("discarded", "sweep cancelled", parent)
    rerun = RunLayout(sweep_ctx.workspace.run_dir(baseline.run_id))
    seed = read_train_config(rerun.config).seed
    assert read_record(rerun.record).note == f"rerun of {parent} (seed {seed})" and seed != config.seed
    assert experiment(sweep_ctx, baseline.run_id).rerun_of == parent  # its only change is its seed
    assert cancel_sweep(sweep_ctx, SweepRequest(sweep_id=launched.sweep_id)) == done
    runs = [p.name for p in sweep_ctx.workspace.runs_dir.iterdir() if p.name != parent]
    assert sorted(runs) == sorted([first.run_id, baseline.run_id])


@pytest.mark.slow
def test_a_crashed_canary_fails_the_sweep_and_launches_nothing_more(sweep_ctx, dataset_id):
    request = LaunchSweepRequest(
        base={"dataset": dataset_id, "steps": 20, **TINY},
        space={"optimizer.learning_rate": [1e10, 3e-3, 1e-2]},
        canary_steps=15,
    )
    done = finish_sweep(sweep_ctx, launch_sweep(sweep_ctx, request).sweep_id)
    assert done.status == "failed" and done.counts == {"crashed": 1, "pending": 2}
    assert done.reason.startswith(f"canary trial 0 ({done.trials[0].run_id}) crashed before step 15: training loss")
    assert [p.name for p in sweep_ctx.workspace.runs_dir.iterdir()] == [done.trials[0].run_id]


def test_a_bad_field_in_one_trial_fails_the_call_naming_the_trial_and_the_field(workspace):
    request = LaunchSweepRequest(
        base={"dataset": "ds-none", "steps": 20}, space={"optimizer.learning_rate": [1e-3, -1.0]}
    )
    with pytest.raises(InvalidInputError, match=r"trial 1 \(learning_rate=-1\): argument 'optimizer.learning_rate'"):
        launch_sweep(workspace, request)
    unknown = LaunchSweepRequest(base={"dataset": "ds-none"}, space={"optimizer.lr": [1e-3]})
    with pytest.raises(InvalidInputError, match=r"trial 0 \(lr=0.001\): argument 'optimizer.lr'"):
        launch_sweep(workspace, unknown)
    # Only once every field is good is the dataset looked up.
    with pytest.raises(NotFoundError, match="ds-none"):
        launch_sweep(workspace, LaunchSweepRequest(base={"dataset": "ds-none"}, space={"seed": [1, 2]}))
    assert not workspace.workspace.sweeps_dir.exists() and not any(workspace.workspace.runs_dir.iterdir())


def test_a_grid_over_the_bound_and_more_concurrency_than_the_limit_are_refused(workspace):
    big = LaunchSweepRequest(base={"dataset": "ds-none"}, space={"seed": list(range(10)), "steps": list(range(1, 8))})
    with pytest.raises(InvalidInputError, match=r"70 configurations \(10 x 7\), more than 64.*method 'random'"):
        launch_sweep(workspace, big)
    eager = LaunchSweepRequest(base={"dataset": "ds-none"}, space={"seed": [1]}, max_concurrent=5)
    with pytest.raises(InvalidInputError, match=r"'max_concurrent': 5 is more than limits.max_active_runs \(4\)"):
        launch_sweep(workspace, eager)
    into_a_value = LaunchSweepRequest(base={"dataset": "ds-none", "model": 3}, space={"model.d_model": [64]})
    with pytest.raises(InvalidInputError, match=r"'space': 'model.d_model': 'model' is a value, not a section"):
        launch_sweep(workspace, into_a_value)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"method": "random"}, "method 'random' needs 'trials'"),
        ({"trials": 3}, "leave 'trials' unset"),
        ({"baseline_every": 2}, "give 'parent_run' too"),
        ({"halving_tokens": [100, 50]}, "increasing order"),
        ({"space": {"seed": []}}, "'seed' needs 1 to 64 values"),
        ({"space": {"note": ["x"]}}, "the sweep's own argument"),
        ({"base": {"note": "x"}}, "not inside 'base'"),
    ],
)
def test_inconsistent_sweep_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        LaunchSweepRequest.model_validate({"base": {}, "space": {"seed": [1]}, **arguments})


@pytest.mark.parametrize(
    ("loss", "recorded", "eta", "verdict"),
    [
        (5.0, [5.0], 2, None),  # alone at the rung: fewer than eta losses, it goes on
        (5.0, [4.0, 5.0], 2, "rank 2 of 2"),
        (4.0, [4.0, 5.0], 2, None),
        (4.5, [4.0, 5.0, 4.5], 2, "rank 2 of 3"),  # keep 3 // 2 = 1
        (4.5, [4.0, 5.0, 4.5, 6.0], 2, None),  # keep 4 // 2 = 2
        (4.5, [4.0, 4.5], 3, None),
        (4.0, [4.0, 4.0, 9.0], 3, None),  # ties share the better rank
    ],
)
def test_halving_keeps_the_best_one_over_eta_of_the_losses_recorded_at_the_rung(loss, recorded, eta, verdict):
    assert halving_verdict(loss, recorded, eta) == verdict


def test_get_sweep_shows_each_trials_nearest_baseline_and_caps_its_rows(workspace):
    def trial(index, metric, baseline=False, status="finished"):
        arguments = {"dataset": "ds-none"}
        return TrialState(
            index=index,
            overrides={} if baseline else {"seed": index},
            baseline=baseline,
            arguments=arguments,
            tokens_per_step=256,
            run_id=f"run-{index}",
            status=status,
            metric=metric,
        )

    trials = [trial(0, 3.0), trial(1, 2.0, baseline=True), trial(2, 1.5), trial(3, 1.0, status="discarded")]
    trials += [trial(4, 2.5, baseline=True)] + [trial(i, 2.0 + i) for i in range(5, 70)]
    write_sweep(workspace, "sweep-1", trials, status="succeeded")
    info = get_sweep(workspace, SweepRequest(sweep_id="sweep-1"))
    assert len(info.trials) == 64 and info.truncated
    assert [row.baseline_metric for row in info.trials[:6]] == [2.0, 2.0, 2.0, 2.5, 2.5, 2.5]
    assert info.best.model_dump() == {"index": 2, "run_id": "run-2", "metric": 1.5, "overrides": {"seed": 2}}
    assert info.counts == {"finished": 69, "discarded": 1}


def test_a_sweep_whose_controller_died_reads_failed_with_the_jobs_reason(workspace):

    trials = [TrialState(index=0, overrides={"seed": 1}, arguments={"dataset": "ds-none"}, tokens_per_step=256)]
    write_sweep(workspace, "sweep-2", trials)
    workspace.backend.submit(JobSpec(name="dies", command=["false"]), job_id="sweep-2")
    assert workspace.backend.wait("sweep-2", timeout=60).status is JobStatus.FAILED
    info = get_sweep(workspace, SweepRequest(sweep_id="sweep-2"))
    assert info.status == "failed" and info.reason.startswith("its controller job ended (FAILED: ")
    assert cancel_sweep(workspace, SweepRequest(sweep_id="sweep-2")).status == "cancelled"


@pytest.mark.slow
def test_a_trial_waits_for_a_slot_another_run_holds_instead_of_crashing(sweep_ctx, dataset_id):
    settings = sweep_ctx.workspace.root / "settings.yaml"
    settings.write_text("backend: local\nlimits:\n  max_active_runs: 1\n", encoding="utf-8")
    blocker = launch_training(sweep_ctx, LaunchTrainingRequest(dataset=dataset_id, steps=100_000, **TINY))
    try:
        request = LaunchSweepRequest(base={"dataset": dataset_id, "steps": 10, **TINY}, space={"seed": [1]})
        launched = launch_sweep(sweep_ctx, request.model_copy(update={"max_concurrent": 1}))
        log = sweep_ctx.workspace.sweep_dir(launched.sweep_id) / "controller.log"
        wait_until(lambda: log.exists() and "trial 0 waits" in log.read_text(), 60, "the trial to wait for a slot")
        assert get_sweep(sweep_ctx, SweepRequest(sweep_id=launched.sweep_id)).trials[0].status == "pending"
    finally:
        cancel_run(sweep_ctx, RunRequest(run_id=blocker.run_id))
    done = finish_sweep(sweep_ctx, launched.sweep_id)
    assert (done.status, done.trials[0].status) == ("succeeded", "finished")


def test_an_unknown_parent_run_of_a_sweep_is_named_with_its_argument(workspace):
    request = LaunchSweepRequest(base={"dataset": "ds-none"}, space={"seed": [1]}, parent_run="run-nope")
    with pytest.raises(NotFoundError, match=r"^argument 'parent_run': unknown run id 'run-nope'"):
        launch_sweep(workspace, request)
    assert not workspace.workspace.sweeps_dir.exists()
