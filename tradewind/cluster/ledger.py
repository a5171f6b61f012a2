"""The resource ledger of the local backend: admit a job only when everything it declares is free.

Capacity is what the backend was told it may use (default: this machine's CPU count, physical memory
and visible NVIDIA GPUs). A job holds `replicas x resources` from admission until its supervisor
records a terminal state. Admission runs inside one SQLite write transaction, so two servers
submitting at once can never both take the last core. Queued jobs are admitted in submission order;
a later, smaller job may start before an earlier one that does not fit yet (backfill). A queued job
still waiting `pending_timeout_s` after submission is failed, with what it waits for, in the same
transaction; it never held anything, so the ledger frees nothing for it.
"""

from __future__ import annotations

import glob
import os
import sqlite3
import time
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus, utc_now
from tradewind.cluster.store import ACTIVE, JobRow, JobStore
from tradewind.core import InvalidInputError

CAPACITY_KEY = "capacity"


class Capacity(BaseModel):
    """Resources of the local backend (or in use by its jobs)."""

    model_config = ConfigDict(extra="ignore")  # the stored form also lists which figures were declared

    cpus: float = Field(description="CPU cores.")
    memory_gb: float = Field(description="Memory in GiB.")
    gpus: int = Field(default=0, description="GPUs.")

    def plus(self, other: Capacity) -> Capacity:
        return Capacity(
            cpus=self.cpus + other.cpus, memory_gb=self.memory_gb + other.memory_gb, gpus=self.gpus + other.gpus
        )

    def within(self, limit: Capacity) -> bool:
        eps = 1e-9
        return self.cpus <= limit.cpus + eps and self.memory_gb <= limit.memory_gb + eps and self.gpus <= limit.gpus

    def describe(self) -> str:
        """E.g. `2 CPUs, 4 GiB memory, 0 GPUs`: how messages name an amount of each resource."""
        return ", ".join(amount(value, unit) for value, unit in zip(self.model_dump().values(), UNITS, strict=True))


UNITS = (("CPU", "CPUs"), ("GiB memory", "GiB memory"), ("GPU", "GPUs"))  # in `Capacity`'s field order


def amount(value: float, unit: tuple[str, str]) -> str:
    """`1 GPU`, `0 GPUs`, `1.5 CPUs`: a number with its unit, singular or plural."""
    return f"{value:g} {unit[0] if value == 1 else unit[1]}"


def detect_capacity() -> Capacity:
    """This machine: CPU count, physical memory, NVIDIA GPUs visible as /dev/nvidia<N>."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = 0.0
    return Capacity(cpus=os.cpu_count() or 1, memory_gb=round(memory, 2), gpus=len(glob.glob("/dev/nvidia[0-9]*")))


def demand(spec: JobSpec) -> Capacity:
    """What a job holds while it runs: each replica's resources times the replica count."""
    r = spec.resources
    return Capacity(cpus=r.cpus * spec.replicas, memory_gb=r.memory_gb * spec.replicas, gpus=r.gpus * spec.replicas)


def check_fits_at_all(spec: JobSpec, capacity: Capacity) -> None:
    """Refuse at submission a job that could never be admitted, rather than queue it forever.

    The message says what the job asks for, what this backend has, and what to change.
    """
    if spec.resources.tpu_type is not None:
        raise InvalidInputError(
            f"job {spec.name!r} asks for TPU {spec.resources.tpu_type!r}, but TPUs run on the Ray backend only; "
            "set backend 'ray' (with RAY_ADDRESS pointing at a Ray cluster with TPU hosts)"
        )
    short = _shortfalls(spec, capacity)
    if not short:
        return
    if spec.resources.gpus and capacity.gpus == 0:
        change = "use accelerator 'cpu', run where a GPU is, or use backend 'ray'"
    else:
        change = "ask for less per replica or fewer replicas, or use backend 'ray'"
    raise InvalidInputError(f"job {spec.name!r} needs {'; '.join(short)} (capacity: {capacity.describe()}); {change}")


def _shortfalls(spec: JobSpec, capacity: Capacity) -> list[str]:
    """Each resource the job needs more of than the backend has at all, said as the job asks for it."""
    n = spec.replicas
    per_replica = spec.resources.model_dump(include={"cpus", "memory_gb", "gpus"})
    short = []
    for (field, have), unit in zip(capacity.model_dump().items(), UNITS, strict=True):
        each = per_replica[field]
        if each * n <= have + 1e-9:
            continue
        asked = f"{amount(each, unit)} per replica" + (f" x {n} replicas = {amount(each * n, unit)}" if n > 1 else "")
        short.append(f"{asked} but this backend has {amount(have, unit)}")
    return short


def usage(store: JobStore, conn: sqlite3.Connection | None = None) -> Capacity:
    """Resources held by admitted jobs that have not finished."""
    used = Capacity(cpus=0, memory_gb=0, gpus=0)
    for row in store.rows(ACTIVE, conn):
        if row.admitted:
            used = used.plus(demand(row.record.spec))
    return used


def admit_queued(store: JobStore, capacity: Capacity) -> list[str]:
    """Admit every queued job that fits now, oldest first; returns their ids (the caller starts them).

    A queued job that has waited longer than its `pending_timeout_s` is failed instead, with the reason,
    even if it would fit now: its outcome must not depend on when someone looked. Whoever schedules (a
    submit, any look at a queued job, a supervisor that ends) runs this, so an expired job ends at the
    next look without a watcher of its own.
    """
    admitted = []
    now = time.time()
    with store.transaction() as conn:
        rows = store.rows(ACTIVE, conn)
        holders = [row.record.id for row in rows if row.admitted]
        used = usage(store, conn)
        for row in rows:  # a running job is always admitted
            if row.admitted or row.cancel_requested:
                continue
            if _waited_too_long(row, now):
                store.put(_expire(row.record, capacity, used, holders), conn)
            elif (after := used.plus(demand(row.record.spec))).within(capacity):
                store.set_flag(row.record.id, "admitted", conn)
                used = after
                holders.append(row.record.id)
                admitted.append(row.record.id)
    return admitted


def _waited_too_long(row: JobRow, now: float) -> bool:
    timeout = row.record.spec.pending_timeout_s
    return timeout is not None and now - datetime.fromisoformat(row.record.submitted_at).timestamp() > timeout


def _expire(record: JobRecord, capacity: Capacity, used: Capacity, holders: list[str]) -> JobRecord:
    """The record of a queued job that waited too long: FAILED, saying what it needs and what holds the rest."""
    in_use = f"{used.describe()} in use by {', '.join(holders)}" if holders else "nothing in use"
    record.status, record.ended_at = JobStatus.FAILED, utc_now()
    record.reason = (
        f"not started within pending_timeout_s={record.spec.pending_timeout_s:g} s: it needs "
        f"{demand(record.spec).describe()} and this backend has {capacity.describe()}, with {in_use}"
    )
    return record
