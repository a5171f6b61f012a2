"""Launch limits: what one launch_training call may start, set in the workspace's settings.yaml."""

import pytest
from runs_helpers import HAND_MADE_CONFIG, hand_made_run, pending_run

from tradewind.core import InvalidInputError
from tradewind.tools import (
    LaunchTrainingRequest,
    RunRequest,
    ToolContext,
    WaitForRunRequest,
    cancel_run,
    launch_training,
    wait_for_run,
)
from tradewind.tools.estimating import EstimateRunRequest, estimate_run
from tradewind.tools.limits import LimitReached
from tradewind.tools.profiling import ProfileRunRequest, profile_run
from tradewind.tools.sampling import SampleTextRequest, sample_text


@pytest.fixture
def limited(tmp_path, ctx, dataset_id) -> tuple[ToolContext, str]:
    """A fresh workspace whose settings allow one active run, and the suite's dataset as an allowed path."""
    dataset = ctx.workspace.dataset_dir(dataset_id)
    limited_ctx = ToolContext.open(tmp_path, allowed_paths=(dataset.parent,))
    (tmp_path / "settings.yaml").write_text("backend: local\nlimits:\n  max_active_runs: 1\n", encoding="utf-8")
    return limited_ctx, str(dataset)


def run_folders(ctx: ToolContext) -> list[str]:
    return sorted(path.name for path in ctx.workspace.runs_dir.iterdir())


@pytest.mark.slow
def test_a_second_active_run_is_refused_naming_the_limit_and_where_to_raise_it(limited, tiny_run_settings):
    ctx, dataset = limited
    first = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=100_000, **tiny_run_settings))
    try:
        with pytest.raises(LimitReached) as refused:  # an InvalidInputError that clears as runs end
            launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=10, **tiny_run_settings))
        assert run_folders(ctx) == [first.run_id] and refused.value.limit == "max_active_runs"
    finally:
        cancel_run(ctx, RunRequest(run_id=first.run_id))
    message = str(refused.value)
    assert f"1 runs are already pending or running ({first.run_id})" in message
    assert "limits.max_active_runs (now 1) in" in message and str(ctx.settings_path) in message
    again = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=1, **tiny_run_settings))  # room again
    assert wait_for_run(ctx, WaitForRunRequest(run_id=again.run_id, timeout_s=240)).status == "SUCCEEDED"


def test_more_steps_than_the_limit_are_refused_before_any_run_folder_exists(limited, tiny_run_settings):
    ctx, dataset = limited
    with pytest.raises(InvalidInputError, match=r"argument 'steps': 2,000,000 is more than the limit of 1,000,000"):
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=2_000_000, **tiny_run_settings))
    tokens = 2_000_000 * 8 * 32  # the tiny batch: 8 x 32 tokens a step
    with pytest.raises(InvalidInputError, match=r"argument 'token_budget': 512,000,000 tokens is 2,000,000 steps"):
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset, token_budget=tokens, **tiny_run_settings))
    assert run_folders(ctx) == []


def test_a_model_too_big_for_this_machines_memory_is_refused_with_the_estimate(limited, tiny_run_settings):
    ctx, dataset = limited
    huge = {"d_model": 16384, "n_layers": 64, "n_heads": 64, "max_seq_len": 64}
    with pytest.raises(LimitReached) as refused:
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=10, **{**tiny_run_settings, "model": huge}))
    message = str(refused.value)
    assert refused.value.limit == "memory_fraction" and isinstance(refused.value, InvalidInputError)
    assert "the run needs about" in message and "GiB this machine has available" in message
    assert "parameters with gradients and adamw state" in message and "limits.memory_fraction (now 0.9)" in message
    assert run_folders(ctx) == []


def test_a_lora_run_too_big_for_memory_is_refused_with_its_frozen_base_in_the_estimate(limited, tiny_run_settings):
    ctx, dataset = limited
    huge = {"d_model": 16384, "n_layers": 64, "n_heads": 64, "max_seq_len": 64}
    settings = {**tiny_run_settings, "model": huge, "lora": {"rank": 4, "targets": ["q_proj"]}}
    with pytest.raises(LimitReached) as refused:
        launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=10, **settings))
    message = str(refused.value)
    adapters = 4 * 64 * (16384 + 16384)
    assert f"1 x ({adapters:,} parameters with gradients and adamw state and " in message
    assert " frozen bfloat16 ones: " in message and refused.value.limit == "memory_fraction"
    assert run_folders(ctx) == []


# The limits bind every job a tool starts, not only runs: each refusal comes before anything is submitted.


def set_limits(ctx: ToolContext, limits: str) -> None:
    ctx.settings_path.write_text(f"backend: local\nlimits: {limits}\n", encoding="utf-8")


def test_estimate_runs_probe_is_refused_by_the_memory_limit_before_any_job_starts(limited):
    ctx, dataset = limited
    set_limits(ctx, "{memory_fraction: 1.0e-6}")
    with pytest.raises(LimitReached) as refused:
        estimate_run(ctx, EstimateRunRequest(config={"dataset": dataset, **HAND_MADE_CONFIG, "steps": 10}, probe=True))
    assert refused.value.limit == "memory_fraction"
    assert "estimate_run's probe needs about" in str(refused.value) and "use probe=false" in str(refused.value)
    assert ctx.backend.list() == []


def test_profile_run_is_refused_by_the_memory_limit_before_any_job_starts(limited):
    ctx, dataset = limited
    layout = hand_made_run(ctx, dataset)
    set_limits(ctx, "{memory_fraction: 1.0e-6}")
    with pytest.raises(LimitReached, match="profile_run's job needs about") as refused:
        profile_run(ctx, ProfileRunRequest(run_id="r1", steps=2))
    assert refused.value.limit == "memory_fraction" and "limits.memory_fraction (now 1e-06)" in str(refused.value)
    assert ctx.backend.list() == [] and not layout.profile.exists()


def test_sampling_is_refused_by_the_memory_limit_before_a_worker_starts(limited):
    ctx, dataset = limited
    layout = hand_made_run(ctx, dataset)
    set_limits(ctx, "{memory_fraction: 1.0e-6}")
    with pytest.raises(LimitReached, match="sampling this run needs about") as refused:
        sample_text(ctx, SampleTextRequest(run_id="r1", prompt="ROMEO:"))
    assert refused.value.limit == "memory_fraction" and "float32 parameters" in str(refused.value)
    assert ctx.backend.list() == [] and not layout.samples.exists()


def test_with_the_one_allowed_run_pending_a_probe_and_a_profile_are_refused_by_max_active_runs(
    limited, tiny_run_settings
):
    ctx, dataset = limited
    hand_made_run(ctx, dataset)
    with pending_run(ctx, dataset, tiny_run_settings) as run:
        started = {record.id for record in ctx.backend.list()}
        with pytest.raises(LimitReached, match=r"estimate_run's probe would train beside them") as probe:
            estimate_run(
                ctx, EstimateRunRequest(config={"dataset": dataset, **HAND_MADE_CONFIG, "steps": 10}, probe=True)
            )
        with pytest.raises(LimitReached, match=r"profile_run's job would train beside them") as profile:
            profile_run(ctx, ProfileRunRequest(run_id="r1", steps=2))
        assert {record.id for record in ctx.backend.list()} == started  # the hold job and the run, nothing more
    for refused in (probe.value, profile.value):
        assert refused.limit == "max_active_runs" and f"1 runs are already pending or running ({run.run_id})" in str(
            refused
        )
