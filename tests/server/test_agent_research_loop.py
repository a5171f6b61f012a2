"""The `autoresearch-loop` skill as a scripted agent session through the real MCP client: 20 experiments and more
on a token budget, from a baseline and its reruns, keeping only the changes beyond the noise, ending in a report.

Every id comes from a result, as an agent's must; the ledger's decisions are then checked against the deltas
and spread recomputed here from each run's val_bpb, by the rule `tradewind.tools.noise` states.
"""

import statistics

import anyio
import pytest
from mcp import Client
from mcp_helpers import call
from runs_helpers import workspace_with_dataset

from tradewind.server import build_server
from tradewind.tools import ToolContext
from tradewind.tools.noise import pooled

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BUDGET = {"token_budget": 20 * 8 * 32}  # 20 steps of the tiny batch (8 x 32), whatever the machine's speed
SPACE = {"optimizer.learning_rate": [3e-4, 1e-3, 3e-3, 2e-2, 4e-2], "model.d_model": [16, 32, 48]}


@pytest.fixture
def loop_ctx(ctx, dataset_id, tmp_path) -> ToolContext:
    return workspace_with_dataset(ctx, dataset_id, tmp_path / "ws")


async def wait(client, run_id):
    while (done := await call(client, "wait_for_run", {"run_id": run_id, "timeout_s": 60}))["timed_out"]:
        pass  # each call waits up to a minute; the test's timeout bounds the whole
    assert done["status"] == "SUCCEEDED", done["log_tail"]


@pytest.mark.timeout(900)
async def test_twenty_experiments_on_a_token_budget_keep_only_the_changes_beyond_the_noise(loop_ctx, tiny_run_settings):
    async with Client(build_server(loop_ctx)) as client:
        (dataset,) = (await call(client, "list_datasets"))["datasets"]
        base = {"dataset": dataset["dataset_id"], **BUDGET, **tiny_run_settings}
        baseline = (await call(client, "launch_training", {**base, "note": "baseline"}))["run_id"]
        await wait(client, baseline)
        reruns = await call(client, "rerun_baseline", {"run_id": baseline, "count": 3})
        for run_id in reruns["run_ids"]:
            await wait(client, run_id)

        sweep = await call(
            client,
            "launch_sweep",
            {"base": base, "space": SPACE, "parent_run": baseline, "baseline_every": 4, "max_concurrent": 2},
        )
        while (state := await call(client, "get_sweep", {"sweep_id": sweep["sweep_id"]}))["status"] == "running":
            running = [trial["run_id"] for trial in state["trials"] if trial["status"] == "running"]
            if running:  # a trial's end is what moves the sweep on
                await call(client, "wait_for_run", {"run_id": running[0], "timeout_s": 60})
            else:  # the controller launches the next trial within a second or so
                await anyio.sleep(0.5)
        assert state["status"] == "succeeded" and set(state["counts"]) <= {"finished", "crashed"}

        ledger = (await call(client, "list_experiments", {"limit": 100}))["experiments"]
        assert len(ledger) >= 20
        changes = [e for e in ledger if e["parent"] == baseline and e["rerun_of"] is None]
        decided = {}
        for entry in changes:
            keep = entry["beyond_noise"] is True and entry["delta"] < 0
            decided[entry["run_id"]] = await call(
                client,
                "set_experiment_status",
                {
                    "run_id": entry["run_id"],
                    "status": "kept" if keep else "discarded",
                    "reason": entry["verdict"] or entry["status"],  # a crashed trial has no verdict
                },
            )

        kept = [run_id for run_id, entry in decided.items() if entry["status"] == "kept"]
        report_runs = [baseline, *sorted(kept, key=lambda r: decided[r]["val_bpb"])[:2]] if kept else [baseline]
        report = await call(client, "summarize_report", {"run_ids": [*report_runs, *reruns["run_ids"]][:4]})
        served = await client.read_resource(report["report_uri"])
    assert "val_bpb" in served.contents[0].text and report["report_id"].startswith("compare-")

    # The ledger's figures, recomputed from each run's val_bpb.
    runs_of_baseline = [e for e in ledger if e["run_id"] == baseline or e["rerun_of"] == baseline]
    assert len(runs_of_baseline) == 4 + sum(trial["baseline"] for trial in state["trials"])
    values = [e["val_bpb"] for e in runs_of_baseline]
    noise = pooled([values])
    threshold = noise.threshold(1, len(values))
    assert len(changes) == len(SPACE["optimizer.learning_rate"]) * len(SPACE["model.d_model"])
    for entry in (change for change in changes if change["val_bpb"] is not None):  # a diverged trial has none
        delta = entry["val_bpb"] - statistics.fmean(values)
        assert entry["delta"] == pytest.approx(delta) and entry["sigma"] == pytest.approx(noise.sigma)
        assert entry["reruns"] == len(values) - 1 and entry["beyond_noise"] == (abs(delta) > threshold)
        kept_it = decided[entry["run_id"]]["status"] == "kept"
        assert kept_it == (abs(delta) > threshold and delta < 0), entry
        assert not decided[entry["run_id"]]["verdict"].startswith("Kept, but")
    assert any(entry["beyond_noise"] for entry in changes)  # a learning rate 30x lower is no noise
    ranked = [e["run_id"] for e in ledger if e["val_bpb"] is not None]
    assert set(ranked[-(len(runs_of_baseline) - 1) :]) == {e["run_id"] for e in runs_of_baseline if e["rerun_of"]}
