"""What a job is: a typed spec of what to run, and the record of how it went."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class JobStatus(StrEnum):
    """The life of a job: PENDING, then RUNNING, then one terminal state."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobSpec(BaseModel):
    """A command to run as its own process, with its output sent to `log_path`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Human-readable name, e.g. 'train run-20261202-1200-ab12'.")
    command: list[str] = Field(min_length=1, description="The program and its arguments.")
    log_path: str = Field(description="File that receives the process's stdout and stderr.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables added to the environment.")
    cwd: str | None = Field(default=None, description="Working directory; the server's when unset.")


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string, the format of every timestamp in a record."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class JobRecord(BaseModel):
    """Everything known about one job, persisted as `jobs/<id>/job.json`."""

    id: str
    spec: JobSpec
    status: JobStatus = JobStatus.PENDING
    submitted_at: str = Field(default_factory=utc_now)
    started_at: str | None = None
    ended_at: str | None = None
    pid: int | None = Field(default=None, description="Process id of the job's own process.")
    supervisor_pid: int | None = Field(default=None, description="Process that waits on the job and records it.")
    supervisor_start: int | None = Field(default=None, description="Start time of the supervisor (clock ticks).")
    exit_code: int | None = None
    reason: str | None = Field(default=None, description="Why the job ended as it did, when not plain success.")
