"""The fork server: a callable job's process is forked from a process that has imported the trainer for an earlier
job, and is in every way a job's process (its own session, pid, environment, working folder, log, exit status,
kill)."""

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.forkserver import FORK_SERVER_ENV, address, start_server
from tradewind.cluster.messages import connect, receive, send
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


NOBODY = 65534
# Another user's process: connects to the server's address and asks it to write `target` (stdlib only).
INTRUDER = textwrap.dedent(
    """
    import json, os, socket, sys
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(bytes.fromhex(sys.argv[1]).decode())
    call = {"callable": "tradewind.core:atomic_write_json", "args": [sys.argv[2]], "kwargs": {"obj": "written"}}
    request = {"call": call, "env": {}, "cwd": "/"}
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], [os.open(os.devnull, os.O_WRONLY)])
        print(conn.recv(1000).decode() or "hung up")
    except OSError:  # closed as it sent (a broken pipe, a reset)
        print("hung up")
    """
)


def python_for_nobody() -> str | None:
    """A Python that user `nobody` may run (this venv's may lie in a folder only root may enter)."""
    for candidate in (sys.executable, sys._base_executable, "/usr/bin/python3"):
        with contextlib.suppress(OSError):
            if candidate and subprocess.run([candidate, "-I", "-S", "-c", "pass"], user=NOBODY).returncode == 0:
                return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may run a process as another user")
def test_a_fork_server_hangs_up_on_another_users_process(tmp_path):
    # An abstract socket has no file permissions: the server itself must refuse a request from another user.
    python = python_for_nobody()
    if python is None:
        pytest.skip("no Python here that user nobody may run")
    key = f"test-{tmp_path}"
    conn = start_server(key, dict(os.environ))
    assert conn is not None
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    conn.close()
    try:
        target = tmp_path / "target.json"
        tmp_path.chmod(0o777)
        intruder = [python, "-I", "-S", "-c", INTRUDER, address(key).encode().hex(), str(target)]
        refused = subprocess.run(intruder, user=NOBODY, capture_output=True, text=True, timeout=60)
        assert refused.stdout.strip() == "hung up", refused
        # The same request from this user is forked: the reply names the child, which ends without running the call
        # when its asker goes without the word to go.
        own = subprocess.run(intruder, capture_output=True, text=True, timeout=60)
        assert '"pid"' in own.stdout, own
        assert not target.exists()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_malformed_request_is_hung_up_on_and_the_server_forks_the_next_job(tmp_path):
    # The server's end would kill every job it forked: one bad request must end that request only.
    key = f"test-{tmp_path}"
    conn = start_server(key, dict(os.environ))
    assert conn is not None
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    try:
        with conn:
            send(conn, {"call": "not a call"})  # and no log
            assert receive(conn) == (None, [])
        with connect(address(key)) as conn, open(os.devnull, "wb") as log:
            send(conn, {"call": {"no": "callable"}, "env": {}, "cwd": "/"}, fds=(log.fileno(),))
            assert receive(conn) == (None, [])
        with connect(address(key)) as conn, open(os.devnull, "wb") as log:
            request = {"call": {"callable": "os:getcwd"}, "env": {}, "cwd": str(tmp_path)}
            send(conn, request, fds=(log.fileno(),))
            reply, _ = receive(conn)
            assert set(reply) == {"pid"}
            send(conn, {"go": True})
            assert receive(conn) == ({"exit": 0}, [])
    finally:
        os.kill(pid, signal.SIGKILL)
