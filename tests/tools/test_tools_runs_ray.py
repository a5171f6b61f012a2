"""Runs on Ray: a TPU slice through MCP, a two-process gang, cancel, and a request the cluster cannot place.

Needs the Ray head that `.ci/run` starts. It advertises fake TPU resources (`TPU: 8`,
`TPU-v5litepod-8-head: 1`): a true external boundary, since no TPU is attached. Ray schedules on those
names exactly as on a slice, and JAX trains on the CPU there.
"""

import time

import anyio
import numpy as np
import pytest
from mcp import Client
from polling import wait_until
from runs_helpers import finish, losses

from tradewind.cluster import JobStatus
from tradewind.cluster.ray_entry import ray_bundles
from tradewind.runs import RunLayout, read_metrics
from tradewind.server import build_server
from tradewind.tools import LaunchTrainingRequest, RunRequest, cancel_run, get_run, launch_training

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_tpu_run_on_ray_through_mcp_is_placed_on_the_slice_head_and_trains(
    ray_address, ctx, dataset_id, tiny_run_settings
):
    arguments = {
        "dataset": dataset_id,
        "steps": 6,
        "accelerator": "tpu-v5litepod-8",
        "backend": "ray",
        **tiny_run_settings,
    }

    async def over_mcp():
        async with Client(build_server(ctx)) as client:
            launched = await client.call_tool("launch_training", arguments)
            assert not launched.is_error, launched.content
            run_id = launched.structured_content["run_id"]
            done = await client.call_tool("wait_for_run", {"run_id": run_id, "timeout_s": 600})
            metrics = await client.call_tool("read_metrics", {"run_id": run_id})
            return done.structured_content, metrics.structured_content

    done, metrics = anyio.run(over_mcp)
    assert done["status"] == "SUCCEEDED", done["log_tail"]
    assert (done["backend"], done["accelerator"], done["processes"]) == ("ray", "tpu-v5litepod-8", 1)
    job = ctx.job_backend("ray").status(done["job_id"])
    bundles, _ = ray_bundles(job.spec)
    assert bundles == [{"CPU": 1.0, "TPU": 8, "TPU-v5litepod-8-head": 1}]
    steps = sorted({step for series in metrics["series"].values() for step in series["steps"]})
    assert steps == [0, 5, 6] and metrics["series"]["loss"]["values"][-1] > 0


def test_two_replicas_on_ray_train_exactly_as_one_local_process_on_the_same_global_batch(
    ray_address, ctx, dataset_id, tiny_run_settings
):
    settings = {**tiny_run_settings, "log_every": 1, "checkpoints": {"every_steps": 5}}
    local = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=10, backend="local", **settings))
    gang = launch_training(
        ctx, LaunchTrainingRequest(dataset=dataset_id, steps=10, backend="ray", replicas=2, **settings)
    )
    done = finish(ctx, gang.run_id, timeout_s=600)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert finish(ctx, local.run_id).status is JobStatus.SUCCEEDED
    assert done.processes == 2 and "over 2 process(es)" in RunLayout(ctx.workspace.run_dir(gang.run_id)).log.read_text()
    one, two = (np.array([loss for _, loss in losses(ctx, run.run_id)]) for run in (local, gang))
    assert len(one) == 10
    np.testing.assert_allclose(two, one, rtol=1e-5)


def test_cancel_run_stops_a_ray_run(ray_address, ctx, dataset_id, tiny_run_settings):
    run = launch_training(
        ctx, LaunchTrainingRequest(dataset=dataset_id, steps=100_000, backend="ray", **tiny_run_settings)
    )
    wait_until(lambda: get_run(ctx, RunRequest(run_id=run.run_id)).step > 0, 300, "the first logged step")
    cancel_run(ctx, RunRequest(run_id=run.run_id))
    done = finish(ctx, run.run_id, timeout_s=120)
    assert done.status is JobStatus.CANCELLED and done.reason == "cancelled on request"
    steps = read_metrics(RunLayout(ctx.workspace.run_dir(run.run_id)).metrics)[-1].step
    assert steps < 100_000


def test_a_tpu_request_ray_can_never_place_fails_within_its_pending_timeout_with_the_reason(
    ray_address, ctx, dataset_id, tiny_run_settings
):
    # Two slices of v5litepod-8 each fit the one node, but a gang of two slices needs two nodes.
    start = time.monotonic()
    run = launch_training(
        ctx,
        LaunchTrainingRequest(
            dataset=dataset_id,
            steps=5,
            backend="ray",
            accelerator="tpu-v5litepod-8",
            slices=2,
            pending_timeout_s=15,
            **{**tiny_run_settings, "batch_size": 16},  # rows split over the 16 chips of two slices
        ),
    )
    done = finish(ctx, run.run_id, timeout_s=120)
    assert done.status is JobStatus.FAILED, done.reason
    assert "not scheduled within pending_timeout_s=15 s" in done.reason and "INFEASIBLE" in done.reason
    assert time.monotonic() - start < 90
