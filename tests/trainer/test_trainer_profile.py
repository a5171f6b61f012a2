"""Profiling builds the run as training does, times its steps and leaves a trace behind."""

import jax
import pytest

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.entry import load_callable
from tradewind.core import ConfigError, InvalidInputError, read_json
from tradewind.trainer import ProfileSummary, RunLayout, profile_training
from tradewind.trainer.jobs import PROFILE_CALLABLE, ProfileJob
from tradewind.trainer.profile import profile_job


@pytest.mark.slow
def test_profile_writes_a_summary_and_a_trace_folder_with_files(tiny_config, tmp_path):
    summary = profile_training(tiny_config(), tmp_path / "profile", steps=2)
    assert ProfileSummary.model_validate(read_json(tmp_path / "profile" / "summary.json")) == summary
    assert summary.steps == 2
    assert summary.backend == jax.default_backend()
    assert summary.parameters > 0 and summary.compile_s > 0 and summary.mean_step_s > 0
    assert summary.tokens_per_s == pytest.approx(8 * 32 / summary.mean_step_s)
    trace_files = [path for path in (tmp_path / "profile" / "trace").rglob("*") if path.is_file()]
    assert trace_files and all(path.stat().st_size > 0 for path in trace_files)


def test_profiling_zero_steps_is_refused(tiny_config, tmp_path):
    with pytest.raises(InvalidInputError, match="'steps'"):
        profile_training(tiny_config(), tmp_path / "profile", steps=0)


def profile_as_a_job(tmp_path, run_dir, steps=2):
    """Run a profiling job on a local backend; its record when it ends, and its log."""
    backend = LocalBackend(tmp_path / "jobs")
    job = ProfileJob(run_dir=str(run_dir), steps=steps)
    record = backend.submit(JobSpec(name="profile", callable=PROFILE_CALLABLE, kwargs=job.model_dump()))
    return backend.wait(record.id, timeout=300), backend.logs(record.id).text


@pytest.mark.slow
def test_a_profiling_job_profiles_the_run_folder_from_its_config_json(tiny_config, tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.config.write_text(tiny_config(steps=2).model_dump_json(), encoding="utf-8")
    record, log = profile_as_a_job(tmp_path, layout.root)
    assert record.status is JobStatus.SUCCEEDED, log
    summary = ProfileSummary.model_validate(read_json(layout.profile / "summary.json"))
    assert summary.steps == 2
    assert summary.trace_dir == str(layout.profile / "trace")
    assert "ms/step" in log and str(layout.profile / "trace") in log
    assert not layout.metrics.exists()  # profiling leaves the run's own files alone


@pytest.mark.slow
def test_a_profiling_job_on_a_folder_without_a_config_fails_with_a_readable_error(tmp_path):
    record, log = profile_as_a_job(tmp_path, tmp_path / "nothing-here")
    assert record.status is JobStatus.FAILED
    assert f"error: no run config at {tmp_path / 'nothing-here' / 'config.json'}" in log


def test_a_profiling_job_with_a_bad_argument_names_it(tmp_path):
    assert load_callable(PROFILE_CALLABLE) is profile_job
    with pytest.raises(ConfigError, match="profile job: steps: Input should be greater than or equal to 1"):
        profile_job(run_dir=str(tmp_path), steps=0)
    with pytest.raises(ConfigError, match="profile job: run_dir: Field required"):
        profile_job(steps=2)
