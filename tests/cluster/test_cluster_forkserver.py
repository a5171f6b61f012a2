"""The fork server: a callable job's process is forked from a process that has imported the trainer for an earlier
job, and is in every way a job's process (its own session, pid, environment, working folder, log, exit status,
kill)."""

import json
import os
import signal
import textwrap
from pathlib import Path

from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.forkserver import FORK_SERVER_ENV
from tradewind.cluster.process import process_alive

# Run in the job's process, as its callable (`runpy.run_path`): what that process is, before it imports anything.
FACTS = textwrap.dedent(
    """
    import json, os, sys, time
    trainer_imported = "tradewind.trainer.loop" in sys.modules  # train_job's PRELOAD
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    import jax
    facts = {
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
        "parent": open(f"/proc/{os.getppid()}/cmdline").read().replace("\\0", " "),
        "trainer_imported": trainer_imported, "x64": jax.config.jax_enable_x64, "colour": os.environ.get("COLOUR"),
    }
    with open(os.environ["FACTS"] + ".tmp", "w") as out:
        json.dump(facts, out)
    os.rename(os.environ["FACTS"] + ".tmp", os.environ["FACTS"])
    time.sleep(float(os.environ.get("LINGER", "0")))
    sys.exit(int(os.environ.get("EXIT", "0")))
    """
)


def facts_job(tmp_path: Path, name: str, **env: str) -> JobSpec:
    script = tmp_path / "facts.py"
    script.write_text(FACTS)
    folder = tmp_path / f"cwd-{name}"
    folder.mkdir()
    return JobSpec(
        name=name,
        callable="runpy:run_path",
        args=[str(script)],
        env={"FACTS": str(tmp_path / f"{name}.json"), **env},
        cwd=str(folder),
        log_path=str(tmp_path / f"{name}.log"),
    )


def read_facts(tmp_path: Path, name: str) -> dict:
    path = tmp_path / f"{name}.json"
    wait_until(path.exists, 60, f"{name}'s facts")
    return json.loads(path.read_text())


def train_with_no_arguments(backend, **env: str) -> None:
    """A training job that fails at once, having had the fork server import the trainer."""
    spec = JobSpec(name="no arguments", callable="tradewind.trainer.start:train_job", env=env)
    done = backend.wait(backend.submit(spec).id, timeout=120)
    assert (done.status, done.exit_code) == (JobStatus.FAILED, 1)
    assert "run_dir: Field required" in backend.logs(done.id).text


def test_a_callable_job_is_forked_with_the_trainer_imported_in_a_session_of_its_own(backend, tmp_path):
    train_with_no_arguments(backend)
    done = backend.wait(backend.submit(facts_job(tmp_path, "plain", COLOUR="teal")).id, timeout=120)
    assert (done.status, done.exit_code) == (JobStatus.SUCCEEDED, 0)
    facts = read_facts(tmp_path, "plain")
    assert "tradewind.cluster.forkserver" in facts["parent"] and facts["ppid"] != done.supervisor_pid
    assert facts["trainer_imported"], "the job's process should find the trainer imported by the server"
    assert facts["pid"] == done.pid == facts["sid"]  # recorded, and the leader of its own session
    assert (facts["cwd"], facts["colour"]) == (str(tmp_path / "cwd-plain"), "teal")
    assert (tmp_path / "plain.log").read_text() == "to stdout\nto stderr\n"


def test_with_the_fork_server_off_a_job_is_a_new_python(tmp_path, monkeypatch):
    monkeypatch.setenv(FORK_SERVER_ENV, "0")  # the backend's supervisors read it
    backend = LocalBackend(tmp_path / "jobs", cpus=2, memory_gb=4)
    done = backend.wait(backend.submit(facts_job(tmp_path, "off")).id, timeout=120)
    facts = read_facts(tmp_path, "off")
    assert done.status is JobStatus.SUCCEEDED
    assert (facts["ppid"], facts["trainer_imported"]) == (done.supervisor_pid, False)


def test_a_job_with_other_jax_settings_gets_a_server_that_imported_with_them(backend, tmp_path):
    train_with_no_arguments(backend, JAX_ENABLE_X64="1")
    plain = backend.wait(backend.submit(facts_job(tmp_path, "plain")).id, timeout=120)
    wide = backend.wait(backend.submit(facts_job(tmp_path, "x64", JAX_ENABLE_X64="1")).id, timeout=120)
    assert plain.status is wide.status is JobStatus.SUCCEEDED
    plain_facts, wide_facts = read_facts(tmp_path, "plain"), read_facts(tmp_path, "x64")
    assert (plain_facts["x64"], wide_facts["x64"]) == (False, True)
    assert plain_facts["ppid"] != wide_facts["ppid"] and wide_facts["trainer_imported"]


def test_an_exit_code_and_a_kill_from_outside_mean_what_they_mean_for_a_new_process(backend, tmp_path):
    failed = backend.wait(backend.submit(facts_job(tmp_path, "fails", EXIT="3")).id, timeout=120)
    assert (failed.status, failed.exit_code, failed.reason) == (JobStatus.FAILED, 3, "exited with code 3")

    killed = backend.submit(facts_job(tmp_path, "killed", LINGER="60"))
    os.kill(read_facts(tmp_path, "killed")["pid"], signal.SIGKILL)
    done = backend.wait(killed.id, timeout=60)
    assert (done.status, done.reason) == (JobStatus.PREEMPTED, "killed by signal SIGKILL")

    cancelled = backend.submit(facts_job(tmp_path, "cancelled", LINGER="60"))
    pid = read_facts(tmp_path, "cancelled")["pid"]
    backend.cancel(cancelled.id)
    assert backend.wait(cancelled.id, timeout=60).status is JobStatus.CANCELLED
    assert not process_alive(pid)


def test_a_job_ends_with_its_fork_server_and_is_reported_killed(backend, tmp_path):
    # A variable JAX reads as it imports gives this job a server of its own: other tests' jobs are not killed.
    job = backend.submit(facts_job(tmp_path, "orphan", LINGER="60", JAX_TRADEWIND_TEST=str(tmp_path)))
    facts = read_facts(tmp_path, "orphan")
    os.kill(facts["ppid"], signal.SIGKILL)  # the server: its children get its death signal
    done = backend.wait(job.id, timeout=60)
    assert (done.status, done.reason) == (JobStatus.PREEMPTED, "killed by signal SIGKILL")
    assert not process_alive(facts["pid"])
