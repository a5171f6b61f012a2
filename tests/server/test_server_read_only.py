"""A read-only server observes only: every tool it lists leaves the workspace byte-identical and starts nothing."""

import hashlib
import os
import shutil
import signal
import stat

import psutil
import pytest
from mcp import Client
from polling import wait_until
from runs_helpers import metric_rows, write_run

from tradewind.cluster import JobSpec, JobStatus, LocalBackend, Resources
from tradewind.cluster.process import process_alive
from tradewind.core import NotFoundError
from tradewind.runs import RunLayout, RunRecord
from tradewind.runs.record import update_record
from tradewind.server import build_server
from tradewind.tools import TokenizeDatasetRequest, ToolContext, tokenize_dataset
from tradewind.tools.sweep_controller import SweepState, TrialState, write_state

FINISHED, VANISHED, QUEUED, SWEEP = "run-finished", "run-vanished", "run-queued", "sweep-watched"


def tree_digest(root) -> dict[str, tuple[int, str]]:
    """Every entry under `root`: its mode and, for a file, the SHA-256 of its bytes (a link: its target)."""
    digest = {}
    for folder, names, files in os.walk(root):
        for name in names + files:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                content = os.readlink(path)
            elif stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
            else:
                content = ""
            digest[os.path.relpath(path, root)] = (mode, content)
    return digest


def run_job(backend: LocalBackend, layout: RunLayout, script: str, **settings) -> str:
    """Submit `script` as the job of the run at `layout` (its output is the run's log), recorded PENDING."""
    job_id = layout.root.name
    update_record(layout.record, backend="local", job_id=job_id, status=JobStatus.PENDING)
    spec = JobSpec(name=f"train {job_id}", command=["bash", "-c", script], log_path=str(layout.log), **settings)
    return backend.submit(spec, job_id=job_id).id


@pytest.fixture
def watched(tmp_path, small_corpus):
    """A workspace holding a dataset; a finished run; a RUNNING run whose supervisor was killed (its job's
    process lives on); a run queued behind it, which never started; and a sweep whose controller is that job."""
    ctx = ToolContext.open(tmp_path / "ws")
    root = ctx.workspace.root
    shutil.copy(small_corpus, root / "corpus.txt")
    dataset = tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt")).dataset_id
    backend = LocalBackend(ctx.workspace.jobs_dir, cpus=2, memory_gb=4)
    layouts = {}
    for run_id in (FINISHED, VANISHED, QUEUED):
        layouts[run_id] = write_run(ctx, run_id, metric_rows(steps=40), RunRecord(run_id=run_id, backend="process"))

    run_job(backend, layouts[FINISHED], "echo step 40 done")
    finished = backend.wait(FINISHED, timeout=60)
    assert finished.status is JobStatus.SUCCEEDED
    update_record(layouts[FINISHED].record, status=JobStatus.SUCCEEDED, ended_at=finished.ended_at)
    wait_until(lambda: not process_alive(finished.supervisor_pid, finished.supervisor_start), what="its supervisor end")

    run_job(backend, layouts[VANISHED], "echo training; exec sleep 300", resources=Resources(cpus=2))
    running = wait_until(lambda: (r := backend.status(VANISHED)).status is JobStatus.RUNNING and r)
    update_record(layouts[VANISHED].record, status=JobStatus.RUNNING, started_at=running.started_at)
    marker = root / "queued-run-started"
    run_job(backend, layouts[QUEUED], f"touch {marker}", resources=Resources(cpus=1))
    assert backend.status(QUEUED).status is JobStatus.PENDING
    os.kill(running.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: not process_alive(running.supervisor_pid, running.supervisor_start), what="the kill")

    ctx.workspace.make_dir(ctx.workspace.sweep_dir(SWEEP, must_exist=False), argument="sweep_id")
    trial = TrialState(index=0, overrides={}, arguments={}, tokens_per_step=256, run_id=VANISHED, status="running")
    write_state(
        ctx,
        SweepState(
            sweep_id=SWEEP,
            job_id=VANISHED,
            method="grid",
            backend="local",
            max_concurrent=1,
            canary_steps=0,
            halving_tokens=[],
            halving_eta=3,
            trials=[trial],
        ),
    )
    yield root, dataset, marker
    os.killpg(running.pid, signal.SIGKILL)  # the job's process outlived its supervisor


def arguments(dataset: str) -> dict[str, list[dict]]:
    """Valid calls of every read-only tool on the fixture: each run-reading tool on each run."""
    runs = [{"run_id": run_id} for run_id in (FINISHED, VANISHED, QUEUED)]
    return {
        "inspect_dataset": [{"dataset_id": dataset}],
        "list_datasets": [{}],
        "get_run": runs,
        "wait_for_run": [{**run, "timeout_s": 0.5} for run in runs],
        "list_runs": [{}],
        "read_metrics": runs,
        "tail_logs": runs,
        "get_sweep": [{"sweep_id": SWEEP}],
        "cluster_status": [{}],
    }


@pytest.mark.anyio
async def test_every_tool_of_a_read_only_server_leaves_the_workspace_byte_identical_and_starts_nothing(watched):
    root, dataset, marker = watched
    calls = arguments(dataset)
    before = tree_digest(root)
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    server = build_server(ToolContext.open(root, read_only=True), read_only=True)
    async with Client(server) as client:
        listed = sorted(tool.name for tool in (await client.list_tools()).tools)
        assert listed == sorted(calls), "give the read-only tools new to this server valid arguments in `arguments`"
        results = {}
        for name in listed:
            for call in calls[name]:
                result = await client.call_tool(name, call)
                results[name, str(call)] = result
                assert not result.is_error, (name, call, result.content)
    assert tree_digest(root) == before
    assert not marker.exists()
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= children
    vanished = results["get_run", str({"run_id": VANISHED})].structured_content
    assert vanished["status"] == "FAILED" and "supervising process vanished" in vanished["reason"]
    queued = results["get_run", str({"run_id": QUEUED})].structured_content
    assert queued["status"] == "PENDING"


def test_a_read_only_server_refuses_a_workspace_not_made_yet_and_makes_nothing(tmp_path):
    root = tmp_path / "never-made"
    with pytest.raises(NotFoundError, match=r"never-made/datasets is not there.*serve without --read-only"):
        ToolContext.open(root, read_only=True)
    assert not root.exists()
