"""The small process that runs one job and records how it went.

The local backend starts one supervisor per job, in a session of its own, so that the job outlives the
server that submitted it. The supervisor is the only writer of the job's record after submission: it
starts the job's process, records RUNNING with the pid, waits, and records the exit code and status.

Command (started by `LocalBackend.submit`, not by hand):
    python -m tradewind.cluster.supervisor <workspace>/jobs/<id>/job.json
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tradewind.cluster.jobs import JobRecord, JobStatus, utc_now
from tradewind.cluster.process import process_start_time
from tradewind.core import atomic_write_json, read_json

CANCEL_MARKER = "cancel-requested"


def save_record(path: Path, record: JobRecord) -> None:
    atomic_write_json(path, record.model_dump(mode="json"))


def load_record(path: Path) -> JobRecord:
    return JobRecord.model_validate(read_json(path))


def describe_exit(code: int) -> str | None:
    """A reason for a non-zero exit: the signal's name for a kill, or the exit code."""
    if code == 0:
        return None
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def supervise(record_path: Path) -> JobRecord:
    """Run the job described at `record_path` to completion, updating the record as it goes."""
    cancel_marker = record_path.parent / CANCEL_MARKER
    record = load_record(record_path)
    record.supervisor_pid = os.getpid()
    record.supervisor_start = process_start_time(os.getpid())
    if cancel_marker.exists():
        record.status, record.ended_at, record.reason = JobStatus.CANCELLED, utc_now(), "cancelled before it started"
        save_record(record_path, record)
        return record

    spec = record.spec
    Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab") as log:
        try:
            process = subprocess.Popen(
                spec.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,  # its own process group, so cancel can end the whole tree
            )
        except OSError as error:
            record.status, record.ended_at = JobStatus.FAILED, utc_now()
            record.reason = f"could not start {spec.command[0]!r}: {error}"
            save_record(record_path, record)
            return record
        record.status, record.pid, record.started_at = JobStatus.RUNNING, process.pid, utc_now()
        save_record(record_path, record)
        exit_code = process.wait()

    record.exit_code, record.ended_at = exit_code, utc_now()
    if cancel_marker.exists():
        record.status, record.reason = JobStatus.CANCELLED, "cancelled on request"
    elif exit_code == 0:
        record.status = JobStatus.SUCCEEDED
    else:
        record.status, record.reason = JobStatus.FAILED, describe_exit(exit_code)
    save_record(record_path, record)
    return record


if __name__ == "__main__":
    supervise(Path(sys.argv[1]))
