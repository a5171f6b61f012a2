"""Runs on the local backend: one record whoever starts them, control, retries, and killed runs.

Every run here trains for real in its own processes; the MCP checks go through a real `mcp.Client`.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mcp import Client
from polling import wait_until
from runs_helpers import finish, losses

from tradewind.cluster import JobStatus
from tradewind.core import read_json
from tradewind.runs import RunLayout, TrainConfig, read_metrics
from tradewind.server import build_server
from tradewind.tools import (
    LaunchTrainingRequest,
    ListRunsRequest,
    RunRequest,
    ToolContext,
    cancel_run,
    get_run,
    launch_training,
    list_runs,
)
from tradewind.trainer import train

pytestmark = pytest.mark.anyio


def tradewind(*args: str) -> subprocess.CompletedProcess:
    """The `tradewind` command as installed beside this interpreter."""
    command = [str(Path(sys.executable).parent / "tradewind"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_cli_run_and_a_python_run_are_seen_by_every_run_tool_over_mcp(ctx, dataset_id, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        f"dataset: {dataset_id}\nmodel: {{d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 64}}\n"
        "steps: 4\nbatch_size: 8\nseq_len: 32\nlog_every: 2\neval_every: 2\neval_batches: 1\n"
    )
    cli = tradewind("train", str(config), "--workspace", str(ctx.workspace.root))
    assert cli.returncode == 0, cli.stderr[-3000:]
    cli_run = cli.stdout.split()[1]  # "run <id> (PENDING on local, cpu); folder ..."
    assert "SUCCEEDED" in cli.stderr and cli_run in cli.stderr

    python_dir = ctx.workspace.run_dir("run-from-python", must_exist=False)
    train(TrainConfig.model_validate(read_json(RunLayout(ctx.workspace.run_dir(cli_run)).config)), python_dir)

    async def over_mcp():
        async with Client(build_server(ctx)) as client:
            listed = (await client.call_tool("list_runs", {"limit": 200})).structured_content
            shown = {
                run_id: (await client.call_tool("get_run", {"run_id": run_id})).structured_content
                for run_id in (cli_run, "run-from-python")
            }
            report = await client.call_tool("summarize_report", {"run_id": cli_run})
            return listed, shown, report

    import anyio

    listed, shown, report = anyio.run(over_mcp)
    assert {cli_run, "run-from-python"} <= {run["run_id"] for run in listed["runs"]}
    assert shown[cli_run]["status"] == "SUCCEEDED" and shown[cli_run]["backend"] == "local"
    assert shown[cli_run]["job_id"] == cli_run and shown[cli_run]["step"] == 4
    assert shown["run-from-python"]["status"] == "SUCCEEDED" and shown["run-from-python"]["backend"] == "process"
    assert shown["run-from-python"]["summary"]["final_eval_loss"] == shown[cli_run]["summary"]["final_eval_loss"]
    assert not report.is_error and report.structured_content["final_eval_loss"] is not None


@pytest.mark.slow
def test_junk_in_runs_is_listed_as_unreadable_and_the_real_runs_still_list(ctx, constant_run):
    done, _ = constant_run
    # The measured defect: an empty folder (or one with a bad record) in runs/ made list_runs fail for every run.
    junk = {name: ctx.workspace.runs_dir / name for name in ("zz-empty", "zz-bad-record", "zz not an id")}
    for folder in junk.values():
        folder.mkdir()
    (junk["zz-bad-record"] / "run.json").write_text("{not json")
    try:
        listed = list_runs(ctx, ListRunsRequest(limit=200))
    finally:
        for folder in junk.values():
            shutil.rmtree(folder)
    assert done.run_id in [run.run_id for run in listed.runs]
    reasons = {bad.run_id: bad.reason for bad in listed.unreadable}
    assert set(reasons) == set(junk) and listed.total == len(listed.runs) + len(junk)
    assert "no run record run.json" in reasons["zz-empty"]
    assert "run.json" in reasons["zz-bad-record"] and "not a valid id" in reasons["zz not an id"]


def test_the_default_backend_is_the_workspace_setting_else_ray_when_ray_address_is_set(tmp_path, monkeypatch):
    ctx = ToolContext.open(tmp_path / "workspace")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ctx.default_backend() == "local"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert ctx.default_backend() == "ray"
    (ctx.workspace.root / "settings.yaml").write_text("backend: local\n")
    assert ctx.default_backend() == "local"
    (ctx.workspace.root / "settings.yaml").write_text("backend: slurm\n")
    with pytest.raises(Exception, match=r"settings\.yaml"):
        ctx.default_backend()


@pytest.mark.slow
def test_a_sigkilled_tool_launched_run_restarts_from_its_checkpoint_and_ends_as_if_never_stopped(
    ctx, dataset_id, constant_run
):
    reference, settings = constant_run
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=30, **settings))
    checkpoints = RunLayout(Path(run.run_dir)).checkpoints
    wait_until(lambda: any(p.name.isdigit() and int(p.name) >= 10 for p in checkpoints.glob("*")), 240, "a checkpoint")
    job = ctx.backend.status(run.run_id)
    assert job.status is JobStatus.RUNNING and job.attempts == 1
    os.kill(job.pid, signal.SIGKILL)

    done = finish(ctx, run.run_id)
    assert done.status is JobStatus.SUCCEEDED, done.log_tail
    assert done.attempts == 2 and ctx.backend.status(run.run_id).preemptions == 1
    assert done.summary.resumed_from_step >= 10
    assert losses(ctx, run.run_id) == losses(ctx, reference.run_id)
    assert done.summary.final_eval_loss == reference.summary.final_eval_loss


@pytest.mark.slow
def test_a_preempted_run_resumed_by_hand_is_reported_as_it_ended_not_as_its_job_did(ctx, dataset_id, constant_run):
    # The measured defect: after a manual resume, get_run still said PREEMPTED.
    reference, settings = constant_run
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=30, max_retries=0, **settings))
    checkpoints = RunLayout(Path(run.run_dir)).checkpoints
    wait_until(lambda: any(p.name.isdigit() and int(p.name) >= 10 for p in checkpoints.glob("*")), 240, "a checkpoint")
    os.kill(ctx.backend.status(run.run_id).pid, signal.SIGKILL)
    assert finish(ctx, run.run_id).status is JobStatus.PREEMPTED

    by_hand = subprocess.run(
        [sys.executable, "-m", "tradewind.trainer", run.run_dir], capture_output=True, text=True, timeout=300
    )
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    done = get_run(ctx, RunRequest(run_id=run.run_id))
    assert done.status is JobStatus.SUCCEEDED and done.summary.resumed_from_step >= 10
    assert losses(ctx, run.run_id) == losses(ctx, reference.run_id)


@pytest.mark.slow
def test_a_run_killed_after_its_last_checkpoint_writes_the_summary_an_uninterrupted_run_has(
    ctx, constant_run, tmp_path
):
    reference, _ = constant_run
    # What a SIGKILL after the final checkpoint leaves: every row and checkpoint, no summary, and a record
    # that still says RUNNING. Rerunning the folder must train 0 steps and summarise the run it finished.
    layout = RunLayout(tmp_path / "killed")
    subprocess.run(["cp", "-r", reference.run_dir, str(layout.root)], check=True)
    layout.summary.unlink()
    record = read_json(layout.record)
    layout.record.write_text(json.dumps({**record, "status": "RUNNING", "ended_at": None}))

    rerun = subprocess.run(
        [sys.executable, "-m", "tradewind.trainer", str(layout.root)], capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    text = layout.summary.read_text()
    summary = json.loads(text, parse_constant=lambda name: pytest.fail(f"summary.json holds a bare {name}"))
    expected = reference.summary.model_dump()
    for field in ("steps", "tokens_seen", "parameters", "final_loss", "first_eval_loss", "final_eval_loss"):
        assert summary[field] == expected[field], field
    assert summary["best_eval_loss"] == expected["best_eval_loss"]
    assert summary["mean_tokens_per_s"] == pytest.approx(expected["mean_tokens_per_s"], rel=1e-9)
    assert summary["resumed_from_step"] == 30 and read_json(layout.record)["status"] == "SUCCEEDED"
    assert [row.step for row in read_metrics(layout.metrics)] == [
        row.step for row in read_metrics(RunLayout(Path(reference.run_dir)).metrics)
    ]


@pytest.mark.slow
def test_cancel_run_stops_a_local_run_and_the_cli_lists_and_shows_it(ctx, dataset_id, tiny_run_settings):
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=100_000, **tiny_run_settings))
    wait_until(lambda: get_run(ctx, RunRequest(run_id=run.run_id)).step > 0, 240, "the first logged step")
    cancelled = cancel_run(ctx, RunRequest(run_id=run.run_id))
    assert cancelled.status is JobStatus.CANCELLED and cancelled.reason == "cancelled on request"

    def cli(*args):
        return tradewind("runs", *args, "--workspace", str(ctx.workspace.root))

    listed = cli("list", "--limit", "200")
    assert listed.returncode == 0 and f"{run.run_id}  CANCELLED" in listed.stdout
    shown = json.loads(cli("show", run.run_id).stdout)
    assert shown["status"] == "CANCELLED" and shown["backend"] == "local"
    again = cli("cancel", run.run_id)
    assert again.returncode == 0 and "CANCELLED" in again.stdout  # cancelling a finished run changes nothing


@pytest.mark.slow
def test_two_replicas_on_the_local_backend_train_exactly_as_one_process_on_the_same_global_batch(
    ctx, dataset_id, tiny_run_settings
):
    settings = {**tiny_run_settings, "log_every": 1, "checkpoints": {"every_steps": 5}}
    runs = {
        replicas: launch_training(
            ctx, LaunchTrainingRequest(dataset=dataset_id, steps=10, replicas=replicas, **settings)
        )
        for replicas in (1, 2)
    }
    done = {replicas: finish(ctx, run.run_id) for replicas, run in runs.items()}
    assert done[2].status is JobStatus.SUCCEEDED, done[2].log_tail
    assert done[2].processes == 2 and "over 2 process(es)" in Path(done[2].log_file).read_text()
    one, two = (np.array([loss for _, loss in losses(ctx, done[r].run_id)]) for r in (1, 2))
    assert len(one) == 10
    np.testing.assert_allclose(two, one, rtol=1e-5)
    # Both processes wrote the checkpoints together through orbax; they read back as the final state.
    saved = RunLayout(Path(done[2].run_dir)).checkpoints.iterdir()
    assert sorted(int(p.name) for p in saved if p.name.isdigit()) == [5, 10]
