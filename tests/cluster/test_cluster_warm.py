"""The warm process (tradewind.cluster.warm): warm jobs of a jobs folder run one after another in one process that
stays between them, and ends with a job that fails, is killed or leaves arrays behind, when it has been idle, when
a job brings another environment, or when released. Real processes on this machine: the jobs' callables are in a
small module written to the test's folder, found through PYTHONPATH."""

import json
import os
import signal
import textwrap

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend, Resources
from tradewind.cluster.process import process_alive
from tradewind.cluster.warm import release, warm_process

JOBS = '''
import json, os, sys, time


def report(path, text="hello"):
    """Print to the job's log and write where it ran."""
    print(text, flush=True)
    print(f"{text} on stderr", file=sys.stderr, flush=True)
    with open(path, "w") as out:
        json.dump({"pid": os.getpid(), "job": os.environ["TRADEWIND_JOB_ID"]}, out)


def fail():
    raise RuntimeError("this job fails")


def keep_an_array(path):
    import jax.numpy as jnp

    sys.modules[__name__].kept = jnp.ones(3)
    report(path)


def wait_for(started, never):
    """Say it has started, then wait (bounded) for a file that never comes: to be cancelled or killed."""
    with open(started, "w") as out:
        out.write(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not os.path.exists(never) and time.monotonic() < deadline:
        time.sleep(0.05)
'''


@pytest.fixture
def jobs(tmp_path):
    (tmp_path / "warmjobs.py").write_text(textwrap.dedent(JOBS), encoding="utf-8")
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4)
    yield backend
    for record in backend.list():
        if not record.status.finished:
            backend.cancel(record.id)
    release(backend.jobs_dir)


def warm_job(tmp_path, function: str, *args, **env) -> JobSpec:
    environment = {"PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu", **env}
    return JobSpec(name=function, callable=f"warmjobs:{function}", args=list(args), env=environment, warm=True)


def run(backend: LocalBackend, spec: JobSpec):
    return backend.wait(backend.submit(spec).id, timeout=120)


def test_warm_jobs_run_one_after_another_in_one_process_each_with_its_own_log_and_variables(jobs, tmp_path):
    first = run(jobs, warm_job(tmp_path, "report", str(tmp_path / "first.json"), "first job"))
    second = run(jobs, warm_job(tmp_path, "report", str(tmp_path / "second.json"), "second job"))
    assert first.status is second.status is JobStatus.SUCCEEDED
    ran = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("first", "second")]
    assert ran[0]["pid"] == ran[1]["pid"] == warm_process(jobs.jobs_dir)
    assert [r["job"] for r in ran] == [first.id, second.id]
    assert ran[0]["pid"] not in first.pids + second.pids  # the jobs' own processes handed their work over
    logs = [jobs.logs(record.id).text for record in (first, second)]
    assert "(started for this job)" in logs[0] and "(warm after 1 job)" in logs[1]
    assert "first job\nfirst job on stderr\n" in logs[0] and "second job" not in logs[0]
    assert "second job\nsecond job on stderr\n" in logs[1] and "first job" not in logs[1]
    assert "TRADEWIND_JOB_ID" not in os.environ  # nothing of a job leaks into the test either


def test_a_failed_job_ends_the_warm_process_and_the_next_job_gets_a_fresh_one(jobs, tmp_path):
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "before.json")))
    before = json.loads((tmp_path / "before.json").read_text())["pid"]
    failed = run(jobs, warm_job(tmp_path, "fail"))
    assert (failed.status, failed.exit_code) == (JobStatus.FAILED, 1)
    assert "RuntimeError: this job fails" in jobs.logs(failed.id).text
    wait_until(lambda: not process_alive(before), timeout=30, what="the warm process's end")
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "after.json")))
    assert json.loads((tmp_path / "after.json").read_text())["pid"] != before


def test_a_job_that_leaves_arrays_on_the_devices_ends_the_warm_process_after_it(jobs, tmp_path):
    done = run(jobs, warm_job(tmp_path, "keep_an_array", str(tmp_path / "ran.json")))
    assert done.status is JobStatus.SUCCEEDED
    pid = json.loads((tmp_path / "ran.json").read_text())["pid"]
    wait_until(lambda: not process_alive(pid), timeout=30, what="the warm process's end")
    assert "left 1 array(s) on the devices" in (jobs.jobs_dir / "warm.log").read_text()


@pytest.mark.parametrize("stop", ["cancel", "kill"])
def test_a_cancelled_or_killed_job_takes_the_warm_process_with_it(jobs, tmp_path, stop):
    started, never = tmp_path / "started", tmp_path / "never"
    record = jobs.submit(warm_job(tmp_path, "wait_for", str(started), str(never)))
    pid = int(wait_until(lambda: started.exists() and started.read_text(), timeout=60, what="the job's start"))
    assert pid == warm_process(jobs.jobs_dir)
    if stop == "cancel":
        jobs.cancel(record.id)
    else:
        os.kill(jobs.status(record.id).pid, signal.SIGKILL)  # the job's own process, as a preemption would
    done = jobs.wait(record.id, timeout=60)
    assert done.status is (JobStatus.CANCELLED if stop == "cancel" else JobStatus.PREEMPTED)
    wait_until(lambda: not process_alive(pid), timeout=30, what="the warm process's end")


def test_a_job_with_another_environment_retires_the_warm_process_and_starts_its_own(jobs, tmp_path):
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "a.json")))
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "b.json"), XLA_FLAGS="--xla_cpu_use_thunk_runtime=true"))
    first, second = (json.loads((tmp_path / f"{name}.json").read_text())["pid"] for name in "ab")
    assert first != second and not process_alive(first)
    assert warm_process(jobs.jobs_dir) == second


def test_an_idle_warm_process_ends_by_itself_and_release_ends_one_at_once(jobs, tmp_path):
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "idle.json"), TRADEWIND_WARM_IDLE_S="0.5"))
    idle = json.loads((tmp_path / "idle.json").read_text())["pid"]
    wait_until(lambda: not process_alive(idle), timeout=30, what="the idle warm process's end")
    run(jobs, warm_job(tmp_path, "report", str(tmp_path / "kept.json")))
    kept = json.loads((tmp_path / "kept.json").read_text())["pid"]
    assert release(jobs.jobs_dir) == kept and not process_alive(kept)
    assert warm_process(jobs.jobs_dir) is None and release(jobs.jobs_dir) is None


def test_with_warm_processes_off_a_warm_job_runs_in_its_own_process(jobs, tmp_path):
    done = run(jobs, warm_job(tmp_path, "report", str(tmp_path / "own.json"), TRADEWIND_WARM_IDLE_S="0"))
    assert json.loads((tmp_path / "own.json").read_text())["pid"] == done.pid
    assert warm_process(jobs.jobs_dir) is None


def test_the_local_backend_runs_its_tpu_jobs_warm_and_only_those(tmp_path):
    """A declared TPU (this machine has none): the job on it only asks for the working folder."""
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4, tpus=1, tpu_type="v5litepod-1")
    on_the_chip = Resources(accelerator="tpu-v5litepod-1")
    chip = JobSpec(name="chip", callable="os:getcwd", resources=on_the_chip)
    command = JobSpec(name="command", command=["true"], resources=on_the_chip)
    cpu = JobSpec(name="cpu", callable="os:getcwd")
    records = [backend.wait(backend.submit(spec).id, timeout=60) for spec in (chip, command, cpu)]
    assert [record.status for record in records] == [JobStatus.SUCCEEDED] * 3
    assert [record.spec.warm for record in records] == [True, False, False]
    assert "in the warm process" in backend.logs(records[0].id).text
    assert release(backend.jobs_dir) is not None


def test_warm_goes_with_a_callable_of_one_replica():
    with pytest.raises(ValueError, match="'warm' goes with a 'callable' of one replica"):
        JobSpec(name="x", command=["true"], warm=True)
    with pytest.raises(ValueError, match="'warm' goes with a 'callable' of one replica"):
        JobSpec(name="x", callable="os:getcwd", replicas=2, warm=True)
