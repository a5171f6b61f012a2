"""The fork server: one process that imports a job's code once, and forks each local job's process from itself.

A callable job in a new Python process pays 2-3 s of imports (JAX, Flax, Optax, Orbax, the trainer) before it
does anything; a tiny CPU run's whole life is a few seconds more. So a supervisor (`supervisor.py`) asks the fork
server for its job's process instead of starting Python: the server imports the module of the job's callable
(once: each later job that names a module of it finds it imported) and forks a child, which becomes the job (a
session of its own, the job's environment, working folder and log) and calls it as `python -m
tradewind.cluster.entry` would. The child is an ordinary process with a pid of its own: the supervisor records
it, signals its process group to stop it, and a kill from outside is a preemption, as for any job. Only its
exit status comes another way: the server reaps the child and sends the status to the supervisor that asked.

Python and JAX read some settings once, as they import (the interpreter's `PYTHON*` variables, JAX's `JAX_*`,
Flax's), so one server serves only jobs whose such variables, interpreter and installed code are those it
started with (`environment_key`); a job with others gets a server of its own. Variables read later, when a job
opens its devices (`XLA_FLAGS`, libtpu's), take effect in the child as in a new process. The server imports only
Tradewind's modules, which open no device and start no thread as they are imported (JAX's neither), so every
fork is of a process with one thread. It ends `IDLE_ENV` seconds (`DEFAULT_IDLE_S`) after its last job. A child
dies with its server (Linux's parent-death signal), and its supervisor then reports it killed. Linux only;
`TRADEWIND_FORK_SERVER=0` starts every job in a new process.

Command (started by a supervisor, not by hand):
    python -m tradewind.cluster.forkserver <environment key>
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tradewind
from tradewind.cluster.entry import exit_after
from tradewind.cluster.jobs import JOB_VARIABLES, JobSpec
from tradewind.cluster.messages import abstract_address, accept, connect, listen, receive, send
from tradewind.cluster.process import process_alive, process_start_time

FORK_SERVER_ENV = "TRADEWIND_FORK_SERVER"  # "0": every job in a new process
IDLE_ENV = "TRADEWIND_FORK_SERVER_IDLE_S"
DEFAULT_IDLE_S = 300.0
READ_AT_IMPORT = ("PYTHON", "JAX_", "FLAX_")  # prefixes of the variables read once, while importing
REQUEST_TIMEOUT_S = 10.0  # a supervisor sends its request as soon as it connects
REPLY_TIMEOUT_S = 120.0  # the server answers once it has imported the job's module
PR_SET_PDEATHSIG = 1


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get(FORK_SERVER_ENV, "1") != "0"


def environment_key(environ: dict[str, str]) -> str:
    """What a fork server and its jobs must share: the variables read while importing, the interpreter, and the
    installed code (the size and time of each Tradewind source file, and of each site-packages folder, which an
    install or upgrade changes)."""
    read_at_import = sorted((name, value) for name, value in environ.items() if name.startswith(READ_AT_IMPORT))
    stamp = json.dumps([read_at_import, sys.executable, code_stamp()])
    return hashlib.sha256(stamp.encode()).hexdigest()


def code_stamp() -> list[tuple[str, int, int]]:
    sources = list(Path(tradewind.__file__).parent.rglob("*.py"))
    installs = [Path(entry) for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]
    stamps = []
    for path in sorted(sources + installs):
        with contextlib.suppress(OSError):
            stat = path.stat()
            stamps.append((str(path), stat.st_size, stat.st_mtime_ns))
    return stamps


def address(key: str) -> str:
    return abstract_address("fork-server", key)


def idle_s() -> float:
    return float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S))


# --- the supervisor's side -------------------------------------------------------------------------------------


class ForkedProcess:
    """A job's process forked by the fork server, with `subprocess.Popen`'s `pid`, `returncode`, `poll` and `wait`:
    its exit status comes from the server, over the connection that asked for it."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid = conn, pid
        self.start = process_start_time(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                message, _ = receive(self.conn)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(f"job process {self.pid}", timeout or 0) from None
            self.conn.close()
            if message is None:  # the server was killed, and its parent-death signal killed the job
                while process_alive(self.pid, self.start):
                    time.sleep(0.05)
                self.returncode = -signal.SIGKILL
            else:
                self.returncode = int(message["exit"])
        return self.returncode


def fork_job(spec: JobSpec, env: dict[str, str], log: int) -> ForkedProcess | None:
    """The process of one replica of callable job `spec`, forked by the fork server for `env` (started when none
    runs), with `env`, the spec's working folder and `log` as its output; None when the server is off or could
    not fork it (start the process the plain way then: the server never started the job)."""
    if not enabled():
        return None
    key = environment_key(env)
    try:
        conn = connect(address(key)) or start_server(key, env)
    except OSError:  # no process could be started: neither could the job's own, which says why
        return None
    if conn is None:
        return None
    with contextlib.ExitStack() as closing:
        closing.callback(conn.close)
        request = {"call": spec.call(), "env": env, "cwd": spec.cwd or os.getcwd()}
        conn.settimeout(REPLY_TIMEOUT_S)
        try:
            send(conn, request, fds=(log,))
            reply, _ = receive(conn)
            if reply is None:  # it was ending as we connected
                return None
            process = ForkedProcess(conn, reply["pid"])
            send(conn, {"go": True})  # the child waits for this: a supervisor gone by now leaves no job running
        except OSError:
            return None
        closing.pop_all()
    return process


def start_server(key: str, env: dict[str, str]) -> socket.socket | None:
    """Start a fork server for `key` with the environment `env` and connect to it (None when it did not start)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tradewind.cluster.forkserver", key],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # one line once it listens
        stderr=subprocess.DEVNULL,
        env={name: value for name, value in env.items() if name not in JOB_VARIABLES},  # this job's are its own
        start_new_session=True,  # it outlives this supervisor, and a stop of a job's group does not reach it
    )
    assert server.stdout is not None
    with server.stdout:
        server.stdout.readline()  # "listening" from the server, or nothing when another already listens
    server.wait()  # the server forked itself away: it is nobody's child, and this one has exited
    return connect(address(key))


# --- the server --------------------------------------------------------------------------------------------------


def serve(key: str) -> None:
    """Listen for jobs whose environment has `key` until idle for `idle_s()`; at once when another server does."""
    if os.fork():  # the parent returns to the supervisor that started it; the server goes on as nobody's child
        os._exit(0)
    listener = listen(address(key))
    if listener is None:
        return
    print("listening", flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    Server(listener).run()


def preload(callable_path: str) -> None:
    """Import the module of a Tradewind job's callable here, once, and the modules it names in `PRELOAD` (what its
    callable imports when called), so that every later child finds them imported. Not a module from elsewhere:
    one that started a thread as it was imported would make each later fork unsafe. One that fails to import
    fails again in the job, whose log says why."""
    name = callable_path.partition(":")[0]
    if not name.startswith("tradewind.") or name in sys.modules:
        return
    with contextlib.suppress(Exception):
        module = importlib.import_module(name)
        for also in getattr(module, "PRELOAD", ()):
            importlib.import_module(also)


class Server:
    """The loop: accept a supervisor's request, fork its job, and report each child's exit when it ends."""

    def __init__(self, listener: socket.socket):
        self.listener, self.pid, self.start_cwd = listener, os.getpid(), os.getcwd()
        self.children: dict[int, socket.socket] = {}  # each job's pid, and the connection of its supervisor
        # SIGCHLD wakes the loop through this pipe as soon as a job ends.
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_write)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)

    def run(self) -> None:
        last_busy = time.monotonic()
        while self.children or time.monotonic() - last_busy < idle_s():
            for event, _ in self.selector.select(timeout=max(idle_s() - (time.monotonic() - last_busy), 0.1)):
                try:
                    self.answer(event.fileobj)
                except Exception:
                    if os.getpid() != self.pid:
                        raise  # in a child, its job's error: it ends the process as it ends a job's own
                    # In the server, a request's trouble (fork refused, too many files) ends that request only:
                    # the server's end would kill every job it forked.
            self.reap()
            if self.children:
                last_busy = time.monotonic()

    def answer(self, source: Any) -> None:
        if source is self.wake_read:
            os.read(self.wake_read, 512)
        elif conn := accept(self.listener):
            with contextlib.ExitStack() as closing:
                closing.callback(conn.close)
                if self.fork_for(conn):
                    closing.pop_all()

    def fork_for(self, conn: socket.socket) -> bool:
        """Fork the process of `conn`'s job: the child becomes the job; this process tells the supervisor its pid.
        Returns whether it did (and keeps the connection to report the child's exit)."""
        conn.settimeout(REQUEST_TIMEOUT_S)
        request, fds = receive(conn)
        with contextlib.ExitStack() as closing:
            for fd in fds:
                closing.callback(os.close, fd)
            if len(fds) != 1 or not isinstance(request, dict) or not {"call", "env", "cwd"} <= request.keys():
                return False
            preload(request["call"]["callable"])
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self.close_in_child()
                # A copy: the job's exit unwinds this `with`, which closes the received descriptor once more.
                become_job(conn, request, log=os.dup(fds[0]), server=self)
        send(conn, {"pid": pid})  # if the supervisor is gone, the child, waiting for its word, sees that and ends
        self.children[pid] = conn
        return True

    def close_in_child(self) -> None:
        """What a child must not hold: the server's sockets (another job's supervisor would not see the server
        end while a child held its connection), its pipe and SIGCHLD handler."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        os.close(self.wake_read)
        os.close(self.wake_write)
        self.listener.close()
        for conn in self.children.values():
            conn.close()

    def reap(self) -> None:
        """Tell the supervisor of each child that has ended its exit status, as `subprocess` reports it."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with conn, contextlib.suppress(OSError):  # its supervisor may be gone
                    send(conn, {"exit": os.waitstatus_to_exitcode(status)})


def become_job(conn: socket.socket, request: dict[str, Any], log: int, server: Server) -> None:
    """In the forked child: wait for the supervisor's word, take the job's session, output, environment and
    working folder, run the call and exit as `python -m tradewind.cluster.entry` would."""
    os.setsid()  # a process group of its own, so that a stop ends the whole tree
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    conn.settimeout(None)
    try:
        word, _ = receive(conn)
    except OSError:
        word = None
    conn.close()
    # No word: the supervisor went before recording this process, and nobody would watch the job. Another
    # parent: the server ended before the death signal was set.
    if word is None or os.getppid() != server.pid:
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if sys.path and sys.path[0] == server.start_cwd:  # `python -m` puts the working folder first
        sys.path[0] = request["cwd"]
    call = request["call"]
    sys.argv = [sys.modules["tradewind.cluster.entry"].__file__, json.dumps(call)]
    exit_after(call)


if __name__ == "__main__":
    serve(sys.argv[1])
