"""The local backend: every job is a process on this machine, watched by its own supervisor.

Job records live under `<workspace>/jobs/<id>/job.json`, so a restarted server finds every job again.
A record that says RUNNING while its supervisor is gone (machine reboot, `kill -9` of the supervisor)
is reported as FAILED with that reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus, utc_now
from tradewind.cluster.process import process_alive
from tradewind.cluster.supervisor import CANCEL_MARKER, load_record, save_record
from tradewind.core import NotFoundError, check_id, make_id


class LocalBackend:
    """Submit, inspect, wait for and cancel jobs that run as local processes.

    Args:
        jobs_dir: folder that holds one sub-folder per job (normally `Workspace.jobs_dir`).
    """

    def __init__(self, jobs_dir: str | os.PathLike[str]):
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        # Supervisors we started ourselves must be reaped, or they linger as zombies that look alive.
        self._supervisors: dict[str, subprocess.Popen[bytes]] = {}

    def _record_path(self, job_id: str) -> Path:
        return self.jobs_dir / check_id(job_id, "job_id") / "job.json"

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Start `spec` in the background and return its PENDING record at once."""
        job_id = job_id or make_id("job")
        path = self._record_path(job_id)
        path.parent.mkdir(parents=True, exist_ok=False)
        record = JobRecord(id=job_id, spec=spec)
        save_record(path, record)
        with open(path.parent / "supervisor.log", "ab") as supervisor_log:
            self._supervisors[job_id] = subprocess.Popen(
                [sys.executable, "-m", "tradewind.cluster.supervisor", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=supervisor_log,
                start_new_session=True,  # the job outlives a server that exits or is killed
            )
        return record

    def status(self, job_id: str) -> JobRecord:
        """The job's current record; raises `NotFoundError` for an unknown id."""
        path = self._record_path(job_id)
        if not path.exists():
            raise NotFoundError(f"unknown job id {job_id!r} (no record under {self.jobs_dir})")
        record = load_record(path)
        if record.status.finished:
            return record
        handle = self._supervisors.get(job_id)
        if handle is not None:
            supervisor_gone = handle.poll() is not None
        elif record.supervisor_pid is not None:
            supervisor_gone = not process_alive(record.supervisor_pid, record.supervisor_start)
        else:
            return record  # submitted by another server a moment ago; its supervisor has not reported yet
        if supervisor_gone:
            record = load_record(path)  # the supervisor may have finished between our two reads
            if not record.status.finished:
                record.status, record.ended_at = JobStatus.FAILED, utc_now()
                record.reason = "the supervising process vanished before the job finished (killed or machine restart)"
                save_record(path, record)
        return record

    def wait(self, job_id: str, timeout: float, poll_interval: float = 0.25) -> JobRecord:
        """Wait until the job finishes or `timeout` seconds pass; return its record either way."""
        deadline = time.monotonic() + timeout
        record = self.status(job_id)
        while not record.status.finished and time.monotonic() < deadline:
            time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
            record = self.status(job_id)
        return record

    def cancel(self, job_id: str) -> JobRecord:
        """Ask the job to stop: its whole process group gets SIGTERM; the record ends CANCELLED."""
        record = self.status(job_id)
        if record.status.finished:
            return record
        (self._record_path(job_id).parent / CANCEL_MARKER).touch()
        if record.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
                os.killpg(record.pid, signal.SIGTERM)
        return self.status(job_id)

    def list(self) -> list[JobRecord]:
        """Every job's record, newest first."""
        ids = sorted((p.parent.name for p in self.jobs_dir.glob("*/job.json")), reverse=True)
        return [self.status(job_id) for job_id in ids]
