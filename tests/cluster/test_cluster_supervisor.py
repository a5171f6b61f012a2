"""The spare supervisor a local backend keeps warm: it takes the next job, is replaced, and never lingers."""

import gc
import os
import signal
import sqlite3
import subprocess
import sys

from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.jobs import JobRecord
from tradewind.cluster.process import process_alive
from tradewind.cluster.supervisor import hand_over, spawn_spare


def shell_job(tmp_path, script: str) -> JobSpec:
    return JobSpec(name="test", command=["bash", "-c", script], log_path=str(tmp_path / "job.log"))


def warm_spare_pid(backend: LocalBackend) -> int:
    assert backend._spare is not None, "the backend keeps no spare supervisor"
    return backend._spare[0].pid


def dump(db_path) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        return list(conn.iterdump())


def test_a_job_submitted_to_a_used_backend_runs_in_its_warm_spare_and_a_new_spare_is_warmed(backend, tmp_path):
    assert backend.wait(backend.submit(shell_job(tmp_path, "true")).id, timeout=30).status is JobStatus.SUCCEEDED
    spare = warm_spare_pid(backend)
    done = backend.wait(backend.submit(shell_job(tmp_path, "echo in the spare")).id, timeout=30)
    assert (done.status, done.exit_code, done.supervisor_pid) == (JobStatus.SUCCEEDED, 0, spare)
    assert (tmp_path / "job.log").read_text() == "in the spare\n"
    following = warm_spare_pid(backend)
    assert following != spare and process_alive(following)
    assert (backend.jobs_dir / done.id / "supervisor.log").exists()


def test_a_spare_that_died_is_replaced_by_a_fresh_supervisor(backend, tmp_path):
    backend.wait(backend.submit(shell_job(tmp_path, "true")).id, timeout=30)
    dead = warm_spare_pid(backend)
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: not process_alive(dead), what="the spare dying")
    done = backend.wait(backend.submit(shell_job(tmp_path, "echo cold")).id, timeout=30)
    assert done.status is JobStatus.SUCCEEDED and done.supervisor_pid != dead
    assert (tmp_path / "job.log").read_text() == "cold\n"
    assert process_alive(warm_spare_pid(backend))


def test_a_spare_whose_stdin_closes_exits_without_changing_the_store(backend, tmp_path):
    # A queued job: a spare that scheduled or supervised anything would change its row.
    queued = JobRecord(id="job-queued", spec=JobSpec(name="queued", command=["true"]))
    with backend.store.transaction() as conn:
        backend.store.insert(queued, conn)
    before, files = dump(backend.store.path), sorted(os.listdir(backend.jobs_dir))
    spare = spawn_spare(backend.store.path)
    spare.stdin.close()
    assert spare.wait(timeout=60) == 0
    assert dump(backend.store.path) == before
    assert sorted(os.listdir(backend.jobs_dir)) == files


def test_a_spare_writes_its_errors_to_the_supervisor_log_of_the_job_it_was_handed(backend):
    spare = spawn_spare(backend.store.path)
    assert hand_over(spare, "job-ghost")
    assert spare.wait(timeout=60) != 0
    assert "unknown job id 'job-ghost'" in (backend.jobs_dir / "job-ghost" / "supervisor.log").read_text()


def test_a_dropped_backend_ends_its_spare(tmp_path):
    backend = LocalBackend(tmp_path / "jobs", cpus=2)
    backend.wait(backend.submit(shell_job(tmp_path, "true")).id, timeout=30)
    spare = warm_spare_pid(backend)
    del backend
    gc.collect()
    assert not process_alive(spare)


def test_the_spare_of_a_killed_server_exits_and_the_job_it_took_goes_on(tmp_path):
    jobs_dir, release = tmp_path / "jobs", tmp_path / "release"
    server = (
        "import sys; from tradewind.cluster import LocalBackend, JobSpec\n"
        f"b = LocalBackend({str(jobs_dir)!r}, cpus=2)\n"
        "b.wait(b.submit(JobSpec(name='first', command=['true'])).id, timeout=30)\n"
        f"script = 'while [ ! -e {release} ]; do sleep 0.05; done'\n"
        "spare = b._spare[0].pid\n"
        "b.submit(JobSpec(name='long', command=['bash', '-c', script]), job_id='job-long')\n"
        "print(spare, b._spare[0].pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", server], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    used, unused = (int(pid) for pid in process.stdout.readline().split())
    process.kill()  # no finalizer runs: the unused spare sees its stdin end
    process.wait()
    wait_until(lambda: not process_alive(unused), 60, "the killed server's unused spare exiting")
    backend = LocalBackend(jobs_dir)
    running = wait_until(lambda: (r := backend.status("job-long")).status is JobStatus.RUNNING and r)
    assert running.supervisor_pid == used and process_alive(used)
    release.touch()
    assert backend.wait("job-long", timeout=30).status is JobStatus.SUCCEEDED
    wait_until(lambda: not process_alive(used), 30, "the job's supervisor ending")
