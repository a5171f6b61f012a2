"""The tool context: workspace settings read afresh, the backend a run goes to, and `run_job`'s outcomes."""

import pytest
from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus
from tradewind.core import ConfigError, InvalidInputError, TradewindError
from tradewind.tools import ToolContext
from tradewind.tools.context import Cancelled, LaunchLimits, run_job


@pytest.fixture
def fresh(tmp_path) -> ToolContext:
    return ToolContext.open(tmp_path / "workspace")


def test_a_workspace_without_settings_has_the_default_limits(fresh):
    settings = fresh.settings()
    assert settings.backend is None
    assert settings.limits == LaunchLimits(max_active_runs=4, max_steps=1_000_000, memory_fraction=0.9)


def test_settings_are_read_afresh_on_every_call_so_a_persons_edit_applies_at_once(fresh):
    fresh.settings_path.write_text("backend: local\nlimits:\n  max_active_runs: 2\n", encoding="utf-8")
    assert fresh.settings().limits.max_active_runs == 2
    fresh.settings_path.write_text("limits:\n  max_steps: 50\n", encoding="utf-8")
    assert fresh.settings().limits.max_steps == 50 and fresh.settings().limits.max_active_runs == 4


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("backend: slurm\n", "backend"),
        ("limits:\n  max_runs: 2\n", "max_runs"),
        ("limits:\n  max_steps: 0\n", "max_steps"),
    ],
)
def test_a_bad_settings_file_is_a_config_error_naming_the_file_and_the_field(fresh, text, field):
    fresh.settings_path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=field) as error:
        fresh.settings()
    assert "settings.yaml" in str(error.value)


def test_the_default_backend_is_the_settings_choice_else_ray_when_an_address_is_set_else_local(fresh, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert fresh.default_backend() == "local"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert fresh.default_backend() == "ray"
    fresh.settings_path.write_text("backend: local\n", encoding="utf-8")
    assert fresh.default_backend() == "local"


def test_the_local_job_backend_is_the_contexts_own_and_an_unknown_one_is_refused(fresh):
    assert fresh.job_backend("local") is fresh.backend
    with pytest.raises(InvalidInputError, match="slurm"):
        fresh.job_backend("slurm")


def shell(fresh: ToolContext, script: str) -> JobSpec:
    return JobSpec(name="job", command=["bash", "-c", script], log_path=str(fresh.workspace.jobs_dir / "job.log"))


def test_run_job_returns_once_the_job_succeeded_reporting_elapsed_seconds(fresh):
    marker = fresh.workspace.root / "done"
    reports = []
    run_job(
        fresh,
        shell(fresh, f"sleep 0.6; touch {marker}"),
        job_id="job-ok",
        timeout_s=60,
        activity="touching",
        progress=lambda done, total, message: reports.append((done, total, message)),
    )
    assert marker.exists() and fresh.backend.status("job-ok").status is JobStatus.SUCCEEDED
    assert reports and all(total == 60 and message == "touching (seconds elapsed)" for _, total, message in reports)
    assert [done for done, _, _ in reports] == sorted(done for done, _, _ in reports)


def test_a_failed_job_raises_with_its_reason_and_the_end_of_its_log(fresh):
    with pytest.raises(TradewindError, match=r"sampling failed \(.*\); log .*job\.log ends:\nfirst\nlast words"):
        run_job(
            fresh,
            shell(fresh, "echo first; echo last words; exit 3"),
            job_id="job-bad",
            timeout_s=60,
            activity="sampling",
            progress=lambda *args: None,
        )


def test_a_job_past_its_timeout_is_cancelled_and_raises(fresh):
    with pytest.raises(TradewindError, match=r"profiling took longer than timeout_s=0.5"):
        run_job(
            fresh,
            shell(fresh, "sleep 60"),
            job_id="job-slow",
            timeout_s=0.5,
            activity="profiling",
            progress=lambda *args: None,
        )
    stopped = wait_until(lambda: (r := fresh.backend.status("job-slow")).status.finished and r, 30, "the job ending")
    assert stopped.status is JobStatus.CANCELLED


def test_a_caller_that_cancels_through_progress_cancels_the_job_too(fresh):
    def cancel(done, total, message):
        raise Cancelled("the client cancelled")

    with pytest.raises(Cancelled):
        run_job(fresh, shell(fresh, "sleep 60"), job_id="job-gone", timeout_s=60, activity="x", progress=cancel)
    stopped = wait_until(lambda: (r := fresh.backend.status("job-gone")).status.finished and r, 30, "the job ending")
    assert stopped.status is JobStatus.CANCELLED


def test_a_read_only_context_reads_the_jobs_of_its_workspace_and_refuses_to_start_one(fresh):
    job = fresh.backend.submit(JobSpec(name="done", command=["true"]), job_id="job-done")
    wait_until(lambda: fresh.backend.status(job.id).status is JobStatus.SUCCEEDED)
    observer = ToolContext.open(fresh.workspace.root, read_only=True)
    assert observer.job_backend("local").status("job-done").status is JobStatus.SUCCEEDED
    with pytest.raises(InvalidInputError, match="opened read-only"):
        observer.backend.submit(JobSpec(name="more", command=["true"]))
