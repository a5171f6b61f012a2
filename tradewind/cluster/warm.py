"""The warm process: one Python process per jobs folder that runs `warm` jobs one at a time and stays between them,
keeping the accelerator open and the programs it compiled loaded.

A job in a new process pays, before its first step, for Python and its imports, for opening the devices (5-7 s
for a TPU v5e chip, libtpu) and for loading its compiled programs from the compile cache (7 s for a 125M train
step, a 255 MB executable): 25 s of start for a run whose steps take 0.4 s (docs/reports/benchmarks.md, TPU
host). The local backend therefore marks the jobs on this host's TPU `warm`, and they run here instead: the
second run of a config finds JAX imported, the chip open and its train step compiled.

The supervisor still starts one process per job, as for any job: the job's *client*,
`python -m tradewind.cluster.warm <jobs dir> <call>`. The client hands the job and its standard output and
error (the job's log) to the warm process over a Unix socket, waits, and exits with the job's exit code. So
cancelling, timeouts and kills act on the client as on any job, and the warm process follows: when its client
ends before the job does, it ends at once (the job was killed, and so is everything it held). The warm process
keeps going only after a job that succeeded and left no array behind; it ends after `WARM_IDLE_ENV` seconds
without a job (`DEFAULT_IDLE_S`), or when asked (`release`), and so frees the chip.

Its environment is fixed at its start (JAX reads its settings once), so it serves only clients whose environment
is the same but for the job's own variables (`JOB_VARIABLES`). A client with another one asks it to retire and
starts a fresh one; with none running, the client starts one itself. `WARM_IDLE_ENV=0` runs warm jobs in their
own process, as any other job.

Commands (started by the supervisor and the client, not by hand):
    python -m tradewind.cluster.warm <jobs dir> '{"callable": "pkg.module:function", "args": [], "kwargs": {}}'
    python -m tradewind.cluster.warm --serve <jobs dir>
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tradewind.cluster.entry import run_call
from tradewind.cluster.jobs import JOB_ID_ENV, JOB_START_ENV, JOB_VARIABLES
from tradewind.cluster.messages import abstract_address, accept, connect, listen, receive, send
from tradewind.cluster.process import process_age, process_alive, process_start_time
from tradewind.core import atomic_write_text

SERVE_FLAG = "--serve"
WARM_IDLE_ENV = "TRADEWIND_WARM_IDLE_S"
DEFAULT_IDLE_S = 300.0
EXIT_WAIT_S = 120.0  # how long a client waits for a retiring warm process to let go of the chip


def idle_s() -> float:
    """Seconds a warm process waits for its next job (`WARM_IDLE_ENV`; 0: no warm process)."""
    return float(os.environ.get(WARM_IDLE_ENV, DEFAULT_IDLE_S))


def address(jobs_dir: Path) -> str:
    """The warm process's socket: one per jobs folder."""
    return abstract_address("warm", str(Path(jobs_dir).resolve()))


def environment_key(environ: dict[str, str] | os._Environ[str], cwd: str) -> str:
    """What a warm process and its clients must share: the environment but for a job's own variables, the
    working folder and the interpreter."""
    shared = sorted((name, value) for name, value in environ.items() if name not in JOB_VARIABLES)
    return hashlib.sha256(json.dumps([shared, cwd, sys.executable]).encode()).hexdigest()


def warm_log(jobs_dir: Path) -> Path:
    """`jobs/warm.log`: what the warm process says between jobs (its start, each job, why it ended)."""
    return Path(jobs_dir) / "warm.log"


# --- the client: the job's own process -------------------------------------------------------------------------


def run_as_client(jobs_dir: Path, call: dict[str, Any]) -> int:
    """Run `call` in the warm process of `jobs_dir` (started when none serves this environment), with this
    process's standard output and error; returns its exit code. Run here instead when warm processes are off."""
    if idle_s() <= 0:
        return run_call(call)
    own = {name: os.environ[name] for name in JOB_VARIABLES if name in os.environ}
    own[JOB_START_ENV] = str(time.time() - process_age())
    request = {"call": call, "env": own, "key": environment_key(os.environ, os.getcwd())}
    while True:
        conn = connect(address(jobs_dir)) or start_warm_process(jobs_dir)
        with conn:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                send(conn, request, fds=(sys.stdout.fileno(), sys.stderr.fileno()))
                reply, _ = receive(conn)
            except ConnectionError:  # it was ending as we connected (idle, released, another environment)
                continue
            if reply is None or reply.get("retiring"):  # it ended, or serves another environment
                continue
            print(f"[tradewind] in the warm process {reply['pid']} ({reply['state']})", file=sys.stderr, flush=True)
            result, _ = receive(conn)
        if result is None:
            print(f"[tradewind] the warm process {reply['pid']} ended during the job", file=sys.stderr, flush=True)
            return 1
        return int(result["exit"])


def start_warm_process(jobs_dir: Path) -> socket.socket:
    """Start a warm process for `jobs_dir` with this environment (the job's own variables left out) and connect.

    Raises:
        RuntimeError: it did not start (its reason is in `jobs/warm.log`).
    """
    if (previous := _last_warm_process(jobs_dir)) is not None:
        wait_for_exit(*previous)  # it lets go of the chip as it exits: the new one could not open it before
    environ = {name: value for name, value in os.environ.items() if name not in JOB_VARIABLES}
    with open(warm_log(jobs_dir), "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tradewind.cluster.warm", SERVE_FLAG, str(jobs_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # one line when it listens; then it writes to the log
            stderr=log,
            env=environ,
            start_new_session=True,  # it outlives this job, and a stop of the job's group does not reach it
        )
    assert process.stdout is not None
    with process.stdout:
        process.stdout.readline()  # its "listening" line, or nothing when it ended (another one serves the folder)
    conn = connect(address(jobs_dir))
    if conn is None:
        raise RuntimeError(f"the warm process did not start (exit code {process.poll()}); see {warm_log(jobs_dir)}")
    return conn


def wait_for_exit(pid: int, start: int | None, timeout_s: float = EXIT_WAIT_S) -> None:
    """Wait until process `pid` (started at `start`) has ended: closed its files, the chip's lock among them."""
    deadline = time.monotonic() + timeout_s
    while process_alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.05)


def release(jobs_dir: Path) -> int | None:
    """End the warm process of `jobs_dir` once its job (if any) is done, and wait until it has; returns its pid,
    or None when none runs. Frees what it holds (the host's TPU) for programs outside Tradewind."""
    conn = connect(address(jobs_dir))
    if conn is None:
        return None
    with conn, contextlib.suppress(ConnectionError):  # one that was ending as we connected has ended by now
        send(conn, {"release": True})
        receive(conn)
    ending = _last_warm_process(jobs_dir)
    if ending is None:
        return None
    wait_for_exit(*ending)
    return ending[0]


def pid_file(jobs_dir: Path) -> Path:
    """`jobs/warm.pid`: the pid and kernel start time of the folder's last warm process."""
    return Path(jobs_dir) / "warm.pid"


def warm_process(jobs_dir: Path) -> int | None:
    """The pid of the warm process of `jobs_dir` (serving, or ending and not yet gone), or None."""
    running = _last_warm_process(jobs_dir)
    return running[0] if running else None


def is_warm_process(pid: int, jobs_dir: Path) -> bool:
    """Whether process `pid` is the warm process of `jobs_dir`."""
    return warm_process(jobs_dir) == pid


def _last_warm_process(jobs_dir: Path) -> tuple[int, int | None] | None:
    """The pid and start time in `warm.pid`, while that process runs."""
    try:
        pid, start = (int(field) for field in pid_file(jobs_dir).read_text().split())
    except (OSError, ValueError):
        return None
    return (pid, start) if process_alive(pid, start) else None


# --- the warm process --------------------------------------------------------------------------------------------


def serve(jobs_dir: Path) -> None:
    """Listen on `address(jobs_dir)` and run its clients' jobs one at a time until idle, released or a job
    fails; returns at once when another warm process serves the folder."""
    listener = listen(address(jobs_dir))
    if listener is None:
        return
    atomic_write_text(pid_file(jobs_dir), f"{os.getpid()} {process_start_time(os.getpid())}\n")
    print("listening", flush=True)
    log = os.open(warm_log(jobs_dir), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, sys.stdout.fileno())
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)  # as a job's own process writing to its log: lines as they come
    key, jobs = environment_key(os.environ, os.getcwd()), 0
    say(f"warm process {os.getpid()} for {jobs_dir}: listening")
    listener.settimeout(idle_s())
    while True:
        try:
            conn = accept(listener)
        except TimeoutError:
            say(f"idle for {idle_s():g} s: ending")
            return
        if conn is None:
            continue
        with conn:
            request, fds = receive(conn)
            if request is None:
                continue
            if request.get("release"):
                listener.close()  # first: a client that comes now starts a new warm process
                send(conn, {"pid": os.getpid()})
                say("released")
                return
            if request["key"] != key:
                listener.close()
                send(conn, {"retiring": True, "pid": os.getpid()})
                say("a job with another environment came: ending, so that it starts its own")
                return
            state = f"warm after {jobs} job{'s' * (jobs > 1)}" if jobs else "started for this job"
            send(conn, {"pid": os.getpid(), "state": state})
            job = request["env"].get(JOB_ID_ENV, "?")
            say(f"job {job}: started")
            code = run_job(conn, request, output=fds)
            jobs += 1
            left = arrays_left()
            with contextlib.suppress(OSError):  # its client may have been killed just as the job ended
                send(conn, {"exit": code})
            if code != 0 or left:
                reason = f"it exited with code {code}" if code else f"it left {left} array(s) on the devices"
                say(f"job {job}: ended; {reason}, so this process ends too")
                return
            say(f"job {job}: succeeded")


def say(line: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}", flush=True)


def run_job(conn: socket.socket, request: dict[str, Any], output: list[int]) -> int:
    """Run the request's call in this thread (signal handlers and JAX's state are the main thread's), with the
    client's standard output and error and its job's variables; ends this process at once if the client goes."""
    done = threading.Event()

    def end_with_the_client() -> None:
        with contextlib.suppress(OSError):
            conn.recv(1)  # returns when the client closes: it was killed, or it has our answer
        if not done.is_set():
            os._exit(1)

    threading.Thread(target=end_with_the_client, name="client", daemon=True).start()
    saved = {name: os.environ.get(name) for name in request["env"]}
    own_output = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, target in zip(output, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.update(request["env"])
    try:
        code = run_call(request["call"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        done.set()
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(own_output, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return code


def arrays_left() -> int:
    """Arrays still alive on the devices after a job (none, when it let go of everything it made)."""
    gc.collect()
    jax = sys.modules.get("jax")
    return len(jax.live_arrays()) if jax is not None else 0


if __name__ == "__main__":
    if sys.argv[1] == SERVE_FLAG:
        serve(Path(sys.argv[2]))
    else:
        sys.exit(run_as_client(Path(sys.argv[1]), json.loads(sys.argv[2])))
