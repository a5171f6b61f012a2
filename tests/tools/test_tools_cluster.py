"""cluster_status and run_pipeline, through the Python API and through a real MCP client in memory."""

import inspect
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import get_type_hints

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from polling import wait_until

from tradewind.cluster import Backend, JobSpec, JobStatus, Resources
from tradewind.cluster.entry import load_callable
from tradewind.cluster.pipeline import PIPELINE_CALLABLE, PipelineJob, pipeline_job
from tradewind.core import ConfigError, InvalidInputError, PathEscapeError
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import ToolContext
from tradewind.tools import cluster as cluster_tools
from tradewind.tools.cluster import (
    ClusterStatusRequest,
    RunPipelineRequest,
    cluster_status,
    run_pipeline,
)

PIPELINE = """
from tradewind.cluster import Step

def write(out, config, inputs):
    upstream = "".join((p / "out.txt").read_text() for p in inputs.values())
    (out / "out.txt").write_text(upstream + config["word"])

first = Step("first", write, {"word": "a"})
steps = [Step("second", write, {"word": "b"}, deps=(first,))]
"""


@pytest.fixture
def tool_ctx(tmp_path):
    """A workspace whose pipelines/ folder the server was told it may run (`--allow-code`), holding `pipe.py`."""
    workspace = tmp_path / "workspace"
    context = ToolContext.open(workspace, allowed_code=(workspace / "pipelines",))
    context.workspace.pipelines_dir.mkdir()
    (context.workspace.pipelines_dir / "pipe.py").write_text(PIPELINE)
    return context


MARKER_PIPELINE = """
import pathlib
pathlib.Path({marker!r}).write_text("the file's top-level code ran")
steps = []
"""


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_pipeline_in_the_workspace_is_never_imported_without_allow_code_not_even_for_a_dry_run(tmp_path, dry_run):
    ctx = ToolContext.open(tmp_path / "workspace")
    marker = tmp_path / "outside" / "ran"
    marker.parent.mkdir()
    ctx.workspace.pipelines_dir.mkdir()
    (ctx.workspace.pipelines_dir / "x.py").write_text(MARKER_PIPELINE.format(marker=str(marker)))
    with pytest.raises(PathEscapeError, match=r"argument 'pipeline': .*--allow-code") as refused:
        run_pipeline(ctx, RunPipelineRequest(pipeline="pipelines/x.py", dry_run=dry_run))
    assert "pipelines/x.py" in str(refused.value)
    assert not marker.exists() and ctx.backend.list() == []  # no job was started to import it


@pytest.mark.anyio
async def test_over_mcp_a_dry_run_of_a_pipeline_without_allow_code_is_an_error_and_runs_nothing(tmp_path):
    ctx = ToolContext.open(tmp_path / "workspace")
    marker = tmp_path / "ran"
    ctx.workspace.pipelines_dir.mkdir()
    (ctx.workspace.pipelines_dir / "x.py").write_text(MARKER_PIPELINE.format(marker=str(marker)))
    server = MCPServer(name="cluster-tools")
    server.add_tool(as_mcp_tool(run_pipeline, ctx), name="run_pipeline", structured_output=True)
    async with Client(server) as client:
        refused = await client.call_tool("run_pipeline", {"pipeline": "pipelines/x.py"})
    assert refused.is_error and "--allow-code" in " ".join(block.text for block in refused.content)
    assert not marker.exists() and ctx.backend.list() == []


def test_cluster_status_shows_capacity_use_and_running_and_queued_jobs(tool_ctx, tmp_path):
    release = tmp_path / "release"
    cpus = tool_ctx.backend.capacity.cpus
    hold = JobSpec(
        name="hold",
        command=["bash", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"],
        resources=Resources(cpus=cpus),
    )
    running = tool_ctx.backend.submit(hold)
    queued = tool_ctx.backend.submit(JobSpec(name="wait", command=["true"], resources=Resources(cpus=1)))
    wait_until(lambda: tool_ctx.backend.status(running.id).status is JobStatus.RUNNING)
    status = cluster_status(tool_ctx, ClusterStatusRequest(backend="local"))
    local = status.backends[0]
    assert (local.name, local.available, local.capacity["cpus"], local.used["cpus"]) == ("local", True, cpus, cpus)
    assert [j.job_id for j in local.running] == [running.id] and [j.job_id for j in local.queued] == [queued.id]
    assert (local.running_count, local.queued_count) == (1, 1)
    release.touch()
    assert tool_ctx.backend.wait(queued.id, timeout=30).status is JobStatus.SUCCEEDED


def test_cluster_status_reports_ray_unavailable_without_an_address(tool_ctx, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = cluster_status(tool_ctx, ClusterStatusRequest(backend="ray")).backends[0]
    assert (ray.name, ray.available) == ("ray", False) and "RAY_ADDRESS" in ray.detail


def test_cluster_status_reports_ray_unavailable_when_ray_is_not_installed(tmp_path):
    # A separate interpreter where `import ray` fails, as it does without the `ray` extra.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from tradewind.tools import ToolContext\n"
        "from tradewind.tools.cluster import ClusterStatusRequest, cluster_status\n"
        f"ctx = ToolContext.open({str(tmp_path / 'workspace')!r})\n"
        "print(cluster_status(ctx, ClusterStatusRequest(backend='ray')).backends[0].model_dump_json())\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    ray = json.loads(result.stdout)
    assert (ray["name"], ray["available"]) == ("ray", False)
    assert "Ray is not installed (pip install 'tradewind[ray]')" in ray["detail"]


def protocol_only(backend) -> SimpleNamespace:
    """`backend` seen through the `Backend` protocol alone: a tool that used anything else would fail."""
    methods = [name for name, _ in inspect.getmembers(Backend, inspect.isfunction) if not name.startswith("_")]
    return SimpleNamespace(name=backend.name, **{name: getattr(backend, name) for name in methods})


def test_the_tools_run_on_any_backend_that_offers_the_protocol(tool_ctx):
    assert get_type_hints(ToolContext)["backend"] is Backend
    ctx = ToolContext(workspace=tool_ctx.workspace, backend=protocol_only(tool_ctx.backend))
    plan = run_pipeline(ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert [(s.name, s.action) for s in plan.steps] == [("first", "run"), ("second", "run")]
    [local] = cluster_status(ctx, ClusterStatusRequest(backend="local")).backends
    assert (local.name, local.capacity) == ("local", tool_ctx.backend.capacity.model_dump(exclude={"tpu_type"}))


def test_run_pipeline_plans_by_default_then_runs_as_a_job_then_finds_everything_cached(tool_ctx):
    plan = run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert plan.dry_run and plan.job_id is None
    assert [(s.name, s.action) for s in plan.steps] == [("first", "run"), ("second", "run")]
    assert plan.steps[1].output_path.startswith(str(tool_ctx.workspace.root / "steps" / "second-"))

    started = run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/pipe.py", dry_run=False))
    done = tool_ctx.backend.wait(started.job_id, timeout=60)
    assert done.status is JobStatus.SUCCEEDED, tool_ctx.backend.logs(started.job_id).text
    with open(f"{plan.steps[1].output_path}/out.txt") as f:
        assert f.read() == "ab"
    again = run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/pipe.py"))
    assert [s.action for s in again.steps] == ["cached", "cached"]


def test_run_pipeline_plans_and_runs_through_callable_jobs_whose_kwargs_are_a_pipeline_job(tool_ctx):
    run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/pipe.py", force=True))
    started = run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/pipe.py", dry_run=False))
    assert tool_ctx.backend.wait(started.job_id, timeout=60).status is JobStatus.SUCCEEDED
    plans = [record for record in tool_ctx.backend.list() if record.spec.name == "plan pipe.py"]
    run = tool_ctx.backend.status(started.job_id)
    assert len(plans) == 2 and all(record.status is JobStatus.SUCCEEDED for record in plans)
    assert {record.spec.callable for record in [*plans, run]} == {PIPELINE_CALLABLE}
    assert load_callable(PIPELINE_CALLABLE) is pipeline_job
    pipe, workspace = str(tool_ctx.workspace.pipelines_dir / "pipe.py"), str(tool_ctx.workspace.root)
    jobs = [PipelineJob.model_validate(record.spec.kwargs) for record in [*plans, run]]
    assert [(job.pipeline, job.workspace) for job in jobs] == [(pipe, workspace)] * 3
    assert sorted((job.dry_run, job.force) for job in jobs) == [(False, False), (True, False), (True, True)]
    assert all(record.spec.resources.cpus == 0 for record in plans)  # planning never waits for a free CPU


def test_a_pipeline_file_that_raises_at_import_fails_the_plan_with_the_exception(tool_ctx):
    (tool_ctx.workspace.pipelines_dir / "broken.py").write_text("x = 1 / 0\n")
    with pytest.raises(ConfigError, match=r"importing .*broken\.py failed: ZeroDivisionError: division by zero"):
        run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/broken.py"))


def test_planning_a_file_that_hangs_at_import_stops_at_the_timeout_and_cancels_the_job(tool_ctx, monkeypatch):
    monkeypatch.setattr(cluster_tools, "PLAN_TIMEOUT_S", 3)
    (tool_ctx.workspace.pipelines_dir / "hang.py").write_text("import threading\nthreading.Event().wait()\n")
    reports = []
    with pytest.raises(ConfigError, match=r"planning .*hang\.py took over 3 s; does the file do work at import"):
        run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/hang.py"), lambda *report: reports.append(report))
    [plan] = [record for record in tool_ctx.backend.list() if record.spec.name == "plan hang.py"]
    assert tool_ctx.backend.wait(plan.id, timeout=30).status is JobStatus.CANCELLED
    assert reports and all(total == 3 and "planning" in message for _, total, message in reports)


def test_run_pipeline_refuses_paths_outside_the_workspace_and_files_without_steps(tool_ctx):
    with pytest.raises(PathEscapeError, match="argument 'pipeline'"):
        run_pipeline(tool_ctx, RunPipelineRequest(pipeline="../elsewhere.py"))
    (tool_ctx.workspace.pipelines_dir / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="must define `steps`"):
        run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/empty.py"))
    (tool_ctx.workspace.pipelines_dir / "notes.txt").write_text("hello")
    with pytest.raises(InvalidInputError, match="is not a Python file"):
        run_pipeline(tool_ctx, RunPipelineRequest(pipeline="pipelines/notes.txt"))


@pytest.mark.anyio
async def test_both_tools_work_through_an_mcp_client(tool_ctx):
    server = MCPServer(name="cluster-tools")
    for tool in (cluster_status, run_pipeline):
        server.add_tool(as_mcp_tool(tool, tool_ctx), name=tool.__name__, structured_output=True)
    async with Client(server) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed["run_pipeline"].input_schema["required"] == ["pipeline"]
        assert listed["run_pipeline"].description.startswith("Plan or run a pipeline file's cached steps")
        status = await client.call_tool("cluster_status", {})
        plan = await client.call_tool("run_pipeline", {"pipeline": "pipelines/pipe.py"})
        bad = await client.call_tool("cluster_status", {"backend": "slurm"})
    assert not status.is_error and status.structured_content["backends"][0]["name"] == "local"
    assert not plan.is_error and [s["action"] for s in plan.structured_content["steps"]] == ["run", "run"]
    assert bad.is_error and "backend" in " ".join(block.text for block in bad.content)
