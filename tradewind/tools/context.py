"""What every tool works with: the workspace, the job backend, and a way to report progress."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.core import TradewindError, Workspace, tail_lines

LOG_TAIL_LINES = 20

Progress = Callable[[float, float | None, str | None], None]
"""`progress(done, total, message)`: called by long tools; the MCP server forwards it as notifications."""


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """The progress callback for callers that do not show progress."""


@dataclass(frozen=True)
class ToolContext:
    """The workspace the tools read and write, and the backend that runs their jobs."""

    workspace: Workspace
    backend: LocalBackend

    @classmethod
    def open(
        cls, root: str | os.PathLike[str] | None = None, allowed_paths: tuple[str | os.PathLike[str], ...] = ()
    ) -> ToolContext:
        """The context for the workspace at `root` (else `$TRADEWIND_WORKSPACE`, else the default)."""
        workspace = Workspace.from_env(root, allowed_paths)
        return cls(workspace=workspace, backend=LocalBackend(workspace.jobs_dir))


def run_job(
    ctx: ToolContext, spec: JobSpec, *, job_id: str, timeout_s: float, activity: str, progress: Progress
) -> None:
    """Run `spec` as a job and wait for it, reporting elapsed seconds; for tools that must return its result.

    Raises:
        TradewindError: the job failed (with the end of its log) or ran past `timeout_s` (it is cancelled).
    """
    start = time.monotonic()
    record = ctx.backend.submit(spec, job_id=job_id)
    while not record.status.finished:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s:
            ctx.backend.cancel(job_id)
            raise TradewindError(f"{activity} took longer than timeout_s={timeout_s}")
        progress(elapsed, timeout_s, f"{activity} (seconds elapsed)")
        record = ctx.backend.wait(job_id, timeout=min(1.0, timeout_s - elapsed))
    if record.status is not JobStatus.SUCCEEDED:
        tail = "\n".join(tail_lines(spec.log_path, LOG_TAIL_LINES))
        raise TradewindError(f"{activity} failed ({record.reason}); log {spec.log_path} ends:\n{tail}")
