"""The resource ledger of the local backend: admit a job only when everything it declares is free.

Capacity is what the backend was told it may use (default: this machine's CPU count, physical memory
and visible NVIDIA GPUs). A job holds `replicas x resources` from admission until its supervisor
records a terminal state. Admission runs inside one SQLite write transaction, so two servers
submitting at once can never both take the last core. Queued jobs are admitted in submission order;
a later, smaller job may start before an earlier one that does not fit yet (backfill).
"""

from __future__ import annotations

import glob
import os
import sqlite3

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.jobs import JobSpec, JobStatus
from tradewind.cluster.store import ACTIVE, JobStore
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
    """Refuse at submission a job that could never be admitted, rather than queue it forever."""
    if spec.resources.tpu_type is not None:
        raise InvalidInputError(
            f"job {spec.name!r} asks for TPU {spec.resources.tpu_type!r}; the local backend has no TPUs "
            "(submit it to the Ray backend)"
        )
    need = demand(spec)
    if not need.within(capacity):
        raise InvalidInputError(
            f"job {spec.name!r} needs {need.cpus:g} CPUs, {need.memory_gb:g} GiB and {need.gpus} GPUs "
            f"({spec.replicas} replicas); the local backend has {capacity.cpus:g} CPUs, "
            f"{capacity.memory_gb:g} GiB and {capacity.gpus} GPUs"
        )


def usage(store: JobStore, conn: sqlite3.Connection | None = None) -> Capacity:
    """Resources held by admitted jobs that have not finished."""
    used = Capacity(cpus=0, memory_gb=0, gpus=0)
    for row in store.rows(ACTIVE, conn):
        if row.admitted:
            used = used.plus(demand(row.record.spec))
    return used


def admit_queued(store: JobStore, capacity: Capacity) -> list[str]:
    """Admit every queued job that fits now, oldest first; returns their ids (the caller starts them)."""
    admitted = []
    with store.transaction() as conn:
        rows = store.rows((JobStatus.PENDING.value,), conn)
        used = usage(store, conn)
        for row in rows:
            if row.admitted or row.cancel_requested:
                continue
            after = used.plus(demand(row.record.spec))
            if after.within(capacity):
                store.set_flag(row.record.id, "admitted", conn)
                used = after
                admitted.append(row.record.id)
    return admitted
