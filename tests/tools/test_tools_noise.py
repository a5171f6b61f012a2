"""Decisions with their noise: reruns of a baseline on a token budget measure the spread of val_bpb, the ledger
judges each change's delta against it, reruns never rank, and runs on a time budget never share the machine."""

import math
import statistics

import pytest
from runs_helpers import finish, pending_run, workspace_with_dataset

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError
from tradewind.runs import RunLayout, read_train_config
from tradewind.tools import (
    LaunchTrainingRequest,
    ListExperimentsRequest,
    RerunBaselineRequest,
    RunRequest,
    SetExperimentStatusRequest,
    ToolContext,
    cancel_run,
    launch_training,
    list_experiments,
    rerun_baseline,
    set_experiment_status,
)
from tradewind.tools.limits import LimitReached
from tradewind.tools.noise import Noise, pooled


def test_the_pooled_spread_counts_each_configs_runs_less_one_and_its_threshold_uses_students_t():
    noise = pooled([[1.0, 2.0, 3.0], [10.0, 12.0], [7.0]])  # a config run once says nothing of the spread
    assert noise.reruns == 3
    assert noise.sigma == pytest.approx(math.sqrt((1 + 0 + 1 + 1 + 1) / 3))
    t_3 = 3.182446305284263  # Student's t, 0.975 quantile, 3 degrees of freedom
    assert noise.threshold(1, 3) == pytest.approx(t_3 * noise.sigma * math.sqrt(1 + 1 / 3))
    assert pooled([[2.0], [3.0]]) == Noise(sigma=None, reruns=0)
    assert not Noise(sigma=0.1, reruns=2).measured and Noise(sigma=0.1, reruns=3).measured


@pytest.fixture(scope="module")
def noise_ctx(ctx, dataset_id, tmp_path_factory) -> ToolContext:
    return workspace_with_dataset(ctx, dataset_id, tmp_path_factory.mktemp("noise") / "ws")


@pytest.fixture(scope="module")
def token_runs(noise_ctx, dataset_id, tiny_run_settings):
    """A baseline on a token budget with three reruns (one asked for from a rerun), a change that cannot
    matter (how often rows are logged), one that clearly does (a learning rate 100x lower), and a run of the
    baseline's config on a time budget."""
    base = {"dataset": dataset_id, "token_budget": 20 * 8 * 32, **tiny_run_settings}

    def launch(**changes):
        return launch_training(noise_ctx, LaunchTrainingRequest(**{**base, **changes})).run_id

    baseline = launch(note="baseline")
    finish(noise_ctx, baseline)
    reruns = rerun_baseline(noise_ctx, RerunBaselineRequest(run_id=baseline, count=2))
    for run_id in reruns.run_ids:
        finish(noise_ctx, run_id)
    third = rerun_baseline(noise_ctx, RerunBaselineRequest(run_id=reruns.run_ids[0], count=1))
    logged = launch(parent_run=baseline, log_every=4, note="log more often")
    slower = launch(parent_run=baseline, optimizer={"learning_rate": 1e-4, "warmup_steps": 5}, note="lr 1e-4")
    for run_id in (*third.run_ids, logged, slower):
        finish(noise_ctx, run_id)
    timed = launch(parent_run=baseline, token_budget=None, time_budget_s=3, note="time budget")
    finish(noise_ctx, timed)
    return baseline, [*reruns.run_ids, *third.run_ids], logged, slower, timed, reruns


def seed_of(ctx, run_id):
    return read_train_config(RunLayout(ctx.workspace.run_dir(run_id)).config).seed


@pytest.mark.slow  # trains seven tiny runs
def test_reruns_draw_new_seeds_and_count_as_reruns_of_the_configs_first_run(noise_ctx, token_runs):
    baseline, reruns, *_, first_call = token_runs
    assert first_call.rerun_of == baseline and first_call.seeds == [seed_of(noise_ctx, r) for r in reruns[:2]]
    assert len({seed_of(noise_ctx, run_id) for run_id in [baseline, *reruns]}) == 4
    ledger = {entry.run_id: entry for entry in list_experiments(noise_ctx, ListExperimentsRequest()).experiments}
    assert all(ledger[run_id].rerun_of == baseline for run_id in reruns)  # the third, asked for from a rerun, too
    assert all(ledger[run_id].changes == {"seed": seed_of(noise_ctx, run_id)} for run_id in reruns)
    assert ledger[baseline].rerun_of is None and ledger[baseline].budget == "5,120 tokens"


@pytest.mark.slow
def test_each_change_is_judged_against_the_spread_of_the_reruns(noise_ctx, token_runs):
    baseline, reruns, logged, slower, timed, _ = token_runs
    listed = list_experiments(noise_ctx, ListExperimentsRequest())
    ledger = {entry.run_id: entry for entry in listed.experiments}
    values = [ledger[run_id].val_bpb for run_id in [baseline, *reruns]]
    assert ledger[baseline].sigma == pytest.approx(statistics.stdev(values)) and ledger[baseline].reruns == 3
    noise = pooled([values])

    for run_id in (logged, slower):
        entry = ledger[run_id]
        assert entry.delta == pytest.approx(entry.val_bpb - statistics.fmean(values))
        assert entry.sigma == ledger[baseline].sigma and entry.reruns == 3
        assert entry.beyond_noise == (abs(entry.delta) > noise.threshold(1, 4))
    assert ledger[logged].beyond_noise is False and "within noise" in ledger[logged].verdict
    assert ledger[slower].beyond_noise is True and ledger[slower].delta > 0 and "beyond noise" in ledger[slower].verdict

    assert ledger[timed].delta is None and ledger[timed].beyond_noise is None
    assert "another budget (5,120 tokens, not 3 s)" in ledger[timed].verdict

    ranked = [entry.run_id for entry in listed.experiments]
    assert set(ranked[-len(reruns) :]) == set(reruns)  # every run with a val_bpb ranks before any rerun


@pytest.mark.slow
def test_keeping_a_change_within_the_noise_succeeds_and_says_so_and_a_rerun_cannot_be_kept(noise_ctx, token_runs):
    baseline, reruns, logged, slower, *_ = token_runs
    kept = set_experiment_status(noise_ctx, SetExperimentStatusRequest(run_id=logged, status="keep", reason="x"))
    assert kept.status == "kept" and kept.verdict.startswith("Kept, but not shown better than its parent")
    worse = set_experiment_status(noise_ctx, SetExperimentStatusRequest(run_id=slower, status="kept", reason="y"))
    assert worse.verdict.startswith("Kept, but")  # beyond the noise, but worse
    with pytest.raises(InvalidInputError, match=f"reruns {baseline}'s config"):
        set_experiment_status(noise_ctx, SetExperimentStatusRequest(run_id=reruns[0], status="kept", reason="z"))
    discard = SetExperimentStatusRequest(run_id=slower, status="discard", reason="w")
    discarded = set_experiment_status(noise_ctx, discard)
    assert discarded.status == "discarded" and not discarded.verdict.startswith("Kept")


def test_a_run_on_a_time_budget_never_shares_this_machine_with_another_run(noise_ctx, dataset_id, tiny_run_settings):
    timed = {"dataset": dataset_id, "time_budget_s": 5, **tiny_run_settings}
    with pending_run(noise_ctx, dataset_id, tiny_run_settings) as other:
        with pytest.raises(LimitReached, match=f"{other.run_id} use this machine's cpu devices") as refused:
            launch_training(noise_ctx, LaunchTrainingRequest(**timed))
        assert refused.value.limit == "shared_devices" and "shared_devices" in str(refused.value)

        settings = noise_ctx.workspace.root / "settings.yaml"
        settings.write_text("backend: local\nlimits:\n  shared_devices: wait\n", encoding="utf-8")
        try:
            queued = launch_training(noise_ctx, LaunchTrainingRequest(**timed))
        finally:
            settings.write_text("backend: local\n", encoding="utf-8")
        try:
            assert queued.status is JobStatus.PENDING  # it waits until the machine is its own
            job = noise_ctx.backend.status(queued.run_id)
            assert job.spec.resources.cpus == noise_ctx.backend.capacity.cpus
        finally:
            noise_ctx.backend.cancel(queued.run_id)


def test_no_run_starts_beside_a_run_on_a_time_budget(noise_ctx, dataset_id, tiny_run_settings):
    timed = launch_training(noise_ctx, LaunchTrainingRequest(dataset=dataset_id, time_budget_s=60, **tiny_run_settings))
    try:
        tokens = LaunchTrainingRequest(dataset=dataset_id, token_budget=20 * 8 * 32, **tiny_run_settings)
        with pytest.raises(LimitReached, match=f"{timed.run_id} use this machine's cpu devices; they are on a time"):
            launch_training(noise_ctx, tokens)
    finally:
        cancel_run(noise_ctx, RunRequest(run_id=timed.run_id))
