"""The local backend's resource ledger: what a job holds, what can never fit, and who is admitted when."""

import os
from datetime import UTC, datetime, timedelta

import pytest

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus, Resources
from tradewind.cluster.ledger import (
    VANISHED_REASON,
    Capacity,
    check_fits_at_all,
    demand,
    detect_capacity,
    held,
    observe,
    reconcile,
)
from tradewind.cluster.process import process_start_time
from tradewind.cluster.store import ACTIVE, JobStore
from tradewind.core import InvalidInputError


def spec(name: str = "job", replicas: int = 1, **resources) -> JobSpec:
    return JobSpec(name=name, command=["true"], resources=Resources(**resources), replicas=replicas)


def queue(store: JobStore, *specs: JobSpec, submitted_at: str | None = None) -> list[str]:
    """Insert the jobs as queued (PENDING, not admitted), in order; return their ids."""
    ids = []
    with store.transaction() as conn:
        for i, one in enumerate(specs):
            job_id = f"job-{len(store.rows(conn=conn)) + i:03d}-{one.name}"
            fields = {"submitted_at": submitted_at} if submitted_at else {}
            store.insert(JobRecord(id=job_id, spec=one, **fields), conn)
            ids.append(job_id)
    return ids


def admit_queued(store: JobStore, capacity: Capacity) -> list[str]:
    """The ids `reconcile` hands out to start (none of these tests has a vanished supervisor)."""
    start, vanished = reconcile(store, capacity)
    assert vanished == []
    return start


def usage(store: JobStore) -> Capacity:
    return held(store.rows(ACTIVE))[0]


def test_an_amount_is_described_with_its_unit_singular_or_plural():
    assert Capacity(cpus=1, memory_gb=1, gpus=1).describe() == "1 CPU, 1 GiB memory, 1 GPU"
    assert Capacity(cpus=1.5, memory_gb=0, gpus=0).describe() == "1.5 CPUs, 0 GiB memory, 0 GPUs"


def test_within_compares_every_resource_and_tolerates_float_rounding():
    limit = Capacity(cpus=0.3, memory_gb=4, gpus=1)
    assert Capacity(cpus=0.1, memory_gb=0, gpus=0).plus(Capacity(cpus=0.2, memory_gb=4, gpus=1)).within(limit)
    assert not Capacity(cpus=0.31, memory_gb=0, gpus=0).within(limit)
    assert not Capacity(cpus=0, memory_gb=4.5, gpus=0).within(limit)
    assert not Capacity(cpus=0, memory_gb=0, gpus=2).within(limit)


def test_a_job_holds_its_per_replica_resources_times_its_replicas():
    assert demand(spec(replicas=3, cpus=2, memory_gb=1.5, accelerator="gpu")) == Capacity(cpus=6, memory_gb=4.5, gpus=3)


def test_the_detected_capacity_is_this_machines_cpu_count_and_memory():
    capacity = detect_capacity()
    assert capacity.cpus == os.cpu_count()
    assert capacity.memory_gb > 0 and capacity.gpus >= 0


def test_a_job_that_fits_the_capacity_passes_the_submission_check():
    check_fits_at_all(spec(replicas=2, cpus=1, memory_gb=2), Capacity(cpus=2, memory_gb=4, gpus=0))


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (
            spec("wide", replicas=3, cpus=2),
            r"job 'wide' needs 2 CPUs per replica x 3 replicas = 6 CPUs but this backend has 4 CPUs "
            r"\(capacity: 4 CPUs, 8 GiB memory, 0 GPUs\); ask for less per replica or fewer replicas",
        ),
        (
            spec("gpu", accelerator="gpu"),
            r"job 'gpu' needs 1 GPU per replica but this backend has 0 GPUs .*use accelerator 'cpu'",
        ),
        (
            spec("tpu", accelerator="tpu-v5litepod-8"),
            r"job 'tpu' asks for TPU 'v5litepod-8', but this host has no TPU chip; run it on a TPU VM, or set "
            r"backend 'ray'",
        ),
        (
            spec("pod", accelerator="tpu-v5litepod-16"),
            r"job 'pod' asks for TPU 'v5litepod-16', which spans 4 hosts; the local backend runs on this host alone, "
            r"and TPUs of several hosts run on the Ray backend: set backend 'ray'",
        ),
        (
            spec("big", cpus=1, memory_gb=9),
            r"needs 9 GiB memory per replica but this backend has 8 GiB memory",
        ),
    ],
    ids=["too-many-cpus", "gpu-without-gpus", "tpu", "multi-host-tpu", "too-much-memory"],
)
def test_a_job_that_could_never_be_admitted_is_refused_saying_what_it_asks_and_what_to_change(job, expected):
    with pytest.raises(InvalidInputError, match=expected):
        check_fits_at_all(job, Capacity(cpus=4, memory_gb=8, gpus=0))


def test_queued_jobs_are_admitted_oldest_first_while_they_fit_and_a_smaller_later_one_backfills(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    first, big, small = queue(store, spec("first", cpus=2), spec("big", cpus=3), spec("small", cpus=1))
    assert admit_queued(store, Capacity(cpus=4, memory_gb=0, gpus=0)) == [first, small]
    assert usage(store) == Capacity(cpus=3, memory_gb=0, gpus=0)
    assert not store.get(big).admitted
    assert admit_queued(store, Capacity(cpus=4, memory_gb=0, gpus=0)) == []  # still no room for `big`

    def finish(row):
        row.record.status = JobStatus.SUCCEEDED
        return row.record

    store.update(first, finish)  # a finished job holds nothing
    assert usage(store) == Capacity(cpus=1, memory_gb=0, gpus=0)
    assert admit_queued(store, Capacity(cpus=4, memory_gb=0, gpus=0)) == [big]


def test_a_job_someone_asked_to_cancel_is_never_admitted(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    (job,) = queue(store, spec("cancelled"))
    with store.transaction() as conn:
        store.set_flag(job, "cancel_requested", conn)
    assert admit_queued(store, Capacity(cpus=4, memory_gb=0, gpus=0)) == []


def test_a_queued_job_past_its_pending_timeout_fails_naming_what_it_needs_and_what_holds_the_rest(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    (holder,) = queue(store, spec("holder", cpus=2))
    admit_queued(store, Capacity(cpus=2, memory_gb=0, gpus=0))
    long_ago = (datetime.now(UTC) - timedelta(seconds=60)).isoformat()
    impatient = spec("impatient", cpus=1).model_copy(update={"pending_timeout_s": 5.0})
    patient = spec("patient", cpus=1)
    expired, waiting = queue(store, impatient, patient, submitted_at=long_ago)
    # It fails even where it would fit now: its outcome must not depend on when someone looked.
    assert admit_queued(store, Capacity(cpus=4, memory_gb=0, gpus=0)) == [waiting]  # no timeout: it starts
    failed = store.get(expired).record
    assert failed.status is JobStatus.FAILED and failed.ended_at is not None and not store.get(expired).admitted
    assert failed.reason == (
        "not started within pending_timeout_s=5 s: it needs 1 CPU, 0 GiB memory, 0 GPUs and this backend has "
        f"4 CPUs, 0 GiB memory, 0 GPUs, with 2 CPUs, 0 GiB memory, 0 GPUs in use by {holder}"
    )
    assert usage(store) == Capacity(cpus=3, memory_gb=0, gpus=0)  # the failed job never held anything


def claim(store: JobStore, job_id: str, pid: int, start: int | None) -> None:
    """Record `pid` as the job's supervisor, RUNNING, as a supervisor's claim does."""

    def change(row):
        row.record.supervisor_pid, row.record.supervisor_start, row.record.status = pid, start, JobStatus.RUNNING
        return row.record

    store.update(job_id, change)


def test_reads_report_a_job_whose_supervisor_vanished_as_failed_and_only_reconcile_records_it(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    capacity = Capacity(cpus=2, memory_gb=0, gpus=0)
    gone, waiting = queue(store, spec("gone", cpus=2), spec("waiting", cpus=2))
    assert admit_queued(store, capacity) == [gone]
    claim(store, gone, pid=os.getpid(), start=process_start_time(os.getpid()) + 1)  # a start time not ours: dead
    seen = observe(store, capacity, store.rows())
    assert [(r.id, r.status, r.reason) for r in seen] == [
        (gone, JobStatus.FAILED, VANISHED_REASON),
        (waiting, JobStatus.PENDING, None),
    ]
    assert store.get(gone).record.status is JobStatus.RUNNING  # reading wrote nothing
    assert usage(store) == Capacity(cpus=0, memory_gb=0, gpus=0)  # what it held is free to whoever admits next
    start, vanished = reconcile(store, capacity)
    assert (start, [r.id for r in vanished]) == ([waiting], [gone])
    assert store.get(gone).record.status is JobStatus.FAILED and store.get(gone).record.reason == VANISHED_REASON


def test_an_admitted_job_no_supervisor_claimed_within_the_grace_is_handed_out_again_once(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    (orphan,) = queue(store, spec("orphan"))
    with store.transaction() as conn:
        conn.execute("UPDATE jobs SET admitted = 1 WHERE id = ?", (orphan,))  # admitted long ago, never claimed
    capacity = Capacity(cpus=2, memory_gb=0, gpus=0)
    assert admit_queued(store, capacity) == [orphan]
    assert admit_queued(store, capacity) == []  # the supervisor started now has its own grace


HOST_V5E_4 = Capacity(cpus=8, memory_gb=16, tpus=4, tpu_type="v5litepod-4")


def test_a_tpu_job_holds_its_slices_chips_and_its_amount_is_described_with_them():
    assert demand(spec(accelerator="tpu-v4-8")) == Capacity(cpus=1, memory_gb=0, tpus=4)  # v4 counts TensorCores
    assert HOST_V5E_4.describe() == "8 CPUs, 16 GiB memory, 0 GPUs, 4 TPU chips"


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (
            spec("bigger", accelerator="tpu-v5litepod-8"),
            r"this host's TPU is 'v5litepod-4' \(4 TPU chips\); use accelerator",
        ),
        (spec("smaller", accelerator="tpu-v5litepod-1"), r"this host's TPU is 'v5litepod-4'.*or 'tpu-v5litepod-4'"),
        (spec("other family", accelerator="tpu-v6e-4"), r"this host's TPU is 'v5litepod-4'.*or 'tpu-v5litepod-4'"),
        (spec("slices", accelerator="tpu-v5litepod-4", slices=2), r"which spans 2 hosts.*set backend 'ray'"),
    ],
    ids=["more-chips", "fewer-chips", "another-family", "two-slices"],
)
def test_on_a_tpu_host_a_job_for_other_chips_is_refused_naming_the_hosts(job, expected):
    with pytest.raises(InvalidInputError, match=expected):
        check_fits_at_all(job, HOST_V5E_4)


def test_a_second_tpu_job_queues_behind_the_first_and_starts_when_it_ends(tmp_path):
    """One process at a time can use a TPU chip: the ledger hands the host's chips to one job, then the next."""
    store = JobStore(tmp_path / "jobs.sqlite")
    first, second, cpu_job = queue(
        store, spec("a", accelerator="tpu-v5litepod-4"), spec("b", accelerator="tpu-v5litepod-4"), spec()
    )
    check_fits_at_all(store.get(second).record.spec, HOST_V5E_4)
    assert admit_queued(store, HOST_V5E_4) == [first, cpu_job]  # a CPU job passes the waiting TPU one
    assert usage(store).tpus == 4

    def finish(row):
        row.record.status = JobStatus.SUCCEEDED
        return row.record

    store.update(first, finish)
    assert admit_queued(store, HOST_V5E_4) == [second]
    assert usage(store).tpus == 4
