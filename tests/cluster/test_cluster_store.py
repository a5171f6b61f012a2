"""The local backend's SQLite job store: records, scheduler flags and settings, shared between connections."""

import threading

import pytest

from tradewind.cluster.jobs import JobRecord, JobSpec, JobStatus
from tradewind.cluster.store import ACTIVE, JobStore
from tradewind.core import NotFoundError


def record(job_id: str, status: JobStatus = JobStatus.PENDING) -> JobRecord:
    return JobRecord(id=job_id, spec=JobSpec(name=job_id, command=["true"]), status=status)


def add(store: JobStore, *records: JobRecord) -> None:
    with store.transaction() as conn:
        for one in records:
            store.insert(one, conn)


def test_a_new_store_creates_its_folder_and_an_inserted_record_reads_back_equal(tmp_path):
    store = JobStore(tmp_path / "deep" / "jobs" / "cluster.sqlite")
    job = record("job-a")
    add(store, job)
    row = store.get("job-a")
    assert row.record == job and row.admitted is False and row.cancel_requested is False
    assert JobStore(store.path).get("job-a").record == job  # a second opener sees the same database


def test_an_unknown_id_is_not_found_naming_the_id_and_the_database(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    with pytest.raises(NotFoundError, match=r"unknown job id 'job-nope' \(no record in .*cluster\.sqlite\)"):
        store.get("job-nope")


def test_rows_come_in_submission_order_and_filter_by_status(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    add(store, record("job-c"), record("job-a", JobStatus.RUNNING), record("job-b", JobStatus.SUCCEEDED))
    assert [row.record.id for row in store.rows()] == ["job-c", "job-a", "job-b"]
    assert [row.record.id for row in store.rows(ACTIVE)] == ["job-c", "job-a"]
    assert [row.record.id for row in store.rows(("SUCCEEDED",))] == ["job-b"]


def test_update_writes_what_the_change_returns_and_nothing_when_it_returns_none(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    add(store, record("job-a"))

    def finish(row):
        row.record.status, row.record.exit_code = JobStatus.SUCCEEDED, 0
        return row.record

    assert store.update("job-a", finish).status is JobStatus.SUCCEEDED
    assert [row.record.id for row in store.rows(ACTIVE)] == []  # the status column moved with the record
    unchanged = store.update("job-a", lambda row: None)
    assert unchanged.status is JobStatus.SUCCEEDED and store.get("job-a").record.exit_code == 0


def test_a_transaction_that_raises_is_rolled_back(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    with pytest.raises(RuntimeError, match="midway"), store.transaction() as conn:
        store.insert(record("job-a"), conn)
        raise RuntimeError("midway")
    assert store.rows() == []


def test_flags_mark_admission_with_a_time_and_a_cancel_request(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    add(store, record("job-a"), record("job-b"))
    with store.transaction() as conn:
        store.set_flag("job-a", "admitted", conn)
        store.set_flag("job-b", "cancel_requested", conn)
    a, b = store.get("job-a"), store.get("job-b")
    assert a.admitted and a.admitted_at > 0 and not a.cancel_requested
    assert b.cancel_requested and not b.admitted
    assert store.cancel_requested("job-b") and not store.cancel_requested("job-a")
    assert not store.cancel_requested("job-nope")


def test_settings_are_stored_as_json_and_replaced_by_a_second_write(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    assert store.get_meta("capacity") is None
    store.set_meta("capacity", {"cpus": 2, "memory_gb": 4.5})
    store.set_meta("capacity", {"cpus": 3})
    assert JobStore(store.path).get_meta("capacity") == {"cpus": 3}


def test_concurrent_read_modify_writes_from_many_threads_lose_no_update(tmp_path):
    store = JobStore(tmp_path / "cluster.sqlite")
    add(store, record("job-a"))

    def bump():
        for _ in range(10):
            store.update("job-a", lambda row: row.record.model_copy(update={"attempts": row.record.attempts + 1}))

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.get("job-a").record.attempts == 80
