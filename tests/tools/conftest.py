"""Tool fixtures: a finished constant-learning-rate run that continued and restarted runs are compared with, and
a hand-made run folder for the refusals that come before any job starts."""

import pytest
from runs_helpers import finish, hand_made_run

from tradewind.cluster import JobStatus
from tradewind.tools import LaunchTrainingRequest, ToolContext, launch_training

# Constant learning rate after warmup: the schedule does not depend on the total, so a continued run can
# be compared step by step with one longer run.
CONSTANT = {"optimizer": {"learning_rate": 1e-2, "warmup_steps": 5, "schedule": "constant"}}


@pytest.fixture(scope="session")
def constant_run(ctx, dataset_id, tiny_run_settings):
    """An uninterrupted 30-step run at a constant learning rate, checkpointing every 5 steps."""
    settings = {**tiny_run_settings, **CONSTANT, "log_every": 5, "checkpoints": {"every_steps": 5, "keep_last": 2}}
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=30, **settings))
    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    return done, settings


@pytest.fixture
def hand_made(tmp_path, ctx, dataset_id) -> ToolContext:
    """A workspace with run `r1` as a run leaves it (a config, a checkpoints folder); nothing trained it."""
    dataset = ctx.workspace.dataset_dir(dataset_id)
    fresh = ToolContext.open(tmp_path / "ws", allowed_paths=(dataset.parent,))
    hand_made_run(fresh, str(dataset))
    return fresh
