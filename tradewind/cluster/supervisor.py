"""The small process that runs one admitted job, retries it by its policy and records how it went.

The local backend starts one supervisor per admitted job, in a session of its own, so that the job
outlives the server that submitted it. The supervisor starts the job's replicas (each in its own
process group), records RUNNING with their pids and start times, and waits, watching for a cancel
request and the timeout. An attempt that ends by a signal it did not send (SIGKILL, SIGTERM, SIGINT,
SIGHUP from outside) is a preemption; any other non-zero exit is a failure. Each kind is retried up to
its own limit. When the job ends the supervisor frees its resources, calls the spec's `on_end` (if any)
with the final record, and starts queued jobs that now fit. While its job runs it also looks after the
rest of the workspace about once a second (`RECONCILE_S`): reads never write, so supervisors are who
record a peer whose supervisor vanished (stopping its replicas), fail queued jobs past their
`pending_timeout_s` and start queued jobs that fit (`ledger.reconcile`). It reaps the supervisors it starts.

A backend keeps one *spare* supervisor warm: started ahead of time, it has loaded everything and waits
for one job id line on its stdin, so an admitted job does not wait for a Python start and its imports.
Handed an id, it redirects its stderr to the job's `supervisor.log` and runs as a normal supervisor; it
no longer needs the backend. At end of input (nobody handed it a job, or the backend's process ended)
it exits without touching the store.

Commands (started by the backend, not by hand):
    python -m tradewind.cluster.supervisor <workspace>/jobs/cluster.sqlite <job id>
    python -m tradewind.cluster.supervisor --spare <workspace>/jobs/cluster.sqlite   # job id on stdin
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tradewind.cluster.entry import load_callable
from tradewind.cluster.forkserver import ForkedProcess, fork_job
from tradewind.cluster.jobs import (
    ATTEMPT_ENV,
    COORDINATOR_ENV,
    JOB_ID_ENV,
    LOCAL_DIR_ENV,
    PROCESS_COUNT_ENV,
    PROCESS_ID_ENV,
    JobRecord,
    JobStatus,
    utc_now,
)
from tradewind.cluster.ledger import CAPACITY_KEY, Capacity, reconcile, unsettled
from tradewind.cluster.process import process_alive, process_start_time
from tradewind.cluster.store import ACTIVE, JobRow, JobStore
from tradewind.core import InvalidInputError
from tradewind.core.files import open_append

PREEMPTION_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
STOP_GRACE_S = 5.0
POLL_S = 0.1
RECONCILE_S = 1.0  # how often a running job's supervisor looks after the other jobs of the workspace
SPARE_FLAG = "--spare"


def describe_exit(code: int) -> str | None:
    """A reason for a non-zero exit: the signal's name for a kill, or the exit code."""
    if code == 0:
        return None
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def replica_log(jobs_dir: Path, record: JobRecord, replica: int) -> Path:
    """Replica 0 writes to the job's log; the others to `jobs/<id>/replica-<n>.log`."""
    if replica == 0:
        return Path(record.log_path or jobs_dir / record.id / "job.log")
    return jobs_dir / record.id / f"replica-{replica}.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def signal_groups(pids: list[int], starts: list[int | None], sig: signal.Signals) -> list[tuple[int, int | None]]:
    """Send `sig` to the process group of each pid still alive as the same process; returns those."""
    live = [(pid, start) for pid, start in zip(pids, starts, strict=False) if process_alive(pid, start)]
    for pid, _ in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
    return live


def stop_groups(pids: list[int], starts: list[int | None], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process group, then SIGKILL what is left after `grace_s`."""
    live = signal_groups(pids, starts, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(process_alive(pid, start) for pid, start in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def supervisor_log(db_path: Path, job_id: str) -> Path:
    """`jobs/<id>/supervisor.log`: what the job's supervisor writes to stderr (tracebacks)."""
    folder = db_path.parent / job_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "supervisor.log"


def spawn_supervisor(db_path: Path, job_id: str) -> subprocess.Popen[bytes]:
    """Start the supervisor of an admitted job in a session of its own."""
    with open(supervisor_log(db_path, job_id), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tradewind.cluster.supervisor", str(db_path), job_id],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # the job outlives a server that exits or is killed
        )


def spawn_spare(db_path: Path) -> subprocess.Popen[bytes]:
    """Start a spare supervisor for the jobs in `db_path`: it loads now and waits for `hand_over`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tradewind.cluster.supervisor", SPARE_FLAG, str(db_path)],
        bufsize=0,  # one unbuffered write hands a job over, or fails at once
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # until it has a job; then that job's supervisor.log
        start_new_session=True,  # as `spawn_supervisor`: the job outlives the server
    )


def hand_over(spare: subprocess.Popen[bytes], job_id: str) -> bool:
    """Give admitted job `job_id` to `spare`; False when the spare has died (start a fresh supervisor then)."""
    assert spare.stdin is not None
    try:
        with spare.stdin:  # closed after the one line: the spare needs nothing more from us
            spare.stdin.write(f"{job_id}\n".encode())
    except (BrokenPipeError, ValueError):  # ValueError: its stdin was closed already
        return False
    return True


def dismiss_spare(spare: subprocess.Popen[bytes]) -> None:
    """End a spare that was never handed a job (it holds nothing yet) and reap it."""
    if spare.stdin is not None:
        spare.stdin.close()
    spare.kill()
    spare.wait()


def serve_as_spare(db_path: Path) -> None:
    """Wait for one job id line on stdin, then supervise that job; end of input ends the spare quietly."""
    job_id = sys.stdin.readline().strip()
    if not job_id:
        return  # dismissed, or the backend's process ended before it needed us
    log = os.open(supervisor_log(db_path, job_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, sys.stderr.fileno())
    os.close(log)
    supervise(db_path, job_id)


def schedule(store: JobStore) -> list[subprocess.Popen[bytes]]:
    """Reconcile the workspace's jobs (`ledger.reconcile`): stop the replicas of jobs whose supervisor
    vanished, and start the supervisors of the jobs it admits; returns their handles (the caller reaps them)."""
    capacity = Capacity.model_validate(store.get_meta(CAPACITY_KEY))
    start, vanished = reconcile(store, capacity)
    for record in vanished:
        stop_groups(record.pids, record.pid_starts)
    return [spawn_supervisor(store.path, job_id) for job_id in start]


class Peers:
    """What a supervisor does for the other jobs of the workspace while its own runs: reconcile every
    `RECONCILE_S` when there is something to record (a cheap read first), and reap the supervisors it started."""

    def __init__(self, store: JobStore):
        self.store = store
        self.started: list[subprocess.Popen[bytes]] = []
        self.next_look = time.monotonic() + RECONCILE_S

    def look(self) -> None:
        self.started = [p for p in self.started if p.poll() is None]
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + RECONCILE_S
        if unsettled(self.store.rows(ACTIVE)):
            self.started += schedule(self.store)


class Attempt:
    """One start of every replica of a job, and the wait for them."""

    def __init__(self, store: JobStore, record: JobRecord):
        self.store, self.record, self.spec = store, record, record.spec
        self.processes: list[subprocess.Popen[bytes] | ForkedProcess] = []
        self.starts: list[int | None] = []

    def start(self) -> str | None:
        """Start the replicas; returns an error message when one could not start."""
        spec, record = self.spec, self.record
        base = {**os.environ, **spec.env, JOB_ID_ENV: record.id, ATTEMPT_ENV: str(record.attempts)}
        gang = {}
        if spec.replicas > 1:
            gang = {COORDINATOR_ENV: f"127.0.0.1:{free_port()}", PROCESS_COUNT_ENV: str(spec.replicas)}
        for replica in range(spec.replicas):
            log_path = replica_log(self.store.path.parent, record, replica)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            env = {**base, **gang, PROCESS_ID_ENV: str(replica)} if gang else dict(base)
            env[LOCAL_DIR_ENV] = str(self.store.path.parent / record.id / f"replica-{replica}")
            try:
                log = open_append(log_path)
            except InvalidInputError as error:
                self.stop()
                return f"could not open its log: {error}"
            with log:
                process = fork_job(spec, env, log.fileno()) if spec.command is None and not spec.warm else None
                try:
                    process = process or subprocess.Popen(
                        spec.argv(jobs_dir=self.store.path.parent),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=spec.cwd,
                        start_new_session=True,  # its own process group, so a stop ends the whole tree
                    )
                except OSError as error:
                    self.stop()
                    return f"could not start {spec.argv()[0]!r}: {error}"
            self.processes.append(process)
            self.starts.append(process_start_time(process.pid))
        return None

    def stop(self) -> None:
        stop_groups([p.pid for p in self.processes], self.starts)
        for process in self.processes:
            process.wait()

    def wait(self, peers: Peers) -> tuple[str, int | None]:
        """Wait for the replicas, looking after `peers` meanwhile; returns (outcome, exit code), outcome one of
        succeeded, failed, preempted, cancelled, timed_out."""
        deadline = time.monotonic() + self.spec.timeout_s if self.spec.timeout_s else None
        first_bad: int | None = None
        next_cancel_check = 0.0
        while True:
            codes = [p.poll() for p in self.processes]
            if first_bad is None:
                first_bad = next((c for c in codes if c not in (None, 0)), None)
                if first_bad is not None:  # one replica of a gang failed: the others cannot go on
                    self.stop()
                    codes = [p.returncode for p in self.processes]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if now >= next_cancel_check:
                next_cancel_check = now + 0.25
                if self.store.cancel_requested(self.record.id):
                    self.stop()
                    return "cancelled", self.processes[0].returncode
            if deadline is not None and now >= deadline:
                self.stop()
                return "timed_out", self.processes[0].returncode
            peers.look()
            still_running = next(p for p, code in zip(self.processes, codes, strict=True) if code is None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                still_running.wait(timeout=POLL_S)
        if self.store.cancel_requested(self.record.id):
            return "cancelled", first_bad if first_bad is not None else codes[0]
        if first_bad is None:
            return "succeeded", 0
        if first_bad < 0 and signal.Signals(-first_bad) in PREEMPTION_SIGNALS:
            return "preempted", first_bad
        return "failed", first_bad


def _finish(
    store: JobStore, job_id: str, status: JobStatus, exit_code: int | None, reason: str | None, counts: JobRecord
) -> JobRecord:
    def change(row: JobRow) -> JobRecord:
        record = row.record
        record.failures, record.preemptions = counts.failures, counts.preemptions
        record.status, record.exit_code, record.reason, record.ended_at = status, exit_code, reason, utc_now()
        return record

    return store.update(job_id, change)


def supervise(db_path: Path, job_id: str) -> JobRecord:
    """Run job `job_id` to a terminal state, with retries, call its `on_end`, then start queued jobs that fit."""
    store = JobStore(db_path)
    try:
        record = _supervise(store, job_id, Peers(store))
        if record.supervisor_pid == os.getpid() and record.status.finished:
            _call_on_end(record)
        return record
    finally:
        schedule(store)  # its children outlive it: once it exits they are reparented and reaped


def _call_on_end(record: JobRecord) -> None:
    """Call the spec's `on_end` with the final record; a failing one is logged (supervisor.log), not fatal."""
    hook = record.spec.on_end
    if hook is None:
        return
    try:
        load_callable(hook.callable)(*hook.args, **hook.kwargs, job=record)
    except Exception:
        traceback.print_exc()


def _supervise(store: JobStore, job_id: str, peers: Peers) -> JobRecord:
    claimed = {"ok": False}

    def claim(row: JobRow) -> JobRecord | None:
        r = row.record
        if r.status.finished or (r.supervisor_pid is not None and process_alive(r.supervisor_pid, r.supervisor_start)):
            return None  # a restarted spawn raced a slow original: exactly one supervisor runs a job
        r.supervisor_pid, r.supervisor_start = os.getpid(), process_start_time(os.getpid())
        claimed["ok"] = True
        return r

    record = store.update(job_id, claim)
    if not claimed["ok"]:
        return record
    while True:
        if store.cancel_requested(job_id):
            return _finish(store, job_id, JobStatus.CANCELLED, record.exit_code, "cancelled on request", record)
        record.attempts += 1
        attempt = Attempt(store, record)
        if record.attempts > 1:
            with open(replica_log(store.path.parent, record, 0), "a") as log:
                log.write(f"[tradewind] attempt {record.attempts} of job {job_id} after: {record.reason}\n")
        error = attempt.start()
        if error is not None:
            return _finish(store, job_id, JobStatus.FAILED, None, error, record)

        def running(row: JobRow, attempt: Attempt = attempt, attempts: int = record.attempts) -> JobRecord:
            r = row.record
            r.status, r.attempts = JobStatus.RUNNING, attempts
            r.pids, r.pid_starts = [p.pid for p in attempt.processes], attempt.starts
            r.pid, r.started_at = r.pids[0], r.started_at or utc_now()
            return r

        record = store.update(job_id, running)
        outcome, code = attempt.wait(peers)
        spec = record.spec
        if outcome == "succeeded":
            return _finish(store, job_id, JobStatus.SUCCEEDED, 0, None, record)
        if outcome == "cancelled":
            return _finish(store, job_id, JobStatus.CANCELLED, code, "cancelled on request", record)
        if outcome == "timed_out":
            reason = f"timed out after {spec.timeout_s:g} s (timeout_s) and was killed"
            return _finish(store, job_id, JobStatus.FAILED, code, reason, record)
        reason = describe_exit(code if code is not None else 1)
        if outcome == "preempted":
            record.preemptions += 1
            if record.preemptions > spec.max_retries_preemption:
                return _finish(store, job_id, JobStatus.PREEMPTED, code, reason, record)
        else:
            record.failures += 1
            if record.failures > spec.max_retries_failure:
                return _finish(store, job_id, JobStatus.FAILED, code, reason, record)

        def retrying(row: JobRow, record: JobRecord = record, reason: str | None = reason) -> JobRecord:
            row.record.failures, row.record.preemptions, row.record.reason = record.failures, record.preemptions, reason
            return row.record

        record = store.update(job_id, retrying)


if __name__ == "__main__":
    if sys.argv[1] == SPARE_FLAG:
        serve_as_spare(Path(sys.argv[2]))
    else:
        supervise(Path(sys.argv[1]), sys.argv[2])
