"""What a job is: a typed spec of what to run and on what, and the record of how it went."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Gang jobs: every replica finds its peers through these variables (see `distributed_env`).
COORDINATOR_ENV = "TRADEWIND_COORDINATOR_ADDRESS"
PROCESS_ID_ENV = "TRADEWIND_PROCESS_ID"
PROCESS_COUNT_ENV = "TRADEWIND_PROCESS_COUNT"
JOB_ID_ENV = "TRADEWIND_JOB_ID"
ATTEMPT_ENV = "TRADEWIND_ATTEMPT"

_TPU_TYPE = re.compile(r"^(v4|v5p|v5litepod|v6e)-(\d+)$")


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


def tpu_topology(tpu_type: str) -> tuple[int, int]:
    """`(hosts, chips per host)` of one slice of `tpu_type`, e.g. `v5litepod-16` -> `(4, 4)`.

    v4 and v5p names count TensorCores (two per chip); v5litepod and v6e names count chips. Slices of
    up to 8 chips of v5litepod/v6e sit on one host; larger ones have 4 chips per host, as on GCP.
    """
    match = _TPU_TYPE.match(tpu_type)
    if not match:
        raise ValueError(f"unknown TPU type {tpu_type!r}; expected e.g. v4-8, v5p-8, v5litepod-8, v6e-16")
    family, size = match.group(1), int(match.group(2))
    chips = size // 2 if family in ("v4", "v5p") else size
    if chips < 1:
        raise ValueError(f"TPU type {tpu_type!r} has no whole chip")
    if family in ("v5litepod", "v6e") and chips <= 8:
        return 1, chips
    return max(1, chips // 4), min(4, chips)


class Resources(BaseModel):
    """What one replica of a job needs. The local ledger admits a job only when all of it is free."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(default=1.0, ge=0, description="CPU cores per replica.")
    memory_gb: float = Field(default=0.0, ge=0, description="Memory per replica in GiB (0: not accounted).")
    gpus: int = Field(default=0, ge=0, description="GPUs per replica.")
    tpu_type: str | None = Field(default=None, description="TPU slice type, e.g. 'v5litepod-8' (Ray backend only).")
    tpu_slices: int = Field(default=1, ge=1, description="How many slices of `tpu_type`.")

    @model_validator(mode="after")
    def _check_tpu(self) -> Resources:
        if self.tpu_type is not None:
            tpu_topology(self.tpu_type)  # raises ValueError, which pydantic reports against the field
        return self


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

    @model_validator(mode="after")
    def _check_entrypoint(self) -> JobSpec:
        if (self.command is None) == (self.callable is None):
            raise ValueError("give exactly one entrypoint: 'command' or 'callable'")
        if self.command is not None and (self.args or self.kwargs):
            raise ValueError("'args' and 'kwargs' go with 'callable', not with 'command'")
        return self

    def argv(self, python: str = sys.executable) -> list[str]:
        """The process to start for one replica."""
        if self.command is not None:
            return list(self.command)
        call = json.dumps({"callable": self.callable, "args": self.args, "kwargs": self.kwargs})
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


_ACCELERATOR_FAMILIES = {"v4": "v4", "v5p": "v5p", "v5e": "v5litepod", "v5litepod": "v5litepod", "v6e": "v6e"}


def accelerator_resources(accelerator: str, cpus: float = 1.0, memory_gb: float = 0.0) -> Resources:
    """Per-replica resources for an accelerator name as tools accept it.

    `"cpu"`; `"gpu"` or `"gpu-<n>"` (n GPUs); `"tpu-<family>-<size>"` with family v4, v5p, v5e (Cloud
    name of v5litepod) or v6e, e.g. `"tpu-v5e-8"` -> `tpu_type="v5litepod-8"`.

    Raises:
        ValueError: an unknown accelerator name.
    """
    name = accelerator.strip().lower()
    if name == "cpu":
        return Resources(cpus=cpus, memory_gb=memory_gb)
    if name == "gpu" or re.fullmatch(r"gpu-\d+", name):
        return Resources(cpus=cpus, memory_gb=memory_gb, gpus=int(name.partition("-")[2] or 1))
    match = re.fullmatch(r"tpu-(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
    if match:
        tpu_type = f"{_ACCELERATOR_FAMILIES[match.group(1)]}-{match.group(2)}"
        return Resources(cpus=cpus, memory_gb=memory_gb, tpu_type=tpu_type)
    raise ValueError(f"unknown accelerator {accelerator!r}; expected cpu, gpu, gpu-<n> or tpu-<v4|v5p|v5e|v6e>-<size>")


def wait_for_finish(status: Callable[[], JobRecord], timeout: float, poll_interval: float) -> JobRecord:
    """Poll `status()` until the job finishes or `timeout` seconds pass; the last record either way."""
    deadline = time.monotonic() + timeout
    record = status()
    while not record.status.finished and time.monotonic() < deadline:
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        record = status()
    return record
