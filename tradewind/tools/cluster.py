"""Tools that show the job backends and run cached step pipelines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import JobRecord, JobSpec, JobStatus, PlannedStep, Resources
from tradewind.core import ConfigError, InvalidInputError, make_id
from tradewind.tools.context import Progress, ToolContext, no_progress

PLAN_TIMEOUT_S = 120


class ClusterStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["all", "local", "ray"] = Field(
        default="all", description="Which backend to show; 'all' adds Ray when RAY_ADDRESS is set."
    )
    limit: int = Field(default=50, ge=1, le=500, description="Most queued and most running jobs to list per backend.")


class JobSummary(BaseModel):
    job_id: str
    name: str
    status: JobStatus
    submitted_at: str | None
    started_at: str | None = None
    replicas: int
    resources: Resources
    attempts: int = Field(description="Attempts started so far (1 + retries).")
    reason: str | None = None


class BackendInfo(BaseModel):
    name: str
    available: bool = Field(description="False when the backend is not configured or cannot be reached.")
    detail: str | None = Field(default=None, description="Address of the cluster, or why it is unavailable.")
    capacity: dict[str, float] = Field(default_factory=dict, description="Resources the backend may hand out.")
    used: dict[str, float] = Field(default_factory=dict, description="Resources held by running jobs.")
    running_count: int = 0
    queued_count: int = 0
    running: list[JobSummary] = Field(default_factory=list)
    queued: list[JobSummary] = Field(default_factory=list, description="Jobs waiting for resources, oldest first.")


class ClusterStatus(BaseModel):
    backends: list[BackendInfo]


class RunPipelineRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str = Field(
        description="Path of a Python file in the workspace defining `steps` (tradewind.cluster.Step objects)."
    )
    dry_run: bool = Field(default=True, description="Only show the plan: which steps run, which are cached, where.")
    force: bool = Field(default=False, description="Rerun steps that failed in an earlier run.")


class RunPipelineResult(BaseModel):
    pipeline: str
    dry_run: bool
    steps: list[PlannedStep] = Field(
        description="Each step with its output path and action: run, cached, rerun, blocked."
    )
    job_id: str | None = Field(default=None, description="The job running the pipeline (not for a dry run).")
    log_file: str | None = Field(
        default=None, description="The job's log: progress lines, then one JSON line per step."
    )


def _summary(record: JobRecord) -> JobSummary:
    return JobSummary(
        job_id=record.id,
        name=record.spec.name,
        status=record.status,
        submitted_at=record.submitted_at,
        started_at=record.started_at,
        replicas=record.spec.replicas,
        resources=record.spec.resources,
        attempts=record.attempts,
        reason=record.reason,
    )


def _info(status, limit: int) -> BackendInfo:
    return BackendInfo(
        name=status.name,
        available=True,
        detail=status.detail,
        capacity=status.capacity,
        used=status.used,
        running_count=len(status.running),
        queued_count=len(status.queued),
        running=[_summary(r) for r in status.running[:limit]],
        queued=[_summary(r) for r in status.queued[:limit]],
    )


def _ray_info(limit: int) -> BackendInfo:
    if not os.environ.get("RAY_ADDRESS"):
        return BackendInfo(name="ray", available=False, detail="RAY_ADDRESS is unset; set it to a Ray head's address")
    try:
        from tradewind.cluster import RayBackend

        return _info(RayBackend().cluster_status(), limit)
    except ImportError:
        return BackendInfo(name="ray", available=False, detail="Ray is not installed (pip install 'tradewind[ray]')")
    except Exception as error:  # an unreachable cluster is a fact to report, not a tool failure
        return BackendInfo(name="ray", available=False, detail=f"{type(error).__name__}: {error}")


def cluster_status(ctx: ToolContext, request: ClusterStatusRequest) -> ClusterStatus:
    """Show the job backends: capacity, resources in use, and the queued and running jobs.

    The local backend is always there (this machine, with a ledger of CPUs, memory and GPUs); Ray
    appears when RAY_ADDRESS is set. Cheap: reads the job database and, for Ray, asks its head.
    """
    backends = []
    if request.backend in ("all", "local"):
        backends.append(_info(ctx.backend.cluster_status(), request.limit))
    if request.backend == "ray" or (request.backend == "all" and os.environ.get("RAY_ADDRESS")):
        backends.append(_ray_info(request.limit))
    return ClusterStatus(backends=backends)


def _pipeline_command(ctx: ToolContext, path: str, force: bool) -> list[str]:
    command = [sys.executable, "-m", "tradewind.cluster.pipeline", path, "--workspace", str(ctx.workspace.root)]
    return command + (["--force"] if force else [])


def _plan(ctx: ToolContext, path: str, force: bool) -> list[PlannedStep]:
    """The plan, computed in a child process so the pipeline's imports stay out of the server."""
    try:
        result = subprocess.run(
            [*_pipeline_command(ctx, path, force), "--dry-run"],
            capture_output=True,
            text=True,
            timeout=PLAN_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"argument 'pipeline': planning {path} took over {PLAN_TIMEOUT_S} s; does the file do work at import?"
        ) from None
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit code {result.returncode}"
        raise ConfigError(message.removeprefix("pipeline failed: "))
    return [PlannedStep.model_validate(json.loads(line)) for line in result.stdout.splitlines() if line.strip()]


def run_pipeline(ctx: ToolContext, request: RunPipelineRequest, progress: Progress = no_progress) -> RunPipelineResult:
    """Plan or run a pipeline of cached steps (tokenize, train, eval, ...); a dry run by default.

    Each step's output goes to `<workspace>/steps/<name>-<hash of its config and inputs>`; finished
    steps are skipped, so rerunning an unchanged pipeline costs seconds. With dry_run=false the steps
    run as one background job (follow it with cluster_status); call again with dry_run=true to see
    which steps have finished. Steps that failed before rerun only with force=true.
    """
    path = ctx.workspace.resolve_path(request.pipeline, argument="pipeline")
    if path.suffix != ".py" or not path.is_file():
        raise InvalidInputError(f"argument 'pipeline': {request.pipeline!r} is not a Python file")
    progress(0, None, "planning")
    steps = _plan(ctx, str(path), request.force)
    if request.dry_run:
        return RunPipelineResult(pipeline=str(path), dry_run=True, steps=steps)
    blocked = [step.name for step in steps if step.action == "blocked"]
    if blocked:
        raise InvalidInputError(
            f"argument 'force': steps {', '.join(blocked)} failed in an earlier run; pass force=true to rerun them"
        )
    job_id = make_id("pipeline")
    record = ctx.backend.submit(
        JobSpec(name=f"pipeline {path.name}", command=_pipeline_command(ctx, str(path), request.force)), job_id=job_id
    )
    return RunPipelineResult(pipeline=str(path), dry_run=False, steps=steps, job_id=job_id, log_file=record.log_path)
