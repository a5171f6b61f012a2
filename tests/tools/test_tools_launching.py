"""launch_training: accelerators refused before anything is queued, and `resume_from`, which continues a
finished run exactly as one longer run and refuses what would change it."""

import pytest
from mcp import Client
from runs_helpers import finish, losses

from tradewind.cluster import JobStatus
from tradewind.core import InvalidInputError
from tradewind.server import build_server
from tradewind.tools import LaunchTrainingRequest, RunRequest, get_run, launch_training

pytestmark = pytest.mark.anyio


def tool_text(result) -> str:
    return " ".join(block.text for block in result.content)


async def test_unknown_tpu_types_and_a_gpu_here_are_refused_at_once_and_nothing_is_queued(ctx, dataset_id):
    before = sorted(p.name for p in ctx.workspace.runs_dir.iterdir())
    jobs_before = len(ctx.backend.list())
    calls = [
        ({"accelerator": "tpu-v9-8"}, "unknown TPU type 'v9-8'; known types: v4-8"),
        ({"accelerator": "gpu", "backend": "local"}, "GPU"),
        ({"accelerator": "tpu-v5litepod-8", "backend": "local"}, "backend 'ray'"),
    ]
    async with Client(build_server(ctx)) as client:
        for arguments, expected in calls:  # how fast: benchmarks/cluster.py (well under the 2 s asked for)
            result = await client.call_tool("launch_training", {"dataset": dataset_id, **arguments})
            assert result.is_error and expected in tool_text(result), tool_text(result)
    assert sorted(p.name for p in ctx.workspace.runs_dir.iterdir()) == before
    assert len(ctx.backend.list()) == jobs_before


@pytest.mark.slow
def test_resume_from_continues_a_finished_run_exactly_as_one_longer_run(ctx, dataset_id, constant_run):
    reference, settings = constant_run
    parent = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=20, **settings))
    assert finish(ctx, parent.run_id).status is JobStatus.SUCCEEDED

    child = launch_training(ctx, LaunchTrainingRequest(resume_from=parent.run_id, steps=30))
    done = finish(ctx, child.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.parent == parent.run_id and done.summary.resumed_from_step == 20
    assert losses(ctx, child.run_id) == losses(ctx, reference.run_id)
    assert done.summary.final_eval_loss == reference.summary.final_eval_loss
    assert get_run(ctx, RunRequest(run_id=parent.run_id)).status is JobStatus.SUCCEEDED  # the parent is untouched


@pytest.mark.slow
def test_resume_from_refuses_what_would_change_the_run_and_steps_that_do_not_go_further(ctx, constant_run):
    reference, _ = constant_run
    with pytest.raises(InvalidInputError, match=r"argument 'steps': 30 is the new run's total and must exceed the 30"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=30))
    with pytest.raises(InvalidInputError, match=r"argument 'seed': a run that continues .* keeps its seed"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=40, seed=7))
    with pytest.raises(InvalidInputError, match=r"argument 'model'"):
        launch_training(ctx, LaunchTrainingRequest(resume_from=reference.run_id, steps=40, model={"d_model": 64}))
