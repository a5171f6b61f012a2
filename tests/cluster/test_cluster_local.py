import os
import signal
import time

import pytest

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.process import process_alive
from tradewind.core import NotFoundError


@pytest.fixture
def backend(tmp_path):
    return LocalBackend(tmp_path / "jobs")


def shell_job(tmp_path, script: str) -> JobSpec:
    return JobSpec(name="test", command=["bash", "-c", script], log_path=str(tmp_path / "job.log"))


def wait_for_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)
    return path.read_text().strip()


def test_successful_job_records_exit_code_and_log(backend, tmp_path):
    record = backend.submit(shell_job(tmp_path, "echo hello from the job"))
    assert record.status is JobStatus.PENDING
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.exit_code, done.reason) == (JobStatus.SUCCEEDED, 0, None)
    assert done.started_at and done.ended_at and done.pid
    assert (tmp_path / "job.log").read_text() == "hello from the job\n"


def test_failing_job_is_failed_with_its_exit_code(backend, tmp_path):
    done = backend.wait(backend.submit(shell_job(tmp_path, "echo oops >&2; exit 3")).id, timeout=30)
    assert (done.status, done.exit_code, done.reason) == (JobStatus.FAILED, 3, "exited with code 3")
    assert "oops" in (tmp_path / "job.log").read_text()


def test_missing_program_is_failed_with_a_reason(backend, tmp_path):
    spec = JobSpec(name="bad", command=["/no/such/program"], log_path=str(tmp_path / "job.log"))
    done = backend.wait(backend.submit(spec).id, timeout=30)
    assert done.status is JobStatus.FAILED
    assert "could not start '/no/such/program'" in done.reason


def test_cancel_ends_the_whole_process_group(backend, tmp_path):
    child_pid_file = tmp_path / "child.pid"
    record = backend.submit(shell_job(tmp_path, f"sleep 300 & echo $! > {child_pid_file}; wait"))
    child_pid = int(wait_for_file(child_pid_file))
    assert process_alive(child_pid)
    backend.cancel(record.id)
    done = backend.wait(record.id, timeout=30)
    assert done.status is JobStatus.CANCELLED
    deadline = time.monotonic() + 10
    while process_alive(child_pid):
        assert time.monotonic() < deadline, "the job's child process outlived the cancel"
        time.sleep(0.02)


def test_job_killed_from_outside_is_failed_with_the_signal(backend, tmp_path):
    record = backend.submit(shell_job(tmp_path, "sleep 300"))
    deadline = time.monotonic() + 10
    while (pid := backend.status(record.id).pid) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.reason) == (JobStatus.FAILED, "killed by signal SIGKILL")


def test_a_new_backend_reattaches_to_a_running_job(backend, tmp_path):
    release = tmp_path / "release"
    record = backend.submit(shell_job(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done; echo released"))
    deadline = time.monotonic() + 10
    while backend.status(record.id).status is not JobStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    restarted = LocalBackend(backend.jobs_dir)  # as a restarted server would: no process handles
    assert restarted.status(record.id).status is JobStatus.RUNNING
    release.touch()
    done = restarted.wait(record.id, timeout=30)
    assert done.status is JobStatus.SUCCEEDED
    assert [job.id for job in restarted.list()] == [record.id]


def test_vanished_supervisor_marks_the_job_failed(backend, tmp_path):
    record = backend.submit(shell_job(tmp_path, "sleep 300"))
    deadline = time.monotonic() + 10
    while (running := backend.status(record.id)).status is not JobStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(running.supervisor_pid, signal.SIGKILL)
    os.killpg(running.pid, signal.SIGKILL)  # clean up the orphaned job process
    restarted = LocalBackend(backend.jobs_dir)
    deadline = time.monotonic() + 10
    while (seen := restarted.status(record.id)).status is JobStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert seen.status is JobStatus.FAILED
    assert "supervising process vanished" in seen.reason


def test_unknown_job_id_is_not_found(backend):
    with pytest.raises(NotFoundError, match="unknown job id 'job-nope'"):
        backend.status("job-nope")
