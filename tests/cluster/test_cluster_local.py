import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend, Resources
from tradewind.cluster.process import process_alive
from tradewind.core import InvalidInputError, NotFoundError


def shell_job(tmp_path, script: str, **settings) -> JobSpec:
    return JobSpec(name="test", command=["bash", "-c", script], log_path=str(tmp_path / "job.log"), **settings)


def wait_for_file(path, timeout=20.0):
    wait_until(lambda: path.exists() and path.read_text().strip(), timeout, f"{path} written")
    return path.read_text().strip()


def test_successful_job_records_exit_code_and_log(backend, tmp_path):
    record = backend.submit(shell_job(tmp_path, "echo hello from the job"))
    assert record.status is JobStatus.PENDING
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.exit_code, done.reason) == (JobStatus.SUCCEEDED, 0, None)
    assert done.started_at and done.ended_at and done.pid and done.attempts == 1
    assert (tmp_path / "job.log").read_text() == "hello from the job\n"


def test_state_is_kept_in_a_sqlite_database_with_a_rollback_journal_so_readers_create_no_files(backend, tmp_path):
    import sqlite3

    backend.wait(backend.submit(shell_job(tmp_path, "true"), job_id="job-a").id, timeout=30)
    with sqlite3.connect(backend.jobs_dir / "cluster.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert conn.execute("SELECT id, status FROM jobs").fetchall() == [("job-a", "SUCCEEDED")]
    assert not (backend.jobs_dir / "job-a" / "job.json").exists()
    files = sorted(p.name for p in backend.jobs_dir.iterdir())
    assert LocalBackend(backend.jobs_dir, read_only=True).status("job-a").status is JobStatus.SUCCEEDED
    assert sorted(p.name for p in backend.jobs_dir.iterdir()) == files


def test_a_database_of_an_earlier_version_in_wal_mode_is_moved_to_a_rollback_journal(tmp_path):
    import sqlite3

    (tmp_path / "jobs").mkdir()
    with sqlite3.connect(tmp_path / "jobs" / "cluster.sqlite") as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    LocalBackend(tmp_path / "jobs")
    with sqlite3.connect(tmp_path / "jobs" / "cluster.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_a_read_only_backend_reads_a_workspace_without_jobs_as_empty_and_refuses_to_change_anything(tmp_path):
    backend = LocalBackend(tmp_path / "jobs", read_only=True)
    assert backend.list() == [] and backend.cluster_status().queued == []
    with pytest.raises(NotFoundError, match="unknown job id 'job-x'"):
        backend.status("job-x")
    with pytest.raises(InvalidInputError, match="opened read-only"):
        backend.submit(shell_job(tmp_path, "true"))
    with pytest.raises(InvalidInputError, match="opened read-only"):
        backend.cancel("job-x")
    assert not (tmp_path / "jobs").exists()


def test_failing_job_is_failed_with_its_exit_code(backend, tmp_path):
    done = backend.wait(backend.submit(shell_job(tmp_path, "echo oops >&2; exit 3")).id, timeout=30)
    assert (done.status, done.exit_code, done.reason) == (JobStatus.FAILED, 3, "exited with code 3")
    assert "oops" in (tmp_path / "job.log").read_text()


def test_missing_program_is_failed_with_a_reason(backend, tmp_path):
    spec = JobSpec(name="bad", command=["/no/such/program"], log_path=str(tmp_path / "job.log"))
    done = backend.wait(backend.submit(spec).id, timeout=30)
    assert done.status is JobStatus.FAILED
    assert "could not start '/no/such/program'" in done.reason


def test_a_callable_entrypoint_runs_with_its_arguments(backend, tmp_path):
    (tmp_path / "src.txt").write_text("copied")
    spec = JobSpec(name="copy", callable="shutil:copyfile", args=[str(tmp_path / "src.txt"), str(tmp_path / "dst.txt")])
    done = backend.wait(backend.submit(spec).id, timeout=60)
    assert done.status is JobStatus.SUCCEEDED, backend.logs(done.id).text
    assert (tmp_path / "dst.txt").read_text() == "copied"


def test_a_spec_needs_exactly_one_entrypoint():
    with pytest.raises(ValueError, match="exactly one entrypoint"):
        JobSpec(name="none")
    with pytest.raises(ValueError, match="exactly one entrypoint"):
        JobSpec(name="both", command=["true"], callable="os:getcwd")
    with pytest.raises(ValueError, match="unknown TPU type"):
        Resources(accelerator="tpu-v9-weird")


def test_logs_are_read_by_offset_in_pages(backend, tmp_path):
    done = backend.wait(backend.submit(shell_job(tmp_path, "printf 'one\\ntwo\\nthree é\\n'")).id, timeout=30)
    pages, offset = [], 0
    while True:
        chunk = backend.logs(done.id, offset=offset, limit=4)
        if not chunk.text:
            break
        pages.append(chunk.text)
        offset = chunk.next_offset
    assert "".join(pages) == "one\ntwo\nthree é\n"
    assert chunk.finished and chunk.size == offset == len("one\ntwo\nthree é\n".encode())


def test_cancel_ends_the_whole_process_group(backend, tmp_path):
    child_pid_file = tmp_path / "child.pid"
    record = backend.submit(shell_job(tmp_path, f"sleep 300 & echo $! > {child_pid_file}; wait"))
    child_pid = int(wait_for_file(child_pid_file))
    assert process_alive(child_pid)
    backend.cancel(record.id)
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.reason) == (JobStatus.CANCELLED, "cancelled on request")
    wait_until(lambda: not process_alive(child_pid), what="the job's child process ending after cancel")


def test_job_killed_from_outside_without_retries_is_preempted(backend, tmp_path):
    record = backend.submit(shell_job(tmp_path, "sleep 300"))
    pid = wait_until(lambda: backend.status(record.id).pid)
    os.killpg(pid, signal.SIGKILL)
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.reason, done.preemptions) == (JobStatus.PREEMPTED, "killed by signal SIGKILL", 1)


def test_job_killed_from_outside_is_retried_and_succeeds(backend, tmp_path):
    first = tmp_path / "first-attempt"
    script = f"if [ ! -e {first} ]; then touch {first}; sleep 300; else echo second attempt; fi"
    record = backend.submit(shell_job(tmp_path, script, max_retries_preemption=1))
    wait_until(first.exists)
    pid = wait_until(lambda: backend.status(record.id).pid)
    os.killpg(pid, signal.SIGKILL)  # as a preempted machine would: the whole group, from outside
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.exit_code, done.attempts, done.preemptions) == (JobStatus.SUCCEEDED, 0, 2, 1)
    assert "second attempt" in backend.logs(record.id).text


def test_failing_job_is_retried_up_to_its_failure_limit(backend, tmp_path):
    counter = tmp_path / "count"
    script = f"echo x >> {counter}; exit 1"
    done = backend.wait(backend.submit(shell_job(tmp_path, script, max_retries_failure=2)).id, timeout=30)
    assert (done.status, done.attempts, done.failures) == (JobStatus.FAILED, 3, 3)
    assert counter.read_text() == "x\nx\nx\n"


def test_job_past_its_timeout_is_killed_and_failed_with_the_reason(backend, tmp_path):
    pid_file = tmp_path / "pid"
    record = backend.submit(shell_job(tmp_path, f"echo $$ > {pid_file}; sleep 300", timeout_s=1))
    done = backend.wait(record.id, timeout=30)
    assert done.status is JobStatus.FAILED
    assert done.reason == "timed out after 1 s (timeout_s) and was killed"
    assert not process_alive(int(pid_file.read_text()))


def test_twenty_concurrent_submissions_never_oversubscribe_the_ledger(backend, tmp_path):
    running_dir = tmp_path / "running"
    running_dir.mkdir()
    seen = tmp_path / "seen"
    # Each job registers itself, records how many jobs run right now, works briefly, deregisters.
    script = (
        f"touch {running_dir}/$TRADEWIND_JOB_ID; ls {running_dir} | wc -l >> {seen}; "
        f"sleep 0.3; rm {running_dir}/$TRADEWIND_JOB_ID"
    )
    spec = shell_job(tmp_path, script, resources=Resources(cpus=1, memory_gb=1))
    ids = []

    def submit_from_own_backend():  # separate backends, as separate servers would be
        ids.append(LocalBackend(backend.jobs_dir).submit(spec).id)

    threads = [threading.Thread(target=submit_from_own_backend) for _ in range(20)]
    for thread in threads:
        thread.start()
    used_seen = []
    for thread in threads:
        thread.join()
    assert len(ids) == 20

    def all_finished() -> bool:
        used_seen.append(backend.cluster_status().used["cpus"])
        return all(backend.status(job_id).status.finished for job_id in ids)

    wait_until(all_finished, 120, "20 short jobs all finishing", interval=0.05)
    assert all(backend.status(job_id).status is JobStatus.SUCCEEDED for job_id in ids)
    counts = [int(line) for line in seen.read_text().split()]
    assert len(counts) == 20 and max(counts) <= 2
    assert max(used_seen, default=0) <= 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"resources": Resources(cpus=1.5), "replicas": 2},
            "needs 1.5 CPUs per replica x 2 replicas = 3 CPUs but this backend has 2 CPUs (capacity: 2 CPUs, "
            "4 GiB memory, 0 GPUs); ask for less per replica or fewer replicas, or use backend 'ray'",
        ),
        (
            {"resources": Resources(accelerator="gpu")},
            "needs 1 GPU per replica but this backend has 0 GPUs (capacity: 2 CPUs, 4 GiB memory, 0 GPUs); "
            "use accelerator 'cpu', run where a GPU is, or use backend 'ray'",
        ),
        (
            {"resources": Resources(accelerator="tpu-v5litepod-8")},
            "asks for TPU 'v5litepod-8', but this host has no TPU chip; run it on a TPU VM, or set backend 'ray'",
        ),
    ],
)
def test_a_job_that_can_never_fit_is_refused_saying_what_it_asks_what_there_is_and_what_to_change(
    tmp_path, settings, message
):
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4, gpus=0)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        backend.submit(shell_job(tmp_path, "true", **settings))
    assert backend.list() == []


def test_a_queued_job_past_its_pending_timeout_fails_with_what_it_waits_for_and_frees_nothing(backend, tmp_path):
    release = tmp_path / "release"
    holder = backend.submit(
        shell_job(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done", resources=Resources(cpus=2))
    )
    wait_until(lambda: backend.status(holder.id).status is JobStatus.RUNNING)
    impatient = backend.submit(shell_job(tmp_path, "echo never", resources=Resources(cpus=1), pending_timeout_s=1))
    patient = backend.submit(shell_job(tmp_path, "echo later", resources=Resources(cpus=1)))
    done = backend.wait(impatient.id, timeout=30)
    assert (done.status, done.pid, done.attempts) == (JobStatus.FAILED, None, 0)
    assert done.reason == (
        "not started within pending_timeout_s=1 s: it needs 1 CPU, 0 GiB memory, 0 GPUs and this backend has "
        f"2 CPUs, 4 GiB memory, 0 GPUs, with 2 CPUs, 0 GiB memory, 0 GPUs in use by {holder.id}"
    )
    status = backend.cluster_status()
    assert status.used["cpus"] == 2 and [j.id for j in status.queued] == [patient.id]
    assert backend.status(holder.id).status is JobStatus.RUNNING
    release.touch()
    assert backend.wait(patient.id, timeout=30).status is JobStatus.SUCCEEDED
    assert backend.status(impatient.id).status is JobStatus.FAILED


def test_a_queued_job_past_its_pending_timeout_is_failed_by_the_supervisor_that_frees_its_resources(backend, tmp_path):
    release, started = tmp_path / "release", tmp_path / "started"
    script = f"touch {started}; while [ ! -e {release} ]; do sleep 0.05; done"
    holder = backend.submit(shell_job(tmp_path, script, resources=Resources(cpus=2)))
    wait_until(started.exists)
    impatient = backend.submit(shell_job(tmp_path, "echo never", resources=Resources(cpus=1), pending_timeout_s=0.5))
    deadline = datetime.fromisoformat(impatient.submitted_at).timestamp() + 0.5
    wait_until(lambda: time.time() > deadline, what="the queued job's pending timeout passing")
    release.touch()  # the holder's supervisor ends it and schedules; nobody looks at the queued job meanwhile
    wait_until(lambda: backend.store.get(impatient.id).record.status.finished, what="the supervisor failing it")
    done = backend.store.get(impatient.id).record
    assert done.status is JobStatus.FAILED and done.reason.startswith("not started within pending_timeout_s=0.5 s")
    assert backend.wait(holder.id, timeout=30).status is JobStatus.SUCCEEDED


def test_a_queued_job_waits_for_resources_and_can_be_cancelled_before_it_starts(backend, tmp_path):
    release = tmp_path / "release"
    big = backend.submit(
        shell_job(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done", resources=Resources(cpus=2))
    )
    wait_until(lambda: backend.status(big.id).status is JobStatus.RUNNING)
    queued = backend.submit(shell_job(tmp_path, "echo never", resources=Resources(cpus=1)))
    later = backend.submit(shell_job(tmp_path, "echo later", resources=Resources(cpus=1)))
    status = backend.cluster_status()
    assert [j.id for j in status.queued] == [queued.id, later.id] and status.used["cpus"] == 2
    assert backend.cancel(queued.id).status is JobStatus.CANCELLED
    release.touch()
    assert backend.wait(later.id, timeout=30).status is JobStatus.SUCCEEDED
    assert backend.status(queued.id).pid is None


def test_a_gang_of_two_replicas_gets_coordinator_process_id_and_count(backend, tmp_path):
    script = 'echo "$TRADEWIND_COORDINATOR_ADDRESS $TRADEWIND_PROCESS_ID $TRADEWIND_PROCESS_COUNT"'
    done = backend.wait(backend.submit(shell_job(tmp_path, script, replicas=2)).id, timeout=30)
    assert done.status is JobStatus.SUCCEEDED and len(done.pids) == 2
    lines = [backend.logs(done.id, replica=i).text.split() for i in range(2)]
    assert lines[0][0] == lines[1][0] and lines[0][0].startswith("127.0.0.1:")
    assert [line[1:] for line in lines] == [["0", "2"], ["1", "2"]]


def test_a_failing_replica_stops_the_rest_of_its_gang(backend, tmp_path):
    script = 'if [ "$TRADEWIND_PROCESS_ID" = 1 ]; then exit 4; fi; sleep 300'
    done = backend.wait(backend.submit(shell_job(tmp_path, script, replicas=2)).id, timeout=30)
    assert (done.status, done.reason) == (JobStatus.FAILED, "exited with code 4")
    assert not any(process_alive(pid) for pid in done.pids)


def test_a_restarted_server_reattaches_to_a_running_job(tmp_path):
    jobs_dir, release = tmp_path / "jobs", tmp_path / "release"
    server = (
        "import sys; from tradewind.cluster import LocalBackend, JobSpec\n"
        f"b = LocalBackend({str(jobs_dir)!r}, cpus=2)\n"
        f"script = 'while [ ! -e {release} ]; do sleep 0.05; done; exit 0'\n"
        "spec = JobSpec(name='long', command=['bash', '-c', script])\n"
        "print(b.submit(spec, job_id='job-long').id, flush=True)\n"
        "sys.stdin.read()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", server], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "job-long"
    backend = LocalBackend(jobs_dir)
    running = wait_until(lambda: (r := backend.status("job-long")).status is JobStatus.RUNNING and r)
    process.kill()  # the server dies mid-job
    process.wait()
    restarted = LocalBackend(jobs_dir)
    assert restarted.status("job-long").status is JobStatus.RUNNING
    assert process_alive(running.supervisor_pid, running.supervisor_start)
    release.touch()
    done = restarted.wait("job-long", timeout=30)
    assert (done.status, done.exit_code, done.pid) == (JobStatus.SUCCEEDED, 0, running.pid)
    assert [job.id for job in restarted.list()] == ["job-long"]


def test_a_vanished_supervisor_is_reported_failed_by_reads_and_recorded_with_its_processes_stopped_by_a_submit(
    backend, tmp_path
):
    record = backend.submit(shell_job(tmp_path, "sleep 300", resources=Resources(cpus=2)))
    running = wait_until(lambda: (r := backend.status(record.id)).status is JobStatus.RUNNING and r)
    queued = backend.submit(shell_job(tmp_path, "echo after", resources=Resources(cpus=1)))
    os.kill(running.supervisor_pid, signal.SIGKILL)
    restarted = LocalBackend(backend.jobs_dir)
    seen = wait_until(lambda: (r := restarted.status(record.id)).status is not JobStatus.RUNNING and r)
    assert seen.status is JobStatus.FAILED and "supervising process vanished" in seen.reason
    assert [job.status for job in restarted.list()] == [JobStatus.PENDING, JobStatus.FAILED]
    status = restarted.cluster_status()
    assert (status.used["cpus"], [j.id for j in status.queued], status.running) == (0, [queued.id], [])
    # Reading wrote nothing and started nothing: the row still says RUNNING, the job's process lives on.
    assert restarted.store.get(record.id).record.status is JobStatus.RUNNING
    assert process_alive(running.pid, running.pid_starts[0])
    assert restarted.status(queued.id).status is JobStatus.PENDING
    restarted.submit(shell_job(tmp_path, "true", resources=Resources(cpus=0)))  # whoever changes things records it
    assert restarted.store.get(record.id).record.status is JobStatus.FAILED
    assert not process_alive(running.pid, running.pid_starts[0])
    assert restarted.wait(queued.id, timeout=30).status is JobStatus.SUCCEEDED


def test_a_job_queued_behind_a_vanished_one_is_started_by_a_running_jobs_supervisor_without_any_call(backend, tmp_path):
    release = tmp_path / "release"
    backend.submit(shell_job(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done", resources=Resources(cpus=1)))
    doomed = backend.submit(shell_job(tmp_path, "sleep 300", resources=Resources(cpus=1)))
    running = wait_until(lambda: (r := backend.status(doomed.id)).status is JobStatus.RUNNING and r)
    queued = backend.submit(shell_job(tmp_path, "echo after", resources=Resources(cpus=1)))
    os.kill(running.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: backend.store.get(queued.id).record.status is JobStatus.SUCCEEDED, 30, "the queued job ran")
    assert backend.store.get(doomed.id).record.status is JobStatus.FAILED
    assert not process_alive(running.pid, running.pid_starts[0])
    release.touch()


def test_unknown_job_id_is_not_found(backend):
    with pytest.raises(NotFoundError, match="unknown job id 'job-nope'"):
        backend.status("job-nope")


def test_job_records_of_the_earlier_json_layout_stay_visible(tmp_path):
    from tradewind.core import atomic_write_json

    old = {"id": "run-old", "spec": {"name": "train", "command": ["true"], "log_path": "x.log"}, "status": "SUCCEEDED"}
    atomic_write_json(tmp_path / "jobs" / "run-old" / "job.json", {**old, "submitted_at": "2026-12-01T00:00:00+00:00"})
    atomic_write_json(tmp_path / "jobs" / "run-lost" / "job.json", {**old, "id": "run-lost", "status": "RUNNING"})
    backend = LocalBackend(tmp_path / "jobs")
    assert backend.status("run-old").status is JobStatus.SUCCEEDED
    lost = backend.status("run-lost")
    assert lost.status is JobStatus.FAILED and "earlier Tradewind version" in lost.reason


@pytest.mark.slow
def test_two_local_replicas_initialise_jax_distributed_from_the_gang_environment(backend, tmp_path):
    code = (
        "import jax; from tradewind.cluster import distributed_env\n"
        "d = distributed_env()\n"
        "jax.distributed.initialize(d.coordinator_address, d.process_count, d.process_id)\n"
        "print('jax', jax.process_index(), jax.process_count())\n"
    )
    spec = JobSpec(name="jax gang", command=[sys.executable, "-c", code], replicas=2, timeout_s=180)
    done = backend.wait(backend.submit(spec).id, timeout=200)
    logs = [backend.logs(done.id, replica=i).text for i in range(2)]
    assert done.status is JobStatus.SUCCEEDED, logs
    assert [log.strip().splitlines()[-1] for log in logs] == ["jax 0 2", "jax 1 2"]


def test_declared_capacity_is_kept_for_later_backends_on_the_same_folder(tmp_path):
    LocalBackend(tmp_path / "jobs", cpus=3)
    later = LocalBackend(tmp_path / "jobs", memory_gb=5)
    assert (later.capacity.cpus, later.capacity.memory_gb) == (3, 5)
    assert LocalBackend(tmp_path / "jobs").capacity.model_dump() == later.capacity.model_dump()


def test_an_admitted_job_whose_submitter_died_before_starting_it_is_started_by_the_next_submit(tmp_path):
    from tradewind.cluster.jobs import JobRecord
    from tradewind.cluster.store import JobStore

    backend = LocalBackend(tmp_path / "jobs", cpus=2)
    # The state a server leaves when it dies between admitting a job and starting its supervisor.
    store = JobStore(backend.jobs_dir / "cluster.sqlite")
    record = JobRecord(id="job-orphan", spec=JobSpec(name="orphan", command=["true"]), log_path=str(tmp_path / "o.log"))
    with store.transaction() as conn:
        store.insert(record, conn)
        conn.execute("UPDATE jobs SET admitted = ? WHERE id = ?", (time.time() - 3600, record.id))
    later = LocalBackend(backend.jobs_dir)
    assert later.wait(record.id, timeout=0.5).status is JobStatus.PENDING  # a look starts nothing
    later.submit(JobSpec(name="next", command=["true"]))
    done = later.wait(record.id, timeout=30)
    assert (done.status, done.exit_code, done.attempts) == (JobStatus.SUCCEEDED, 0, 1)


def test_a_second_supervisor_for_a_claimed_job_leaves_it_alone(backend, tmp_path):
    release = tmp_path / "release"
    record = backend.submit(shell_job(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done"))
    running = wait_until(lambda: (r := backend.status(record.id)).status is JobStatus.RUNNING and r)
    second = subprocess.run(
        [sys.executable, "-m", "tradewind.cluster.supervisor", str(backend.store.path), record.id], timeout=60
    )
    assert second.returncode == 0
    release.touch()
    done = backend.wait(record.id, timeout=30)
    assert (done.status, done.attempts, done.supervisor_pid) == (JobStatus.SUCCEEDED, 1, running.supervisor_pid)


def test_a_cancelled_jobs_supervisor_is_reaped_at_once_leaving_no_zombie_child(backend, tmp_path):
    import psutil

    record = backend.submit(shell_job(tmp_path, "sleep 300"))
    running = wait_until(lambda: (r := backend.status(record.id)).status is JobStatus.RUNNING and r)
    backend.cancel(record.id)
    # Reaped, its pid leaves the process table; a zombie would stay there until someone waited on it.
    wait_until(lambda: not psutil.pid_exists(running.supervisor_pid), 30, "the cancelled job's supervisor reaped")
    assert not [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
