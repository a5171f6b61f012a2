"""The resource ledger of the local backend: admit a job only when everything it declares is free.

Capacity is what the backend was told it may use (default: this machine's CPU count, physical memory,
visible NVIDIA GPUs and its own TPU chips). A TPU job holds every chip: its slice type must be this host's,
and one process at a time can use the chips, so a second TPU run waits for the first. A job
holds `replicas x resources` from admission until its supervisor records a terminal state. Admission runs
inside one SQLite write transaction, so two servers submitting at once can never both take the last core.
Queued jobs are admitted in submission order; a later, smaller job may start before an earlier one that
does not fit yet (backfill). A queued job still waiting `pending_timeout_s` after submission is failed,
with what it waits for, in the same transaction; it never held anything, so the ledger frees nothing for it.

Reading changes nothing: a read reports each job as it stands (`observe`: a job whose supervisor vanished
is FAILED, an expired queued one too) and only those who change the workspace anyway record it and admit
(`reconcile`: a submit, a cancel, and every supervisor, about once a second while its job runs and when it
ends). So a job queued behind a vanished one starts once any other job's supervisor looks, or at the next
submit or cancel.
"""

from __future__ import annotations

import glob
import os
import time
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus, utc_now
from tradewind.cluster.placement import Resources
from tradewind.cluster.process import process_alive
from tradewind.cluster.store import ACTIVE, JobRow, JobStore
from tradewind.cluster.tpu_host import host_tpu
from tradewind.core import InvalidInputError

CAPACITY_KEY = "capacity"
SPAWN_GRACE_S = 30.0  # an admitted job whose supervisor has not claimed it by then is handed out again
VANISHED_REASON = "the supervising process vanished before the job finished (killed or machine restart)"


class Capacity(BaseModel):
    """Resources of the local backend (or in use by its jobs)."""

    model_config = ConfigDict(extra="ignore")  # the stored form also lists which figures were declared

    cpus: float = Field(description="CPU cores.")
    memory_gb: float = Field(description="Memory in GiB.")
    gpus: int = Field(default=0, description="GPUs.")
    tpus: int = Field(default=0, description="TPU chips of this host.")
    tpu_type: str | None = Field(default=None, description="The slice type this host's TPU chips make, if any.")

    def plus(self, other: Capacity) -> Capacity:
        return self.model_copy(update={name: getattr(self, name) + getattr(other, name) for name in AMOUNTS})

    def within(self, limit: Capacity) -> bool:
        eps = 1e-9
        return all(getattr(self, name) <= getattr(limit, name) + eps for name in AMOUNTS)

    def describe(self) -> str:
        """E.g. `2 CPUs, 4 GiB memory, 0 GPUs`: how messages name an amount of each resource (TPU chips only
        where there are some)."""
        return ", ".join(
            amount(getattr(self, name), unit) for name, unit in AMOUNTS.items() if name != "tpus" or self.tpus
        )


# The amounts a job holds, with their units as messages name them.
AMOUNTS = {
    "cpus": ("CPU", "CPUs"),
    "memory_gb": ("GiB memory", "GiB memory"),
    "gpus": ("GPU", "GPUs"),
    "tpus": ("TPU chip", "TPU chips"),
}


def amount(value: float, unit: tuple[str, str]) -> str:
    """`1 GPU`, `0 GPUs`, `1.5 CPUs`: a number with its unit, singular or plural."""
    return f"{value:g} {unit[0] if value == 1 else unit[1]}"


def detect_capacity() -> Capacity:
    """This machine: CPU count, physical memory, NVIDIA GPUs visible as /dev/nvidia<N>, and its TPU chips."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = 0.0
    tpu = host_tpu()
    return Capacity(
        cpus=os.cpu_count() or 1,
        memory_gb=round(memory, 2),
        gpus=len(glob.glob("/dev/nvidia[0-9]*")),
        tpus=tpu.chips if tpu else 0,
        tpu_type=tpu.tpu_type if tpu else None,
    )


def demand(spec: JobSpec) -> Capacity:
    """What a job holds while it runs: each replica's resources times the replica count."""
    r, n = spec.resources, spec.replicas
    chips = r.tpu.chips * r.slices if r.tpu is not None else 0
    return Capacity(cpus=r.cpus * n, memory_gb=r.memory_gb * n, gpus=r.gpus * n, tpus=chips * n)


def check_fits_at_all(spec: JobSpec, capacity: Capacity) -> None:
    """Refuse at submission a job that could never be admitted, rather than queue it forever.

    The message says what the job asks for, what this backend has, and what to change.
    """
    if spec.resources.tpu is not None:
        check_host_tpu(spec.resources, capacity, f"job {spec.name!r}")
    short = _shortfalls(spec, capacity)
    if not short:
        return
    if spec.resources.gpus and capacity.gpus == 0:
        change = "use accelerator 'cpu', run where a GPU is, or use backend 'ray'"
    else:
        change = "ask for less per replica or fewer replicas, or use backend 'ray'"
    raise InvalidInputError(f"job {spec.name!r} needs {'; '.join(short)} (capacity: {capacity.describe()}); {change}")


def check_host_tpu(resources: Resources, capacity: Capacity, what: str) -> None:
    """Refuse TPU `resources` this host cannot give (`what` names who asks, e.g. "job 'train r1'"): the local
    backend runs a TPU job on this host's own chips alone: all of them, as the host's slice type (a process
    that opens the TPU sees every chip, so two jobs could not share them).

    Raises:
        InvalidInputError: naming the type asked for, the host's, and what to use instead.
    """
    asked, slices = resources.tpu, resources.slices
    where = f"{what} asks for {f'{slices} x ' if slices > 1 else ''}TPU {asked.tpu_type!r}"
    ray = "set backend 'ray' (with RAY_ADDRESS pointing at a Ray cluster with TPU hosts)"
    if asked.hosts > 1 or slices > 1:
        raise InvalidInputError(
            f"{where}, which spans {asked.hosts * slices} hosts; the local backend runs on this host alone, and "
            f"TPUs of several hosts run on the Ray backend: {ray}"
        )
    if capacity.tpu_type is None:
        raise InvalidInputError(f"{where}, but this host has no TPU chip; run it on a TPU VM, or {ray}")
    # Exactly the host's type: its JAX sees every chip of the host, whatever the job asked for.
    if asked.tpu_type != capacity.tpu_type:
        raise InvalidInputError(
            f"{where}, but this host's TPU is {capacity.tpu_type!r} ({amount(capacity.tpus, AMOUNTS['tpus'])}); "
            f"use accelerator 'tpu' (this host's) or 'tpu-{capacity.tpu_type}', or {ray}"
        )


def _shortfalls(spec: JobSpec, capacity: Capacity) -> list[str]:
    """Each resource the job needs more of than the backend has at all, said as the job asks for it."""
    n = spec.replicas
    per_replica = demand(spec.model_copy(update={"replicas": 1}))
    short = []
    for name, unit in AMOUNTS.items():
        each, have = getattr(per_replica, name), getattr(capacity, name)
        if each * n <= have + 1e-9:
            continue
        asked = f"{amount(each, unit)} per replica" + (f" x {n} replicas = {amount(each * n, unit)}" if n > 1 else "")
        short.append(f"{asked} but this backend has {amount(have, unit)}")
    return short


def supervisor_vanished(row: JobRow) -> bool:
    """Whether the job's supervisor claimed it and then died without recording its end (checked by pid *and*
    start time, so a reused pid does not count as alive)."""
    record = row.record
    return (
        not record.status.finished
        and record.supervisor_pid is not None
        and not process_alive(record.supervisor_pid, record.supervisor_start)
    )


def held(rows: list[JobRow]) -> tuple[Capacity, list[str]]:
    """What the admitted, unfinished jobs among `rows` hold together, and their ids; a job whose supervisor
    vanished holds nothing (it is FAILED, recorded or not)."""
    used, holders = Capacity(cpus=0, memory_gb=0), []
    for row in rows:
        if row.admitted and not row.record.status.finished and not supervisor_vanished(row):
            used = used.plus(demand(row.record.spec))
            holders.append(row.record.id)
    return used, holders


def observe(store: JobStore, capacity: Capacity, rows: list[JobRow]) -> list[JobRecord]:
    """The records of `rows` as their jobs stand now, computed without writing: what `reconcile` records next.

    A job whose supervisor vanished is FAILED, and a queued job past its `pending_timeout_s` is FAILED with
    what it waits for, though their rows say otherwise until then. This is how every read reports a job, so
    that looking changes nothing (a read-only server writes nothing) and the answer does not depend on who looks.
    """
    now = time.time()
    expired = {row.record.id for row in rows if _queued(row) and _waited_too_long(row, now)}
    if expired:
        used, holders = held(store.rows(ACTIVE))
    seen = []
    for row in rows:
        if supervisor_vanished(row):
            seen.append(_vanish(row.record))
        elif row.record.id in expired:
            seen.append(_expire(row.record, capacity, used, holders))
        else:
            seen.append(row.record)
    return seen


def unsettled(rows: list[JobRow]) -> bool:
    """Whether `reconcile` has anything to record among the active `rows`: a vanished supervisor, a queued job
    (to admit or expire), or an admitted job that no supervisor claimed within `SPAWN_GRACE_S`."""
    now = time.time()
    return any(
        _queued(row) or supervisor_vanished(row) or _unclaimed_too_long(row, now)
        for row in rows
        if not row.record.status.finished
    )


def reconcile(store: JobStore, capacity: Capacity) -> tuple[list[str], list[JobRecord]]:
    """Record what reads only compute, then admit, in one write transaction; returns the ids of the jobs to
    start a supervisor for (the caller starts them) and the records of the jobs whose supervisor vanished
    (the caller stops their replicas, which would hold what the ledger now frees).

    Only those who change the workspace anyway run this (a submit, a cancel, a supervisor while its job runs
    and when it ends), never a read. In order: a job whose supervisor vanished ends FAILED; a queued job that
    waited longer than its `pending_timeout_s` ends FAILED with the reason, even if it would fit now (its
    outcome must not depend on when someone looked); queued jobs that fit are admitted, oldest first (a later,
    smaller one may pass an earlier one that does not fit yet); an admitted job that no supervisor claimed
    within `SPAWN_GRACE_S` (whoever admitted it died before starting one) is handed out again.
    """
    now = time.time()
    with store.transaction() as conn:
        rows = store.rows(ACTIVE, conn)
        vanished = [_vanish(row.record) for row in rows if supervisor_vanished(row)]
        for record in vanished:
            store.put(record, conn)
        used, holders = held(rows)
        start = []
        for row in rows:
            if row.record.status.finished:
                continue
            if _unclaimed_too_long(row, now):
                store.set_flag(row.record.id, "admitted", conn)  # a fresh grace for the supervisor started now
                start.append(row.record.id)
            elif not _queued(row):
                continue
            elif _waited_too_long(row, now):
                store.put(_expire(row.record, capacity, used, holders), conn)
            elif (after := used.plus(demand(row.record.spec))).within(capacity):
                store.set_flag(row.record.id, "admitted", conn)
                used = after
                holders.append(row.record.id)
                start.append(row.record.id)
    return start, vanished


def _queued(row: JobRow) -> bool:
    return not row.admitted and not row.cancel_requested and not row.record.status.finished


def _unclaimed_too_long(row: JobRow, now: float) -> bool:
    return row.admitted and row.record.supervisor_pid is None and now - row.admitted_at > SPAWN_GRACE_S


def _vanish(record: JobRecord) -> JobRecord:
    record.status, record.ended_at = JobStatus.FAILED, utc_now()
    record.reason = VANISHED_REASON
    return record


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
