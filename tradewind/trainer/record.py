"""`run.json`: the record of one training run, kept in its folder so that every interface finds it.

Whoever starts a run writes it first: the launcher (`launch_training`, `tradewind train`) as PENDING with
the backend and job id that run it, or the trainer itself when `train()` is called from Python with no
job around it (backend "process"). The trainer's process 0 then records RUNNING, and SUCCEEDED or FAILED
with the reason when it ends. A process killed from outside cannot write anything; for a run with a job
the job's backend knows what happened, and for a "process" run the reader checks whether the recorded
process is still alive. This module imports no JAX, so tools read records while runs train.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from tradewind.cluster.jobs import JobStatus, utc_now
from tradewind.cluster.process import process_start_time
from tradewind.core import ConfigError, NotFoundError, atomic_write_json, parse_config, read_json

RunBackend = Literal["local", "ray", "process"]


class RunRecord(BaseModel):
    """Which run this is, what runs it, and how it stands as far as its own processes know."""

    run_id: str
    backend: RunBackend = Field(description="'local' or 'ray' (a job runs it), or 'process' (a Python call).")
    job_id: str | None = Field(default=None, description="The backend job that runs it; null for 'process'.")
    address: str | None = Field(default=None, description="The Ray cluster the job was submitted to.")
    accelerator: str = "cpu"
    processes: int = Field(default=1, description="Processes (hosts) training it together.")
    platform: str | None = Field(default=None, description="JAX platform it trains on: cpu, gpu or tpu.")
    devices: int | None = Field(default=None, description="JAX devices over all its processes.")
    parent: str | None = Field(default=None, description="The run this one continues (resume_from).")
    parent_step: int | None = Field(default=None, description="The parent's checkpoint step it started from.")
    status: JobStatus = JobStatus.PENDING
    created_at: str = Field(default_factory=utc_now)
    started_at: str | None = None
    ended_at: str | None = None
    host: str | None = Field(default=None, description="Machine of process 0.")
    pid: int | None = Field(default=None, description="Process id of process 0 while it trains.")
    pid_start: int | None = Field(default=None, description="Kernel start time of `pid` (to tell a reused pid).")
    reason: str | None = Field(default=None, description="Why the run failed, in the trainer's words.")


def read_record(path: str | os.PathLike[str]) -> RunRecord:
    """Read a `run.json`.

    Raises:
        NotFoundError: there is none (not a run folder, or one made by an older Tradewind).
        ConfigError: it is not a run record; the message names the file and what is wrong.
    """
    if not os.path.isfile(path):
        raise NotFoundError(f"no run record {Path(path).name} in {Path(path).parent}")
    try:
        data = read_json(path)
    except ValueError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    return parse_config(RunRecord, data, source=str(path))


def write_record(path: str | os.PathLike[str], record: RunRecord) -> None:
    atomic_write_json(path, record.model_dump(mode="json"))


def record_start(path: Path, run_id: str, accelerator: str, processes: int, platform: str, devices: int) -> RunRecord:
    """Mark the run RUNNING in this process (process 0), creating the record for a run with no launcher."""
    try:
        record = read_record(path)
    except NotFoundError:
        record = RunRecord(run_id=run_id, backend="process", accelerator=accelerator)
    pid = os.getpid()
    record = record.model_copy(
        update={
            "status": JobStatus.RUNNING,
            "started_at": record.started_at or utc_now(),
            "ended_at": None,
            "reason": None,
            "host": socket.gethostname(),
            "pid": pid,
            "pid_start": process_start_time(pid),
            "processes": processes,
            "platform": platform,
            "devices": devices,
        }
    )
    write_record(path, record)
    return record


def record_end(path: Path, status: JobStatus, reason: str | None = None) -> None:
    """Mark the run finished as `status` (SUCCEEDED, or FAILED with the reason)."""
    record = read_record(path).model_copy(update={"status": status, "ended_at": utc_now(), "reason": reason})
    write_record(path, record)
