"""`run.json`: the record of one training run, kept in its folder so that every interface finds it.

Whoever starts a run writes it first: the launcher (`launch_training`, `tradewind train`) as PENDING with
the backend and job id that run it, or the trainer itself when `train()` is called from Python with no
job around it (backend "process"). The trainer's process 0 then records RUNNING, and SUCCEEDED or FAILED
with the reason when it ends. A process killed from outside cannot write anything: for a run with a
local job, the job's supervisor then records how the job ended (`record_job_end`, the job's `on_end`,
set by `job_end_callback`), so the record ends as the tools report it; for a "process" run the reader
checks whether the recorded process is still alive. This module imports no JAX, so tools read records
while runs train.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from tradewind.cluster.jobs import Callback, JobRecord, JobStatus, utc_now
from tradewind.cluster.placement import BackendName, Placement
from tradewind.cluster.process import process_start_time
from tradewind.core import NotFoundError, atomic_write_bytes, atomic_write_json, read_json_config
from tradewind.core.buckets import join_url, upload_files
from tradewind.core.files import Opener, open_plain
from tradewind.runs.layout import RunLayout, bucket_outputs, run_url

RunBackend = Literal[BackendName, "process"]
RECORD_JOB_END_CALLABLE = "tradewind.runs.record:record_job_end"


class LedgerEntry(BaseModel):
    """What a launch tells the experiment ledger about a run: the change it makes to which run, and why."""

    parent_run: str | None = Field(default=None, description="The run this one changes.")
    note: str | None = Field(default=None, max_length=300, description="One line for the ledger.")
    sweep_id: str | None = Field(default=None, description="The sweep that launched it.")


class RunRecord(LedgerEntry):
    """Which run this is, what runs it, and how it stands as far as its own processes know."""

    run_id: str
    backend: RunBackend = Field(description="'local' or 'ray' (a job runs it), or 'process' (a Python call).")
    job_id: str | None = Field(default=None, description="The backend job that runs it; null for 'process'.")
    address: str | None = Field(default=None, description="The Ray cluster the job was submitted to.")
    placement: Placement = Field(default_factory=Placement, description="Where the launch placed its processes.")
    accelerator_note: str | None = Field(
        default=None,
        description="Why it trains where it does, if the launch chose; what the launch changed so that it fits.",
    )
    processes: int = Field(default=1, description="Processes (hosts) training it together.")
    platform: str | None = Field(default=None, description="JAX platform it trains on: cpu, gpu or tpu.")
    devices: int | None = Field(default=None, description="JAX devices over all its processes.")
    parent: str | None = Field(default=None, description="The run this one continues (resume_from).")
    parent_step: int | None = Field(default=None, description="The parent's checkpoint step it started from.")
    decision: Literal["kept", "discarded"] | None = Field(
        default=None, description="What became of the experiment (set_experiment_status, or a sweep)."
    )
    decision_reason: str | None = Field(default=None, description="Why it was kept or discarded.")
    base_digest: str | None = Field(
        default=None, description="A LoRA run's: sha256 of its base's weight files (init_from) when it first trained."
    )
    load_start: float | None = Field(default=None, description="1-minute load average per core when it started.")
    load_end: float | None = Field(default=None, description="1-minute load average per core when it ended.")
    concurrent_runs: int | None = Field(default=None, description="Other runs of the workspace active at launch.")
    status: JobStatus = JobStatus.PENDING
    created_at: str = Field(default_factory=utc_now)
    started_at: str | None = None
    ended_at: str | None = None
    host: str | None = Field(default=None, description="Machine of process 0.")
    pid: int | None = Field(default=None, description="Process id of process 0 while it trains.")
    pid_start: int | None = Field(default=None, description="Kernel start time of `pid` (to tell a reused pid).")
    reason: str | None = Field(default=None, description="Why the run failed, in the trainer's words.")


def read_record(path: str | os.PathLike[str], opener: Opener = open_plain) -> RunRecord:
    """Read a `run.json`, opened with `opener` (a tool passes its workspace's confined reader).

    Raises:
        NotFoundError: there is none (not a run folder, or one made by an older Tradewind).
        ConfigError: it is not a run record; the message names the file and what is wrong.
        PathEscapeError: `opener` refused it, as a link that leads outside the workspace.
    """
    if not os.path.lexists(path):  # what is there (a link, a FIFO) is for `opener` to judge
        raise NotFoundError(f"no run record {Path(path).name} in {Path(path).parent}")
    return read_json_config(RunRecord, path, opener)


def write_record(path: str | os.PathLike[str], record: RunRecord) -> None:
    atomic_write_json(path, record.model_dump(mode="json"))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the record's lock: the trainer and the tools (a decision, a sweep) each read, change and write it."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_record(path: str | os.PathLike[str], **changes: object) -> RunRecord:
    """Change some fields of the record at `path`, with no other writer in between; returns the new record."""
    with _locked(Path(path)):
        record = read_record(path).model_copy(update=changes)
        write_record(path, record)
    return record


def machine_load() -> float:
    """The 1-minute load average per CPU core: about 1.0 when every core is busy."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def record_start(path: Path, run_id: str, processes: int, platform: str, devices: int) -> RunRecord:
    """Mark the run RUNNING in this process (process 0), creating the record for a run with no launcher."""
    if not path.exists():
        write_record(path, RunRecord(run_id=run_id, backend="process"))
    pid = os.getpid()
    return update_record(
        path,
        status=JobStatus.RUNNING,
        started_at=read_record(path).started_at or utc_now(),  # a restarted run keeps its first start
        ended_at=None,
        reason=None,
        host=socket.gethostname(),
        pid=pid,
        pid_start=process_start_time(pid),
        processes=processes,
        platform=platform,
        devices=devices,
        load_start=machine_load(),
    )


def record_end(path: Path, status: JobStatus, reason: str | None = None) -> None:
    """Mark the run finished as `status` (SUCCEEDED, or FAILED with the reason)."""
    update_record(path, status=status, ended_at=utc_now(), reason=reason, load_end=machine_load())


def record_job_end(path: str, job: JobRecord) -> None:
    """A training job's `on_end`: a record still PENDING or RUNNING when its job ended (the trainer was killed,
    or never started) takes the job's status, end time and reason; one the trainer finished stays as it is
    (its own words beat an exit code). The end time is the job's, so readers see the two agree. A run that
    lives in a bucket (`storage`) first gets its record, metrics and summary back from there, and sends its log
    there."""
    with _locked(Path(path)):
        record = read_record(path)
        if record.placement.storage is not None:  # the trainer wrote its record and outputs to the bucket
            for name, data in bucket_outputs(record.placement.storage, record.run_id).items():
                atomic_write_bytes(Path(path).parent / name, data)
            # ... and the job's log, which its backend wrote here, joins them (on Ray, Ray keeps it instead)
            log = RunLayout(Path(path).parent).log
            upload_files(log.parent, run_url(record.placement.storage, record.run_id), (log.name,))
            record = read_record(path)
        if not record.status.finished:
            ended = {"status": job.status, "ended_at": job.ended_at, "reason": job.reason}
            write_record(path, record.model_copy(update=ended))


def checkpoints_of(layout: RunLayout, opener: Opener = open_plain) -> str | Path:
    """Where the run's checkpoints are: its folder's `checkpoints/`, or its bucket's for a run with `storage`
    (as its record, opened with `opener`, says)."""
    storage = read_record(layout.record, opener).placement.storage if os.path.lexists(layout.record) else None
    return join_url(run_url(storage, layout.root.name), "checkpoints") if storage else layout.checkpoints


def job_end_callback(path: str | os.PathLike[str]) -> Callback:
    """The `on_end` of the job that trains the run whose record is at `path` (see `record_job_end`)."""
    return Callback(callable=RECORD_JOB_END_CALLABLE, kwargs={"path": str(path)})
