"""What a job is: a typed spec of what to run and on what, and the record of how it went.

Also what every backend hands back besides records (`LogChunk`, `BackendStatus`) and the two helpers
both backends use for it: `decode_log_page` and `wait_for_finish`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tradewind.cluster.placement import Resources

# Gang jobs: every replica finds its peers through these variables (see `distributed_env`).
COORDINATOR_ENV = "TRADEWIND_COORDINATOR_ADDRESS"
PROCESS_ID_ENV = "TRADEWIND_PROCESS_ID"
PROCESS_COUNT_ENV = "TRADEWIND_PROCESS_COUNT"
JOB_ID_ENV = "TRADEWIND_JOB_ID"
ATTEMPT_ENV = "TRADEWIND_ATTEMPT"
# When the job's process started (seconds since the epoch), where the job runs in a process started before it.
JOB_START_ENV = "TRADEWIND_JOB_START"
# A folder of this process's own, on its host's disk: where a run that lives in a bucket keeps its local copy.
LOCAL_DIR_ENV = "TRADEWIND_LOCAL_DIR"
# A job's own variables: they differ job to job (and replica to replica).
JOB_VARIABLES = (
    JOB_ID_ENV,
    ATTEMPT_ENV,
    LOCAL_DIR_ENV,
    JOB_START_ENV,
    COORDINATOR_ENV,
    PROCESS_ID_ENV,
    PROCESS_COUNT_ENV,
)


def local_dir() -> Path:
    """This process's own folder (`$TRADEWIND_LOCAL_DIR`, which a backend sets per process), else one under the
    system's temporary folder named after its job and process."""
    if os.environ.get(LOCAL_DIR_ENV):
        return Path(os.environ[LOCAL_DIR_ENV])
    job = os.environ.get(JOB_ID_ENV, f"pid{os.getpid()}")
    return Path(tempfile.gettempdir()) / f"tradewind-local-{job}-{os.environ.get(PROCESS_ID_ENV, '0')}"


class JobStatus(StrEnum):
    """The life of a job: PENDING (queued), then RUNNING, then one terminal state."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"

    @property
    def finished(self) -> bool:
        return self not in (JobStatus.PENDING, JobStatus.RUNNING)


class Callback(BaseModel):
    """A Python callable named by import path, with its arguments (JSON values)."""

    model_config = ConfigDict(extra="forbid")

    callable: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="Import path 'package.module:function'.")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class JobSpec(BaseModel):
    """What to run: a command or a Python callable, on what resources, how often to retry, how long to allow.

    Exactly one entrypoint: `command` (a program and its arguments) or `callable` (an import path
    `package.module:function`, called with `args` and `kwargs` in a fresh Python process).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Human-readable name, e.g. 'train run-20261202-1200-ab12'.")
    command: list[str] | None = Field(default=None, min_length=1, description="The program and its arguments.")
    callable: str | None = Field(
        default=None, pattern=r"^[\w.]+:[\w.]+$", description="Import path 'package.module:function' to call."
    )
    args: list[Any] = Field(default_factory=list, description="Positional arguments for `callable` (JSON values).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for `callable` (JSON values).")
    log_path: str | None = Field(default=None, description="File for stdout and stderr; jobs/<id>/job.log if unset.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables added to the environment.")
    cwd: str | None = Field(default=None, description="Working directory; the server's when unset.")
    resources: Resources = Field(default_factory=Resources, description="What each replica needs.")
    replicas: int = Field(default=1, ge=1, le=1024, description="Processes started together (a gang) per attempt.")
    max_retries_failure: int = Field(default=0, ge=0, le=100, description="Reruns after the job itself fails.")
    max_retries_preemption: int = Field(default=0, ge=0, le=100, description="Reruns after a kill from outside.")
    timeout_s: float | None = Field(default=None, gt=0, description="Kill and fail an attempt running this long.")
    pending_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Fail the job, with the reason, if it has not started this many seconds after submission "
        "(resources the backend cannot provide or never frees); null waits as long as it takes.",
    )
    warm: bool = Field(
        default=False,
        description="Run in the jobs folder's warm process (a callable of one replica, local backend): it keeps the "
        "accelerator open and the programs it compiled loaded between jobs (tradewind.cluster.warm). The local "
        "backend sets it for jobs on this host's TPU.",
    )
    on_end: Callback | None = Field(
        default=None,
        description="Called by the job's supervisor (local backend) once the job has ended, whatever the outcome, "
        "with its arguments and `job=` the final JobRecord: e.g. to bring a record of the job's own up to date "
        "when its process was killed and could not. A failure goes to the supervisor's log.",
    )

    @model_validator(mode="after")
    def _check_entrypoint(self) -> JobSpec:
        if (self.command is None) == (self.callable is None):
            raise ValueError("give exactly one entrypoint: 'command' or 'callable'")
        if self.command is not None and (self.args or self.kwargs):
            raise ValueError("'args' and 'kwargs' go with 'callable', not with 'command'")
        if self.warm and (self.callable is None or self.replicas > 1):
            raise ValueError("'warm' goes with a 'callable' of one replica")
        return self

    def call(self) -> dict[str, Any]:
        """A callable job's call, as `entry.run_call` takes it."""
        return {"callable": self.callable, "args": self.args, "kwargs": self.kwargs}

    def argv(self, python: str = sys.executable, jobs_dir: Path | None = None) -> list[str]:
        """The process to start for one replica; a warm job's hands its call to the warm process of `jobs_dir`."""
        if self.command is not None:
            return list(self.command)
        call = json.dumps(self.call())
        if self.warm and jobs_dir is not None:
            return [python, "-m", "tradewind.cluster.warm", str(jobs_dir), call]
        return [python, "-m", "tradewind.cluster.entry", call]


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string, the format of every timestamp in a record."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class JobRecord(BaseModel):
    """Everything known about one job (stored in the backend's SQLite database)."""

    id: str
    spec: JobSpec
    backend: str = "local"
    status: JobStatus = JobStatus.PENDING
    submitted_at: str = Field(default_factory=utc_now)
    started_at: str | None = None
    ended_at: str | None = None
    pid: int | None = Field(default=None, description="Process id of replica 0 of the current attempt.")
    pids: list[int] = Field(default_factory=list, description="Process ids of every replica of the current attempt.")
    pid_starts: list[int | None] = Field(default_factory=list, description="Kernel start times of `pids`.")
    supervisor_pid: int | None = Field(default=None, description="Process that waits on the job and records it.")
    supervisor_start: int | None = Field(default=None, description="Start time of the supervisor (clock ticks).")
    attempts: int = Field(default=0, description="Attempts started so far (1 + retries).")
    failures: int = Field(default=0, description="Attempts that failed on their own.")
    preemptions: int = Field(default=0, description="Attempts killed from outside.")
    exit_code: int | None = None
    reason: str | None = Field(default=None, description="Why the job ended as it did, when not plain success.")
    log_path: str | None = Field(default=None, description="Where replica 0's output goes.")


class DistributedEnv(BaseModel):
    """How one replica of a gang job finds the others; what `jax.distributed.initialize` needs."""

    coordinator_address: str
    process_id: int
    process_count: int


def distributed_env(environ: dict[str, str] | None = None) -> DistributedEnv | None:
    """The gang settings of this process from its environment, or None outside a gang job.

    Example (in the trainer, before any other JAX call):
        if (dist := distributed_env()) is not None:
            jax.distributed.initialize(dist.coordinator_address, dist.process_count, dist.process_id)
    """
    environ = os.environ if environ is None else environ
    if COORDINATOR_ENV not in environ:
        return None
    return DistributedEnv(
        coordinator_address=environ[COORDINATOR_ENV],
        process_id=int(environ[PROCESS_ID_ENV]),
        process_count=int(environ[PROCESS_COUNT_ENV]),
    )


LOG_PAGE_BYTES = 64 * 1024  # what one `logs` call returns unless told otherwise


class LogChunk(BaseModel):
    """A page of a job's log: `text` starts at byte `offset`; pass `next_offset` to read on."""

    job_id: str
    text: str
    offset: int
    next_offset: int
    size: int = Field(description="Bytes in the log so far.")
    finished: bool = Field(description="True when the job has ended, so the log will not grow.")


class BackendStatus(BaseModel):
    """Capacity and use of one backend, with its queued and running jobs."""

    name: str
    available: bool = True
    detail: str | None = None
    capacity: dict[str, float] = Field(default_factory=dict)
    used: dict[str, float] = Field(default_factory=dict)
    queued: list[JobRecord] = Field(default_factory=list)
    running: list[JobRecord] = Field(default_factory=list)


def decode_log_page(job_id: str, page: bytes, *, offset: int, size: int, finished: bool) -> LogChunk:
    """The `LogChunk` of `page`, the bytes read from `offset` of a log of `size` bytes, cut back to a whole
    UTF-8 character.

    A character may straddle the page's end (a page is a byte count): up to three bytes are left for the
    page from `next_offset`. A page that no such cut makes valid UTF-8 is decoded whole, with replacement
    characters.
    """
    for cut in range(4):
        kept = page[: len(page) - cut]
        try:
            text = kept.decode("utf-8")
        except UnicodeDecodeError:
            continue
        page = kept
        break
    else:
        text = page.decode("utf-8", errors="replace")
    return LogChunk(
        job_id=job_id, text=text, offset=offset, next_offset=offset + len(page), size=size, finished=finished
    )


def wait_for_finish(status: Callable[[], JobRecord], timeout: float, poll_interval: float) -> JobRecord:
    """Poll `status()` until the job finishes or `timeout` seconds pass; the last record either way.

    Every backend's `wait` is this over its own `status`.
    """
    deadline = time.monotonic() + timeout
    record = status()
    while not record.status.finished and time.monotonic() < deadline:
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        record = status()
    return record
