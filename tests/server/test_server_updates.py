"""Resource updates through the real in-memory client: a client that listens (`subscriptions/listen`) hears
when a run's files change or a run appears, with no polling of its own."""

import json

import anyio
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated
from mcp_helpers import call

from tradewind.runs import RunLayout, RunRecord, write_record
from tradewind.server import build_server
from tradewind.tools import ToolContext

pytestmark = pytest.mark.anyio

RUNS = "tradewind://runs"
HEARD_WITHIN_S = 10  # a look a second, and a loaded machine


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    """An empty workspace of this test's own, so that no other test's runs change under the watcher."""
    return ToolContext.open(tmp_path / "ws")


def fake_run(ctx: ToolContext, run_id: str) -> RunLayout:
    """A run folder with a record and one metrics row, as a training process leaves it early on."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir()
    write_record(layout.record, RunRecord(run_id=run_id, backend="process"))
    layout.metrics.write_text('{"step": 0}\n', encoding="utf-8")
    return layout


async def hear(subscription, *expected):
    """Wait until every one of `expected` events has arrived on `subscription` (others may arrive between)."""
    waiting = set(expected)
    with anyio.fail_after(HEARD_WITHIN_S):
        async for event in subscription:
            waiting.discard(event)
            if not waiting:
                return


async def test_the_server_says_it_serves_resource_subscriptions_and_list_changes(fresh):
    async with Client(build_server(fresh)) as client:
        resources = client.server_capabilities.resources
    assert resources.subscribe is True and resources.list_changed is True


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_listening_client_hears_that_a_runs_metrics_changed_when_a_row_is_appended(fresh, read_only):
    layout = fake_run(fresh, "run-1")
    metrics = "tradewind://runs/run-1/metrics"
    server = build_server(ToolContext.open(fresh.workspace.root, read_only=read_only), read_only=read_only)
    async with Client(server) as client:
        async with client.listen(resource_subscriptions=[metrics, RUNS]) as subscription:
            with layout.metrics.open("a", encoding="utf-8") as rows:
                rows.write('{"step": 5, "loss": 4.2}\n')
            await hear(subscription, ResourceUpdated(metrics))
        text = (await client.read_resource(metrics)).contents[0].text
    assert text.splitlines()[-1] == '{"step": 5, "loss": 4.2}'


async def test_a_new_run_folder_changes_the_resource_list_and_the_run_list(fresh):
    fake_run(fresh, "run-1")
    async with Client(build_server(fresh)) as client:
        async with client.listen(resources_list_changed=True, resource_subscriptions=[RUNS]) as subscription:
            fake_run(fresh, "run-2")
            await hear(subscription, ResourcesListChanged(), ResourceUpdated(RUNS))
        listed = json.loads((await client.read_resource(RUNS)).contents[0].text)
    assert {run["run_id"] for run in listed["runs"] + listed["unreadable"]} == {"run-1", "run-2"}


async def test_a_runs_status_change_updates_the_run_list(fresh):
    layout = fake_run(fresh, "run-1")
    server = build_server(fresh)
    async with Client(server) as client, client.listen(resource_subscriptions=[RUNS]) as subscription:
        write_record(layout.record, RunRecord(run_id="run-1", backend="process", status="SUCCEEDED"))
        await hear(subscription, ResourceUpdated(RUNS))


async def test_a_client_still_hears_updates_after_another_that_listened_with_it_has_gone(fresh):
    layout = fake_run(fresh, "run-1")
    logs = "tradewind://runs/run-1/logs"
    server = build_server(fresh)
    async with Client(server) as staying, staying.listen(resource_subscriptions=[logs]) as subscription:
        async with Client(server) as leaving, leaving.listen(resource_subscriptions=[logs]) as other:
            layout.log.write_text("step 1\n", encoding="utf-8")
            await hear(other, ResourceUpdated(logs))
            await hear(subscription, ResourceUpdated(logs))
        layout.log.write_text("step 1\nstep 2\n", encoding="utf-8")
        await hear(subscription, ResourceUpdated(logs))


@pytest.mark.slow
async def test_a_client_listening_to_a_training_runs_metrics_hears_them_grow_while_it_trains(
    ctx, dataset_id, tiny_run_settings
):
    async with Client(build_server(ctx)) as client:
        run = await call(client, "launch_training", {"dataset": dataset_id, "steps": 100_000, **tiny_run_settings})
        metrics = f"tradewind://runs/{run['run_id']}/metrics"
        try:
            async with client.listen(resource_subscriptions=[metrics]) as subscription:
                # The client reads the metrics only when told they changed, until they hold rows; the training
                # process starts JAX and compiles before its first row.
                with anyio.fail_after(240):
                    async for event in subscription:
                        assert event == ResourceUpdated(metrics)
                        if rows := (await client.read_resource(metrics)).contents[0].text.splitlines():
                            break
            status = await call(client, "get_run", {"run_id": run["run_id"]})
        finally:
            await call(client, "cancel_run", {"run_id": run["run_id"]})
    # The newest row: on a fast machine the file may already be long enough to be served cut, after a note.
    assert json.loads(rows[-1])["step"] >= 0 and status["status"] == "RUNNING"
