"""What every tool works with: the workspace, the job backends, and a way to report progress."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster import Backend, BackendName, JobSpec, JobStatus, get_backend
from tradewind.cluster.placement import BucketURL
from tradewind.core import TradewindError, Workspace, load_config, tail_lines
from tradewind.core.workspace import SETTINGS_FILE

LOG_TAIL_LINES = 20


class LaunchLimits(BaseModel):
    """What one `launch_training` call may start; `limits:` in `<workspace>/settings.yaml` raises them."""

    model_config = ConfigDict(extra="forbid")

    max_active_runs: int = Field(default=4, ge=1, description="Runs of the workspace pending or running at once.")
    max_steps: int = Field(default=1_000_000, ge=1, description="Steps of one run.")
    memory_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of this machine's available memory a local CPU run's estimated need may take.",
    )
    shared_devices: Literal["refuse", "wait"] = Field(
        default="refuse",
        description="A run on a time budget and another run on this machine's devices at once: refuse the later "
        "launch, or queue it until the devices are free.",
    )


class WorkspaceSettings(BaseModel):
    """`<workspace>/settings.yaml`: defaults for every run in the workspace."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendName | None = Field(
        default=None, description="Backend of runs that name none; null: 'ray' when RAY_ADDRESS is set, else 'local'."
    )
    limits: LaunchLimits = Field(default_factory=LaunchLimits)
    storage: BucketURL | None = Field(
        default=None,
        description="Bucket prefix (gs://, s3://) of runs that name none: their data copy, checkpoints and outputs.",
    )
    compile_cache_gb: float = Field(
        default=8.0,
        gt=0,
        le=4096,
        description="Size bound of cache/xla, the compiled programs local jobs share (least recently used go first).",
    )


Progress = Callable[[float, float | None, str | None], None]
"""`progress(done, total, message)`: called by long tools; the MCP server forwards it as notifications.

A long tool calls it at least every second or so, even when `done` has not moved: the server's callback
sends only values that increase, and raises `Cancelled` once the client has cancelled the call, which is
how a tool running in a worker thread learns to stop.
"""


class Cancelled(TradewindError):
    """The caller cancelled the call; raised by its progress callback, so a long tool stops at its next report."""


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """The progress callback for callers that do not show progress."""


@dataclass(frozen=True)
class ToolContext:
    """The workspace the tools read and write, and the backends that run their jobs.

    `backend` is the local one, where short jobs (sampling, profiling, pipelines) run; a training run
    goes to the backend it names (`job_backend`). Tools use every backend through the `Backend` protocol.
    """

    workspace: Workspace
    backend: Backend
    read_only: bool = False
    _connected: dict[str, Backend] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str] | None = None,
        allowed_paths: tuple[str | os.PathLike[str], ...] = (),
        allowed_code: tuple[str | os.PathLike[str], ...] = (),
        read_only: bool = False,
    ) -> ToolContext:
        """The context for the workspace at `root` (else `$TRADEWIND_WORKSPACE`, else the default).

        `allowed_paths` are folders whose files tools may read as inputs; `allowed_code` are folders whose
        Python files `run_pipeline` may run. With `read_only` (`tradewind serve --read-only`) every backend
        is opened to read only: the job database read-only, no spare supervisor, no process started, and
        nothing written to the workspace by looking.
        """
        workspace = Workspace.from_env(root, allowed_paths, allowed_code, create=not read_only)
        backend = get_backend("local", workspace.jobs_dir, read_only=read_only)
        return cls(workspace=workspace, backend=backend, read_only=read_only)

    def job_backend(self, name: str, address: str | None = None) -> Backend:
        """The backend called `name`: `backend` for "local"; "ray" connects on first use to `address`, else
        to $RAY_ADDRESS.

        Raises:
            InvalidInputError: an unknown name, Ray not installed, or the cluster cannot be reached.
        """
        if name == "local":
            return self.backend
        key = f"{name}@{address or ''}"
        if key not in self._connected:
            self._connected[key] = get_backend(name, self.workspace.jobs_dir, address, read_only=self.read_only)
        return self._connected[key]

    @property
    def settings_path(self) -> Path:
        return self.workspace.root / SETTINGS_FILE

    def settings(self) -> WorkspaceSettings:
        """The workspace's settings.yaml (defaults when there is none), read afresh: a person may edit it."""
        if self.settings_path.exists() or self.settings_path.is_symlink():  # what is there, load_config judges
            return load_config(WorkspaceSettings, self.settings_path)
        return WorkspaceSettings()

    def check_bucket(self, url: str, argument: str) -> str:
        """`url`, checked to lie under a bucket prefix allowed with `--allow-path` or named as settings.yaml's
        `storage` (`Workspace.check_bucket`)."""
        storage = self.settings().storage
        return self.workspace.check_bucket(url, argument, also=(storage,) if storage else ())

    def default_backend(self) -> BackendName:
        """The backend of a run that names none: the workspace's settings.yaml, else Ray when RAY_ADDRESS is
        set, else local."""
        if chosen := self.settings().backend:
            return chosen
        return "ray" if os.environ.get("RAY_ADDRESS") else "local"


def compile_cache_env(ctx: ToolContext) -> dict[str, str]:
    """What points a local job's JAX at the workspace's compiled programs (JAX's persistent cache in `cache/xla`):
    every program, however quick to compile (the eval step too), within settings.yaml's `compile_cache_gb`."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(ctx.workspace.compile_cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(int(ctx.settings().compile_cache_gb * 2**30)),
    }


def run_job(
    ctx: ToolContext, spec: JobSpec, *, job_id: str, timeout_s: float, activity: str, progress: Progress
) -> None:
    """Run `spec` as a job and wait for it, reporting elapsed seconds; for tools that must return its result.

    Raises:
        TradewindError: the job failed (with the end of its log) or ran past `timeout_s` (it is cancelled).
        Cancelled: the caller cancelled the call (the job is cancelled too).
    """
    start = time.monotonic()
    record = ctx.backend.submit(spec, job_id=job_id)
    while not record.status.finished:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s:
            ctx.backend.cancel(job_id)
            raise TradewindError(f"{activity} took longer than timeout_s={timeout_s}")
        try:
            progress(elapsed, timeout_s, f"{activity} (seconds elapsed)")
        except Cancelled:
            ctx.backend.cancel(job_id)  # nobody will read its result
            raise
        record = ctx.backend.wait(job_id, timeout=min(0.5, timeout_s - elapsed))
    if record.status is not JobStatus.SUCCEEDED:
        tail = "\n".join(tail_lines(spec.log_path, LOG_TAIL_LINES))
        raise TradewindError(f"{activity} failed ({record.reason}); log {spec.log_path} ends:\n{tail}")
