"""`run.json`: the run record every interface reads; who writes which state, and how a bad one is reported."""

import json
import os
import signal
import socket

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, LocalBackend, Placement
from tradewind.cluster.process import process_alive
from tradewind.core import ConfigError, NotFoundError
from tradewind.runs.record import (
    RunRecord,
    job_end_callback,
    read_record,
    record_end,
    record_start,
    write_record,
)


def test_a_written_record_reads_back_equal_as_strict_json(tmp_path):
    path = tmp_path / "run.json"
    record = RunRecord(run_id="run-1", backend="local", job_id="job-7", parent="run-0", parent_step=30)
    write_record(path, record)
    assert read_record(path) == record
    assert json.loads(path.read_text())["status"] == "PENDING"


def test_a_folder_without_a_record_is_not_found_naming_the_folder(tmp_path):
    with pytest.raises(NotFoundError, match=f"no run record run.json in {tmp_path}"):
        read_record(tmp_path / "run.json")


def test_a_record_that_is_not_json_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{path}: not valid JSON"):
        read_record(path)


def test_a_record_with_a_bad_field_is_a_config_error_naming_the_field(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run_id": "run-1", "backend": "slurm"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="backend") as error:
        read_record(path)
    assert str(path) in str(error.value)


def test_starting_a_run_with_no_launcher_creates_a_process_record_running_in_this_process(tmp_path):
    path = tmp_path / "run.json"
    started = record_start(path, "run-1", processes=1, platform="cpu", devices=1)
    assert read_record(path) == started
    assert started.backend == "process" and started.job_id is None and started.status is JobStatus.RUNNING
    assert started.pid == os.getpid() and started.host == socket.gethostname() and started.pid_start is not None
    assert (started.platform, started.devices, started.processes) == ("cpu", 1, 1)


def test_starting_a_launched_run_keeps_its_launcher_fields_and_clears_an_earlier_failure(tmp_path):
    path = tmp_path / "run.json"
    launched = RunRecord(
        run_id="run-1",
        backend="local",
        job_id="job-7",
        placement=Placement(accelerator="gpu:2"),
        status=JobStatus.FAILED,
        started_at="2026-01-01T00:00:00+00:00",
        ended_at="2026-01-01T00:01:00+00:00",
        reason="preempted",
    )
    write_record(path, launched)
    restarted = record_start(path, "run-1", processes=2, platform="gpu", devices=4)
    assert (restarted.backend, restarted.job_id, str(restarted.placement.accelerator)) == ("local", "job-7", "gpu:2")
    assert restarted.status is JobStatus.RUNNING and restarted.ended_at is None and restarted.reason is None
    assert restarted.started_at == "2026-01-01T00:00:00+00:00"  # a restarted attempt keeps the first start
    assert (restarted.processes, restarted.devices) == (2, 4)


def test_ending_a_run_records_status_time_and_reason_and_keeps_the_rest(tmp_path):
    path = tmp_path / "run.json"
    started = record_start(path, "run-1", processes=1, platform="cpu", devices=1)
    record_end(path, JobStatus.FAILED, "loss is NaN at step 7")
    ended = read_record(path)
    assert ended.status is JobStatus.FAILED and ended.reason == "loss is NaN at step 7" and ended.ended_at
    assert started.load_start is not None and ended.load_end is not None  # the machine's load, for the ledger
    assert ended.model_dump(exclude={"status", "reason", "ended_at", "load_end"}) == started.model_dump(
        exclude={"status", "reason", "ended_at", "load_end"}
    )


def ended_job(backend: LocalBackend, job_id: str):
    """The job's record once its supervisor has ended (its `on_end` has run by then)."""
    record = backend.wait(job_id, timeout=30)
    assert record.status.finished
    wait_until(lambda: not process_alive(record.supervisor_pid, record.supervisor_start), 30, "the supervisor's end")
    return backend.status(job_id)


def test_a_record_still_running_when_its_job_is_killed_ends_as_the_job_did(tmp_path):
    path = tmp_path / "run.json"
    write_record(path, RunRecord(run_id="run-k", backend="local", job_id="run-k", status=JobStatus.RUNNING))
    backend = LocalBackend(tmp_path / "jobs", cpus=1)
    spec = JobSpec(name="killed", command=["bash", "-c", "kill -9 $$"], on_end=job_end_callback(path))
    job = ended_job(backend, backend.submit(spec, job_id="run-k").id)
    assert job.status is JobStatus.PREEMPTED
    record = read_record(path)
    assert (record.status, record.reason, record.ended_at) == (job.status, job.reason, job.ended_at)


def test_a_record_the_trainer_finished_keeps_its_own_words_when_its_job_ends(tmp_path):
    path = tmp_path / "run.json"
    write_record(path, RunRecord(run_id="run-f", backend="local", job_id="run-f", status=JobStatus.RUNNING))
    backend = LocalBackend(tmp_path / "jobs", cpus=1)
    trainer = "tradewind.runs.record:record_end"  # what the trainer does on a NaN loss, then it exits
    spec = JobSpec(
        name="nan", callable=trainer, args=[str(path), "FAILED", "loss is NaN"], on_end=job_end_callback(path)
    )
    job = ended_job(backend, backend.submit(spec, job_id="run-f").id)
    assert job.status is JobStatus.SUCCEEDED
    assert (read_record(path).status, read_record(path).reason) == (JobStatus.FAILED, "loss is NaN")


@pytest.mark.slow
def test_a_trainer_killed_without_retries_leaves_a_record_that_says_what_get_run_says(
    ctx, dataset_id, tiny_run_settings
):
    from tradewind.runs import RunLayout
    from tradewind.tools import LaunchTrainingRequest, RunRequest, get_run, launch_training

    run = launch_training(
        ctx, LaunchTrainingRequest(dataset=dataset_id, steps=100_000, max_retries=0, **tiny_run_settings)
    )
    layout = RunLayout(ctx.workspace.run_dir(run.run_id))
    trainer = wait_until(lambda: (r := read_record(layout.record)).status is JobStatus.RUNNING and r.pid, 240, "a step")
    os.kill(trainer, signal.SIGKILL)
    ended_job(ctx.backend, run.run_id)
    reported = get_run(ctx, RunRequest(run_id=run.run_id))
    record = read_record(layout.record)
    assert reported.status is JobStatus.PREEMPTED
    assert (record.status, record.reason, record.ended_at) == (reported.status, reported.reason, reported.ended_at)
