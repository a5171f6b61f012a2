"""The tool that profiles a run's training step with the JAX profiler."""

from __future__ import annotations

import sys
import time

from pydantic import Field

from tradewind.cluster import JobSpec, JobStatus
from tradewind.core import TradewindError, make_id, read_json, tail_lines
from tradewind.tools.context import Progress, ToolContext, no_progress
from tradewind.tools.runs import LOG_TAIL_LINES, RunRequest
from tradewind.trainer import ProfileSummary, RunLayout


class ProfileRunRequest(RunRequest):
    steps: int = Field(default=5, ge=1, le=100, description="Training steps to trace after compilation.")
    timeout_s: float = Field(default=600, gt=0, le=3600, description="Give up (and stop profiling) after this long.")


class ProfileResult(ProfileSummary):
    run_id: str
    log_file: str


def profile_run(ctx: ToolContext, request: ProfileRunRequest, progress: Progress = no_progress) -> ProfileResult:
    """Trace a few training steps of a run's configuration with the JAX profiler and time them.

    Returns compile time, mean step time and tokens per second, plus the trace folder (open it with
    TensorBoard or Perfetto). Runs in a separate process on fresh weights; takes about as long as
    compiling the model plus `steps` training steps, and does not disturb the run's own files.
    """
    layout = RunLayout(ctx.workspace.run_dir(request.run_id))
    log_path = layout.profile / "profile.log"
    job = ctx.backend.submit(
        JobSpec(
            name=f"profile {request.run_id}",
            command=[
                sys.executable,
                "-m",
                "tradewind.trainer.profile",
                str(layout.root),
                "--steps",
                str(request.steps),
            ],
            log_path=str(log_path),
        ),
        job_id=make_id("profile"),
    )
    start = time.monotonic()
    record = job
    while not record.status.finished:
        elapsed = time.monotonic() - start
        if elapsed >= request.timeout_s:
            ctx.backend.cancel(job.id)
            raise TradewindError(f"profiling run {request.run_id!r} took longer than timeout_s={request.timeout_s}")
        progress(elapsed, request.timeout_s, "profiling (seconds elapsed)")
        record = ctx.backend.wait(job.id, timeout=min(1.0, request.timeout_s - elapsed))
    if record.status is not JobStatus.SUCCEEDED:
        tail = "\n".join(tail_lines(log_path, LOG_TAIL_LINES))
        raise TradewindError(f"profiling run {request.run_id!r} failed ({record.reason}); log {log_path} ends:\n{tail}")
    summary = ProfileSummary.model_validate(read_json(layout.profile / "summary.json"))
    return ProfileResult(**summary.model_dump(), run_id=request.run_id, log_file=str(log_path))
