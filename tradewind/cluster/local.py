"""The local backend: every job is a group of processes on this machine, watched by its own supervisor.

State lives in `<workspace>/jobs/cluster.sqlite` (see `store.py`); each job's logs and supervisor log
under `<workspace>/jobs/<id>/` unless the spec names a log file. A resource ledger (`ledger.py`) admits
jobs only while their declared CPUs, memory, GPUs and TPU chips fit; the rest wait as PENDING, and one still waiting
`pending_timeout_s` after submission ends FAILED, with the reason. A restarted server loses nothing: it
re-attaches to running jobs by checking their supervisor's pid *and* kernel start time; a job whose
supervisor vanished is FAILED with that reason.

Reads (`status`, `wait`, `logs`, `list`, `cluster_status`) write nothing and start nothing: they report
each job as it stands (`ledger.observe`). Recording what they see (a vanished supervisor, an expired
queued job), stopping orphaned replicas and admitting queued jobs is `ledger.reconcile`'s, run by
`submit`, `cancel` and the supervisors. A backend opened `read_only` only reads (`tradewind serve
--read-only`): it opens the database read-only and writes nothing to the workspace.

A backend that has started a supervisor keeps a spare one warm (see `supervisor.py`), so the next
admitted job starts without waiting for a Python start; the spare ends with the backend. A thread waits
on each supervisor it started, so that one that ends is reaped at once (no zombie child lingers).

Example:
    backend = LocalBackend(workspace.jobs_dir, cpus=2)
    job = backend.submit(JobSpec(name="hello", command=["echo", "hi"]))
    backend.wait(job.id, timeout=30).status  # JobStatus.SUCCEEDED
    backend.logs(job.id).text                # "hi\\n"
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import weakref
from pathlib import Path

from tradewind.cluster.jobs import (
    LOG_PAGE_BYTES,
    BackendStatus,
    JobRecord,
    JobSpec,
    JobStatus,
    LogChunk,
    decode_log_page,
    utc_now,
    wait_for_finish,
)
from tradewind.cluster.ledger import (
    CAPACITY_KEY,
    Capacity,
    check_fits_at_all,
    detect_capacity,
    held,
    observe,
    reconcile,
)
from tradewind.cluster.store import ACTIVE, JobRow, JobStore
from tradewind.cluster.supervisor import (
    dismiss_spare,
    hand_over,
    replica_log,
    signal_groups,
    spawn_spare,
    spawn_supervisor,
    stop_groups,
)
from tradewind.cluster.warm import warm_process
from tradewind.core import InvalidInputError, check_id, make_id, read_json

DB_NAME = "cluster.sqlite"


def reap(supervisor: subprocess.Popen[bytes], store: JobStore, job_id: str) -> None:
    """Wait for a supervisor we started, so that it is reaped the moment it ends (never a zombie child); one that
    ended before claiming its job (see its supervisor.log) leaves the job FAILED rather than admitted forever."""
    supervisor.wait()

    def unclaimed(row: JobRow) -> JobRecord | None:
        if row.record.status.finished or row.record.supervisor_pid is not None:
            return None
        row.record.status, row.record.ended_at = JobStatus.FAILED, utc_now()
        row.record.reason = f"its supervisor ended before starting it (exit code {supervisor.returncode})"
        return row.record

    store.update(job_id, unclaimed)


class LocalBackend:
    """Submit, inspect, wait for, read the logs of and cancel jobs that run as local processes.

    Args:
        jobs_dir: folder of the database and the per-job folders (normally `Workspace.jobs_dir`).
        cpus, memory_gb, gpus, tpus (chips of slice type `tpu_type`): the capacity the ledger may hand out; each
            defaults to what was declared before for this folder, else to this machine's. Declaring one stores it
            for later backends.
        read_only: only read: open the database read-only, store no capacity, start no process; `submit`
            and `cancel` are refused.
    """

    name = "local"
    on_this_machine = True  # its jobs share this machine's memory and compile cache
    default_pending_timeout_s: float | None = None  # a job that fits at all waits only for other local work

    def __init__(
        self,
        jobs_dir: str | os.PathLike[str],
        cpus: float | None = None,
        memory_gb: float | None = None,
        gpus: int | None = None,
        read_only: bool = False,
        tpus: int | None = None,
        tpu_type: str | None = None,
    ):
        self.jobs_dir = Path(jobs_dir)
        self.read_only = read_only
        fresh = not (self.jobs_dir / DB_NAME).exists()
        if not read_only:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(self.jobs_dir / DB_NAME, read_only=read_only)
        # Declared figures persist for later backends on this folder; undeclared ones follow the machine.
        stored = self.store.get_meta(CAPACITY_KEY) or {}
        declared = {
            **stored.get("declared", {}),
            **{
                name: value
                for name, value in (
                    ("cpus", cpus),
                    ("memory_gb", memory_gb),
                    ("gpus", gpus),
                    ("tpus", tpus),
                    ("tpu_type", tpu_type),
                )
                if value is not None
            },
        }
        capacity = detect_capacity().model_copy(update=declared)
        if {**capacity.model_dump(), "declared": declared} != stored and not read_only:
            self.store.set_meta(CAPACITY_KEY, {**capacity.model_dump(), "declared": declared})
        self.capacity = capacity
        # A spare supervisor, loaded and waiting for a job id; dismissed when this backend is collected
        # or the interpreter exits (the finalizer), and ends by itself if this process dies.
        self._spare: tuple[subprocess.Popen[bytes], weakref.finalize] | None = None
        self._spare_lock = threading.Lock()  # tools call one backend from several threads
        if fresh and not read_only:
            self._import_legacy_records()

    def _import_legacy_records(self) -> None:
        """Keep jobs recorded as `jobs/<id>/job.json` by earlier versions visible."""
        for path in sorted(self.jobs_dir.glob("*/job.json")):
            try:
                record = JobRecord.model_validate(read_json(path))
            except (ValueError, OSError):
                continue
            if not record.status.finished:
                record.status, record.ended_at = JobStatus.FAILED, record.ended_at or utc_now()
                record.reason = "recorded by an earlier Tradewind version whose supervisor no longer reports"
            with self.store.transaction() as conn:
                if not conn.execute("SELECT 1 FROM jobs WHERE id = ?", (record.id,)).fetchone():
                    self.store.insert(record, conn)

    def _check_writable(self, action: str) -> None:
        if self.read_only:
            raise InvalidInputError(
                f"cannot {action}: the local backend of {self.jobs_dir} was opened read-only "
                "(a server started with --read-only only observes)"
            )

    def _reconcile(self) -> None:
        """Record vanished supervisors and expired queued jobs, stop orphaned replicas, start admitted jobs."""
        start, vanished = reconcile(self.store, Capacity.model_validate(self.store.get_meta(CAPACITY_KEY)))
        for record in vanished:
            stop_groups(record.pids, record.pid_starts)  # they would hold what the ledger now frees
        for job_id in start:
            self._start_supervisor(job_id)

    def _start_supervisor(self, job_id: str) -> None:
        """Hand admitted job `job_id` to the warm spare (else a fresh one), then warm the next spare."""
        with self._spare_lock:
            if self._spare is None:
                spare = spawn_spare(self.store.path)
            else:
                (spare, finalizer), self._spare = self._spare, None
                finalizer.detach()
            if not hand_over(spare, job_id):  # the spare died: start a supervisor for the job the cold way
                dismiss_spare(spare)
                spare = spawn_supervisor(self.store.path, job_id)
            # The thread holds no reference to this backend, so that dropping the backend still ends its spare.
            reaper = threading.Thread(target=reap, args=(spare, self.store, job_id), name=f"reap {job_id}", daemon=True)
            reaper.start()
            following = spawn_spare(self.store.path)
            self._spare = (following, weakref.finalize(self, dismiss_spare, following))

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Queue `spec` and start it at once if its resources are free; returns its PENDING record.

        A job still queued `spec.pending_timeout_s` after this ends FAILED (recorded by the next submit or
        cancel, or a running job's supervisor; reads report it so from then on).

        Raises:
            InvalidInputError: the id is taken or invalid, the backend is read-only, or the job could never fit
                this backend (the message says what it asks, what the backend has and what to change).
        """
        self._check_writable("submit a job")
        job_id = check_id(job_id or make_id("job"), "job_id")
        check_fits_at_all(spec, self.capacity)
        if self.capacity.tpus and spec.resources.tpu is None:
            # One process at a time can open the host's TPU: a job that did not ask for its chips must not take them.
            spec = spec.model_copy(update={"env": {"JAX_PLATFORMS": "cpu", **spec.env}})
        if spec.resources.tpu is not None and spec.callable is not None and spec.replicas == 1:
            spec = spec.model_copy(update={"warm": True})  # the chip stays open, its programs loaded, for the next
        (self.jobs_dir / job_id).mkdir(parents=True, exist_ok=True)
        log_path = spec.log_path or str(self.jobs_dir / job_id / "job.log")
        record = JobRecord(id=job_id, spec=spec, log_path=log_path)
        with self.store.transaction() as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise InvalidInputError(f"argument 'job_id': a job with id {job_id!r} exists already")
            self.store.insert(record, conn)
        self._reconcile()
        return record

    def _seen(self, rows: list[JobRow]) -> list[JobRecord]:
        return observe(self.store, self.capacity, rows)

    def status(self, job_id: str) -> JobRecord:
        """The job's record as it stands now (see `ledger.observe`); writes nothing. Raises `NotFoundError` for
        an unknown id."""
        return self._seen([self.store.get(check_id(job_id, "job_id"))])[0]

    def wait(self, job_id: str, timeout: float, poll_interval: float = 0.1) -> JobRecord:
        """Wait until the job finishes or `timeout` seconds pass; return its record either way."""
        return wait_for_finish(lambda: self.status(job_id), timeout, poll_interval)

    def logs(self, job_id: str, offset: int = 0, limit: int = LOG_PAGE_BYTES, replica: int = 0) -> LogChunk:
        """Up to `limit` bytes of the job's output from byte `offset` (replica 0 unless told)."""
        record = self.status(job_id)
        if offset < 0 or limit < 1:
            raise InvalidInputError(f"offset must be >= 0 and limit >= 1 (got {offset}, {limit})")
        if not 0 <= replica < record.spec.replicas:
            raise InvalidInputError(f"argument 'replica': job {job_id!r} has replicas 0..{record.spec.replicas - 1}")
        path = replica_log(self.jobs_dir, record, replica)
        size = path.stat().st_size if path.exists() else 0
        page = b""
        if offset < size:
            with open(path, "rb") as f:
                f.seek(offset)
                page = f.read(limit)
        return decode_log_page(job_id, page, offset=offset, size=size, finished=record.status.finished)

    def cancel(self, job_id: str) -> JobRecord:
        """Stop the job: a queued one ends at once; a running one's process groups get SIGTERM, then SIGKILL."""
        self._check_writable("cancel a job")
        check_id(job_id, "job_id")

        def request(row: JobRow) -> JobRecord | None:
            if row.record.status.finished:
                return None
            row.record.reason = "cancelled on request"
            if not row.admitted:
                row.record.status, row.record.ended_at = JobStatus.CANCELLED, utc_now()
            return row.record

        with self.store.transaction() as conn:
            row = self.store.get(job_id, conn)
            record = request(row)
            if record is not None:
                self.store.set_flag(job_id, "cancel_requested", conn)
                self.store.put(record, conn)
        # The supervisor notices within a fraction of a second; a SIGTERM now saves that wait.
        current = self.store.get(job_id).record
        if current.status is JobStatus.RUNNING:
            signal_groups(current.pids, current.pid_starts, signal.SIGTERM)
        self._reconcile()
        return self.status(job_id)

    def list(self) -> list[JobRecord]:
        """Every job's record, newest first."""
        return self._seen(list(reversed(self.store.rows())))

    def cluster_status(self) -> BackendStatus:
        """Capacity, resources in use, and the queued and running jobs (oldest first)."""
        rows = self.store.rows(ACTIVE)
        seen = self._seen(rows)
        tpu, detail = self.capacity.tpu_type, None
        if tpu:
            warm = warm_process(self.jobs_dir)
            held_by = f"; its warm process {warm} keeps them open between runs" if warm else ""
            detail = f"this host's TPU: {tpu}, {self.capacity.tpus} chips{held_by}"
        return BackendStatus(
            name=self.name,
            detail=detail,
            capacity=self.capacity.model_dump(exclude={"tpu_type"}),
            used=held(rows)[0].model_dump(exclude={"tpu_type"}),
            queued=[record for record in seen if record.status is JobStatus.PENDING],
            running=[record for record in seen if record.status is JobStatus.RUNNING],
        )
