"""Tool fixtures: a finished constant-learning-rate run that continued and restarted runs are compared with."""

import pytest
from runs_helpers import finish

from tradewind.cluster import JobStatus
from tradewind.tools import LaunchTrainingRequest, launch_training

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
