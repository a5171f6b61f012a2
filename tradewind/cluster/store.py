"""Job state of the local backend in one SQLite database under the workspace.

Servers, supervisors and CLI commands open the same file from different processes. Every
read-modify-write runs in a `BEGIN IMMEDIATE` transaction, so two writers never interleave. The database
keeps a rollback journal, not a write-ahead log: a reader then holds only a lock on the file and creates
nothing beside it, which is what lets a read-only server (`read_only=True`, opened `mode=ro`) leave the
workspace byte-identical; under WAL every reader makes `-wal` and `-shm` files. Transactions are short, so
a reader delays a writer by a moment at most (both wait on `busy_timeout`). Besides each job's record
(JSON), a row keeps the columns the scheduler queries: status, whether the ledger admitted it, whether
someone asked to cancel it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tradewind.cluster.jobs import JobRecord, JobStatus
from tradewind.core import NotFoundError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    status TEXT NOT NULL,
    admitted REAL NOT NULL DEFAULT 0,  -- when the ledger admitted it (Unix time); 0 while queued
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

ACTIVE = (JobStatus.PENDING.value, JobStatus.RUNNING.value)


class JobRow:
    """One job as stored: its record plus the scheduler's flags."""

    __slots__ = ("admitted_at", "cancel_requested", "record", "seq")

    def __init__(self, seq: int, record: JobRecord, admitted_at: float, cancel_requested: bool):
        self.seq, self.record, self.admitted_at, self.cancel_requested = seq, record, admitted_at, cancel_requested

    @property
    def admitted(self) -> bool:
        return self.admitted_at > 0


class JobStore:
    """The jobs database at `path`, created on first use; with `read_only`, opened for reading only.

    A read-only store writes nothing, not even the database: where there is none yet, it reads as empty.
    """

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        if read_only:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as conn:
            # A database made by an earlier version is in WAL mode; leaving it needs a moment alone with it.
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.executescript(_SCHEMA)

    def _open(self) -> sqlite3.Connection:
        if not self.read_only:
            return sqlite3.connect(self.path, timeout=60, isolation_level=None)
        if not self.path.exists():
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(_SCHEMA)
            return conn
        uri = f"{self.path.absolute().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        conn = self._open()
        try:
            conn.execute("PRAGMA busy_timeout=60000")
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database's write lock from its first statement."""
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- rows -------------------------------------------------------------------------------------

    @staticmethod
    def _row(row: tuple) -> JobRow:
        seq, record, admitted, cancel = row
        return JobRow(seq, JobRecord.model_validate_json(record), float(admitted), bool(cancel))

    def get(self, job_id: str, conn: sqlite3.Connection | None = None) -> JobRow:
        query = "SELECT seq, record, admitted, cancel_requested FROM jobs WHERE id = ?"
        if conn is None:
            with self.connect() as own:
                row = own.execute(query, (job_id,)).fetchone()
        else:
            row = conn.execute(query, (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown job id {job_id!r} (no record in {self.path})")
        return self._row(row)

    def insert(self, record: JobRecord, conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO jobs (id, status, record) VALUES (?, ?, ?)",
            (record.id, record.status.value, record.model_dump_json()),
        )

    def put(self, record: JobRecord, conn: sqlite3.Connection) -> None:
        conn.execute(
            "UPDATE jobs SET status = ?, record = ? WHERE id = ?",
            (record.status.value, record.model_dump_json(), record.id),
        )

    def update(self, job_id: str, change: Callable[[JobRow], JobRecord | None]) -> JobRecord:
        """Apply `change` to the job's row in one transaction; it returns the new record or None (no write)."""
        with self.transaction() as conn:
            row = self.get(job_id, conn)
            record = change(row)
            if record is None:
                return row.record
            self.put(record, conn)
            return record

    def rows(self, statuses: tuple[str, ...] | None = None, conn: sqlite3.Connection | None = None) -> list[JobRow]:
        """Rows in submission order, optionally only those with one of `statuses`."""
        query = "SELECT seq, record, admitted, cancel_requested FROM jobs"
        params: tuple = ()
        if statuses:
            query += f" WHERE status IN ({', '.join('?' * len(statuses))})"
            params = statuses
        query += " ORDER BY seq"
        if conn is None:
            with self.connect() as own:
                return [self._row(r) for r in own.execute(query, params).fetchall()]
        return [self._row(r) for r in conn.execute(query, params).fetchall()]

    def set_flag(self, job_id: str, flag: str, conn: sqlite3.Connection) -> None:
        assert flag in ("admitted", "cancel_requested")
        value = time.time() if flag == "admitted" else 1
        conn.execute(f"UPDATE jobs SET {flag} = ? WHERE id = ?", (value, job_id))

    def cancel_requested(self, job_id: str) -> bool:
        with self.connect() as conn:
            row = conn.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return bool(row and row[0])

    # -- settings ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> dict | None:
        with self.connect() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_meta(self, key: str, value: dict) -> None:
        with self.connect() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))
