"""Tools that show the job backends and run cached step pipelines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import (
    PIPELINE_CALLABLE,
    BackendName,
    BackendStatus,
    JobRecord,
    JobSpec,
    JobStatus,
    PipelineJob,
    PlannedStep,
    Resources,
)
from tradewind.core import ConfigError, InvalidInputError, TradewindError, make_id, read_json
from tradewind.core.buckets import check_access
from tradewind.tools.bounds import LINE_CHARS, RESULT_CHARS, cut, cut_path, fitting
from tradewind.tools.context import Progress, ToolContext, no_progress, run_job
from tradewind.tools.spec import tool

PLAN_TIMEOUT_S = 120
# A backend's JSON less its job lists: name, detail (cut), counts and its resource totals (a few dozen kinds).
_BACKEND_CHARS = 3_000


class ClusterStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["all", BackendName] = Field(default="all", description="'all' adds Ray when RAY_ADDRESS is set.")
    limit: int = Field(
        default=50,
        ge=1,
        le=500,
        description="Most jobs per list.",
    )


class JobSummary(BaseModel):
    job_id: str
    name: str
    status: JobStatus
    submitted_at: str | None
    started_at: str | None = None
    replicas: int
    resources: Resources
    attempts: int = Field(description="Attempts started so far (1 + retries).")
    reason: str | None = Field(default=None, description=f"Cut to {LINE_CHARS} characters.")


class BackendInfo(BaseModel):
    name: str
    available: bool = Field(description="False when the backend is not configured or cannot be reached.")
    detail: str | None = Field(default=None, description="Address of the cluster, or why it is unavailable.")
    capacity: dict[str, float] = Field(default_factory=dict, description="Resources the backend may hand out.")
    used: dict[str, float] = Field(default_factory=dict, description="Resources held by running jobs.")
    running_count: int = Field(default=0, description="Jobs running; `running` lists the first of them.")
    queued_count: int = Field(default=0, description="Jobs queued; `queued` lists the first of them.")
    running: list[JobSummary] = Field(default_factory=list)
    queued: list[JobSummary] = Field(default_factory=list, description="Jobs waiting for resources, oldest first.")


class ClusterStatus(BaseModel):
    backends: list[BackendInfo]
    compile_cache: str = Field(description="Size and bound of cache/xla, compiled programs.")


class RunPipelineRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str = Field(description="Python file defining `steps`, in an --allow-code folder.")
    dry_run: bool = Field(default=True, description="Only plan which steps run or are cached.")
    force: bool = Field(default=False, description="Rerun steps that failed before.")


class RunPipelineResult(BaseModel):
    pipeline: str
    dry_run: bool
    steps: list[PlannedStep] = Field(
        description="Each step with its output path and action: run, cached, rerun, blocked; the first ones, when "
        "all would pass the result's 31,000 characters (long names, paths and errors are cut)."
    )
    steps_total: int = Field(description="Steps in the pipeline.")
    job_id: str | None = Field(default=None, description="The job running the pipeline (not for a dry run).")
    log_file: str | None = Field(
        default=None, description="The job's log: progress lines, then one JSON line per step."
    )


def _summary(record: JobRecord) -> JobSummary:
    return JobSummary(
        job_id=record.id,
        name=cut(record.spec.name),
        status=record.status,
        submitted_at=record.submitted_at,
        started_at=record.started_at,
        replicas=record.spec.replicas,
        resources=record.spec.resources,
        attempts=record.attempts,
        reason=cut(record.reason) if record.reason else None,
    )


def _info(status: BackendStatus, limit: int, budget: int) -> BackendInfo:
    """A backend's state, its two job lists cut to `limit` jobs and together `budget` characters of JSON."""
    running = fitting((_summary(r) for r in status.running[:limit]), budget // 2)
    queued = fitting((_summary(r) for r in status.queued[:limit]), budget // 2)
    return BackendInfo(
        name=status.name,
        available=True,
        detail=cut(status.detail) if status.detail else None,
        capacity=status.capacity,
        used=status.used,
        running_count=len(status.running),
        queued_count=len(status.queued),
        running=running,
        queued=queued,
    )


def _ray_info(ctx: ToolContext, limit: int, budget: int) -> BackendInfo:
    if not os.environ.get("RAY_ADDRESS"):
        return BackendInfo(name="ray", available=False, detail="RAY_ADDRESS is unset; set it to a Ray head's address")
    try:
        return _info(ctx.job_backend("ray").cluster_status(), limit, budget)
    except Exception as error:  # Ray missing or a cluster unreachable is a fact to report, not a tool failure
        return BackendInfo(name="ray", available=False, detail=cut(f"{type(error).__name__}: {error}"))


@tool("Show cluster status", read_only=True, idempotent=True, open_world=True)
def cluster_status(ctx: ToolContext, request: ClusterStatusRequest) -> ClusterStatus:
    """The job backends' capacity, use, queued and running jobs. Use it to see why a run waits.

    The local backend is always there (this machine, with a ledger of CPUs, memory, GPUs and TPU chips); Ray
    appears when RAY_ADDRESS is set. Cheap: reads the job database and, for Ray, asks its head.
    """
    # The job lists of each backend share what is left of the result once capacities and counts are in.
    budget = (RESULT_CHARS - _BACKEND_CHARS * 2) // 2
    backends = []
    if request.backend in ("all", "local"):
        backends.append(_info(ctx.backend.cluster_status(), request.limit, budget))
    if request.backend == "ray" or (request.backend == "all" and os.environ.get("RAY_ADDRESS")):
        backends.append(_ray_info(ctx, request.limit, budget))
    return ClusterStatus(backends=backends, compile_cache=describe_compile_cache(ctx))


def describe_compile_cache(ctx: ToolContext) -> str:
    """E.g. `1.20 GiB in 34 files of 8 GiB allowed (settings.yaml's compile_cache_gb)`."""
    used, files = ctx.workspace.compile_cache_use()
    return (
        f"{used / 2**30:,.2f} GiB in {files} files of {ctx.settings().compile_cache_gb:g} GiB allowed "
        "(settings.yaml's compile_cache_gb; tradewind cluster clear-cache empties it)"
    )


def _pipeline_kwargs(ctx: ToolContext, path: Path, force: bool, storage: str | None, **fields: Any) -> dict[str, Any]:
    """A pipeline job's keyword arguments (a `PipelineJob`) for `path` in this workspace."""
    job = PipelineJob(pipeline=str(path), workspace=str(ctx.workspace.root), force=force, storage=storage, **fields)
    return job.model_dump()


def _plan(ctx: ToolContext, path: Path, force: bool, storage: str | None, progress: Progress) -> list[PlannedStep]:
    """The plan, computed in a job so that the pipeline's imports stay out of the server.

    The job imports the file (runs its top-level code) in a fresh temporary working folder; the steps'
    functions are not called.
    """
    job_id = make_id("plan")
    plan_file = ctx.workspace.jobs_dir / job_id / "plan.json"
    spec = JobSpec(
        name=f"plan {path.name}",
        callable=PIPELINE_CALLABLE,
        kwargs=_pipeline_kwargs(ctx, path, force, storage, dry_run=True, output_file=str(plan_file)),
        log_path=str(plan_file.with_name("job.log")),
        resources=Resources(cpus=0),  # planning only imports the file: it must not queue behind a training run
    )
    try:
        run_job(ctx, spec, job_id=job_id, timeout_s=PLAN_TIMEOUT_S, activity=f"planning {path}", progress=progress)
    except TradewindError as error:
        if ctx.backend.status(job_id).status is JobStatus.FAILED:
            raise ConfigError(str(error)) from None  # the log's last line names the file and what went wrong
        # Not failed: run_job cancelled it at the timeout.
        raise ConfigError(
            f"argument 'pipeline': planning {path} took over {PLAN_TIMEOUT_S} s; does the file do work at import?"
        ) from None
    return [PlannedStep.model_validate(step) for step in read_json(plan_file)]


def _pipeline_result(path: Path, steps: list[PlannedStep], **fields: Any) -> RunPipelineResult:
    """The result with as many steps (their long strings cut) as fit the result's characters."""
    result = RunPipelineResult(pipeline=str(path), steps=[], steps_total=len(steps), **fields)
    shown = (
        step.model_copy(
            update={
                "name": cut(step.name),
                "output_path": cut_path(step.output_path),
                "error": cut(step.error) if step.error else None,
                "url": cut_path(step.url) if step.url else None,
            }
        )
        for step in steps
    )
    result.steps = fitting(shown, RESULT_CHARS - len(result.model_dump_json()))
    return result


@tool("Run a pipeline", destructive=True, open_world=True)
def run_pipeline(ctx: ToolContext, request: RunPipelineRequest, progress: Progress = no_progress) -> RunPipelineResult:
    """Plan or run a pipeline file's cached steps. Use it for multi-step work (--allow-code folders only).

    Running code is a grant of its own: the file must lie under a folder the server was started with
    `--allow-code DIR`; any other (the workspace's pipelines/ included) is refused before anything imports
    it. Even a dry run imports the file, so its top-level code runs (in a separate job process, in a fresh
    temporary working folder); the steps (tokenize, train, eval, ...) run only with dry_run=false. Each step's output
    goes to `<workspace>/steps/<name>-<hash of its config and inputs>`; finished steps are skipped, so
    rerunning an unchanged pipeline costs seconds. With dry_run=false the steps run as one background job
    (follow it with cluster_status); call again with dry_run=true to see which steps have finished. Steps
    that failed before rerun only with force=true. With settings.yaml's `storage`, outputs are also kept in
    `<storage>/steps/`, and a step finished there is downloaded, not run.
    """
    path = ctx.workspace.resolve_code(request.pipeline, argument="pipeline")
    if path.suffix != ".py" or not path.is_file():
        raise InvalidInputError(f"argument 'pipeline': {request.pipeline!r} is not a Python file")
    storage = ctx.settings().storage
    if storage is not None and not request.dry_run:
        check_access(storage, argument="storage")  # refused here, naming the URL, rather than in the job's log
    steps = _plan(ctx, path, request.force, storage, progress)
    if request.dry_run:
        return _pipeline_result(path, steps, dry_run=True)
    blocked = [step.name for step in steps if step.action == "blocked"]
    if blocked:
        raise InvalidInputError(
            f"argument 'force': steps {', '.join(blocked)} failed in an earlier run; pass force=true to rerun them"
        )
    spec = JobSpec(
        name=f"pipeline {path.name}",
        callable=PIPELINE_CALLABLE,
        kwargs=_pipeline_kwargs(ctx, path, request.force, storage, dry_run=False),
    )
    record = ctx.backend.submit(spec, job_id=make_id("pipeline"))
    return _pipeline_result(path, steps, dry_run=False, job_id=record.id, log_file=record.log_path)
