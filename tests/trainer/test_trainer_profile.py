"""Profiling builds the run as training does, times and traces its steps, splits where the time goes and
names what limits it."""

import dataclasses
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from tradewind.cluster import JobSpec, JobStatus, LocalBackend
from tradewind.cluster.entry import load_callable
from tradewind.core import ConfigError, InvalidInputError, read_json
from tradewind.runs import ProfileSummary, RunLayout
from tradewind.runs.config import named_fields, with_fields
from tradewind.runs.jobs import PROFILE_CALLABLE, ProfileJob
from tradewind.runs.metrics import StepSplit
from tradewind.trainer import profile_training
from tradewind.trainer.hooks import Interval, ProfileHook, StepTiming
from tradewind.trainer.profile import (
    DATA_BOUND_SHARE,
    Measured,
    candidate_changes,
    check_changes,
    diagnose,
    profile_job,
    profile_setup,
    suggested_batch_size,
    wider_heads,
)
from tradewind.trainer.setup import setup_training


@pytest.mark.slow
def test_profile_writes_a_summary_with_the_step_split_top_ops_and_a_verdict_and_a_trace(tiny_config, tmp_path):
    summary = profile_training(tiny_config(), tmp_path / "profile", steps=3, start_step=3)
    assert ProfileSummary.model_validate(read_json(tmp_path / "profile" / "summary.json")) == summary
    assert (summary.steps, summary.start_step) == (3, 3)
    assert summary.backend == jax.default_backend()
    assert summary.parameters > 0 and summary.compile_s > 0 and summary.mean_step_s > 0
    assert summary.tokens_per_s == pytest.approx(8 * 32 / summary.mean_step_s)
    assert summary.median_step_s > 0 and summary.first_step_s > 0
    shares = list(summary.split.model_dump().values())
    assert all(share >= 0 for share in shares) and sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert summary.split.checkpoint == 0 and summary.compiles == 0
    assert summary.diagnosis.verdict in {"data-bound", "host-bound", "compute-bound"}
    assert summary.diagnosis.evidence and summary.diagnosis.suggestion
    assert len(summary.top_ops) == 10 and all(0 < op.share <= 1 for op in summary.top_ops)
    assert [op.total_ms for op in summary.top_ops] == sorted((op.total_ms for op in summary.top_ops), reverse=True)
    assert summary.peak_memory_bytes > 0 and summary.peak_memory_source == "process peak RSS"
    assert 0 < summary.mfu < 1
    trace_dir = tmp_path / "profile" / "trace"
    # Time by part of the model: each part's loss of MFU is its seconds less its FLOPs' at the peak
    parts = {part.part: part for part in summary.parts}
    assert set(parts) >= {"embedding", "attention", "mlp", "norms", "loss", "optimizer", "host and idle"}
    assert all(part.seconds > 0 for name, part in parts.items() if name != "host and idle")
    assert [part.mfu_lost for part in summary.parts] == sorted((p.mfu_lost for p in summary.parts), reverse=True)
    setup = setup_training(tiny_config())
    flops = setup.model_config.flops_by_part(32)
    for name in ("attention", "mlp", "loss"):
        ideal_s = flops[name] * 8 * 32 / setup.peak_flops
        assert parts[name].mfu_lost == pytest.approx((parts[name].seconds - ideal_s) / summary.mean_step_s)
    for name in ("embedding", "norms", "optimizer"):  # no model FLOPs: all their time is lost
        assert parts[name].mfu_lost == pytest.approx(parts[name].share)
    assert summary.kinds["matmul"] > 0 and set(summary.kinds) <= {"matmul", "copy or layout", "collective", "other"}
    if summary.diagnosis.verdict == "compute-bound":
        assert f"{summary.parts[0].part} loses the most MFU" in summary.diagnosis.evidence
    assert summary.trace_file.endswith(".trace.json.gz") and summary.trace_file.startswith(str(trace_dir))
    assert list(trace_dir.glob("plugins/profile/*/*.trace.json.gz")) and list(
        trace_dir.glob("plugins/profile/*/*.xplane.pb")
    )


def test_the_profile_hook_times_each_traced_step_from_the_loops_totals_and_counts_compilations(tmp_path):
    hook = ProfileHook(tmp_path / "trace", first=2, last=3)
    x = jnp.ones(7)
    hook(SimpleNamespace(step=1), Interval(seconds=1.0, data_s=0.5, device_s=0.25))  # starts the trace
    jax.jit(lambda a: a * 3)(x).block_until_ready()  # a compilation while tracing
    step_2, step_3 = {"tokens": jnp.float32(256)}, {"tokens": jnp.float32(200)}  # the steps' own metrics
    hook(SimpleNamespace(step=2), Interval(metrics=[step_2], seconds=1.5, data_s=0.625, device_s=0.5))
    hook(SimpleNamespace(step=3), Interval(metrics=[step_2, step_3], seconds=2.5, data_s=0.625, device_s=1.25))
    # (the step-3 call stops the trace)
    jax.jit(lambda a: a * 5)(x).block_until_ready()  # after the window: not counted
    assert hook.steps == [StepTiming(0.5, 0.125, 0.25), StepTiming(1.0, 0.0, 0.75)]
    assert hook.tokens == [256.0, 200.0]  # each step's own, the latest of the interval
    assert [step.host_s for step in hook.steps] == [0.125, 0.25]
    assert hook.compiles == 1
    assert list((tmp_path / "trace").glob("plugins/profile/*/*.xplane.pb"))


class SlowLoader:
    """The run's loader, 30 ms slower per batch: the injected slow data source of a data-starved run (the
    only sleep here; it stands for a loader reading from slow storage, not for synchronisation)."""

    def __init__(self, loader):
        self.loader = loader

    def batch(self, step):
        time.sleep(0.03)
        return self.loader.batch(step)


@pytest.mark.slow
def test_a_run_whose_loader_is_slower_than_its_step_is_called_data_bound(tiny_config, tmp_path):
    setup = setup_training(tiny_config())
    starved = dataclasses.replace(setup, train_loader=SlowLoader(setup.train_loader))
    summary = profile_setup(starved, tmp_path / "profile", steps=3)
    assert summary.diagnosis.verdict == "data-bound", summary.diagnosis.evidence
    assert summary.split.data_wait > DATA_BOUND_SHARE
    assert "loader workers" in summary.diagnosis.suggestion


def measured(**fields) -> Measured:
    """A 30 ms step on a batch of 8 that is mostly compute, with `fields` changed (`compute`, `data_wait`,
    `host` and `checkpoint` change the split)."""
    split = {"compute": 0.8, "data_wait": 0.1, "host": 0.1, "checkpoint": 0.0}
    values = dict(step_s=0.030, compiles=0, batch_size=8, grad_accum=1, max_batch_size=1024)
    for name, value in fields.items():
        (split if name in split else values)[name] = value
    return Measured(split=StepSplit(**split), **values)


@pytest.mark.parametrize(
    ("fields", "verdict", "suggestion"),
    [
        (dict(compiles=2, data_wait=0.5), "recompiling", "shapes change between steps: XLA compiled 2 time(s)"),
        (dict(checkpoint=0.3, compute=0.5), "checkpoint-bound", "raise checkpoints.every_steps"),
        (dict(data_wait=0.35, compute=0.55), "data-bound", "prefetch more batches"),
        (dict(step_s=0.004, host=0.5, compute=0.4), "host-bound", "raise batch_size to 128: more work"),
        (
            dict(step_s=0.004, host=0.5, compute=0.4, max_batch_size=8),
            "host-bound",
            "raise batch_size to 16 with grad_accum 2",
        ),
        (dict(step_s=0.030, host=0.5, compute=0.4), "compute-bound", "raise batch_size to 16"),
        (dict(), "compute-bound", "raise batch_size to 16: a 30.0 ms step"),
        (dict(step_s=0.2), "compute-bound", "the device is the limit"),
    ],
    ids=[
        "recompiling-first",
        "checkpoint",
        "data",
        "host",
        "host-at-memory-limit",
        "long-step-host-share-is-compute",
        "compute-short-step",
        "compute-long-step",
    ],
)
def test_the_verdict_is_the_first_rule_that_holds_with_one_suggestion(fields, verdict, suggestion):
    diagnosis = diagnose(measured(**fields))
    assert diagnosis.verdict == verdict
    assert suggestion in diagnosis.suggestion
    assert diagnosis.evidence.startswith(f"{measured(**fields).step_s * 1000:.1f} ms/step: compute ")


def test_a_suggested_batch_doubles_until_the_step_would_reach_50_ms_or_memory_runs_out():
    assert suggested_batch_size(measured(step_s=0.004)) == 128  # 4 ms x 16 = 64 ms
    assert suggested_batch_size(measured(step_s=0.004, max_batch_size=40)) == 32
    assert suggested_batch_size(measured(step_s=0.060)) == 8


def test_profiling_zero_steps_or_tracing_the_first_step_is_refused(tiny_config, tmp_path):
    with pytest.raises(InvalidInputError, match="'steps'"):
        profile_training(tiny_config(), tmp_path / "profile", steps=0)
    with pytest.raises(InvalidInputError, match="'start_step': must be at least 2"):
        profile_training(tiny_config(), tmp_path / "profile", start_step=1)


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
    assert f"{summary.diagnosis.verdict}: " in log and f"suggestion: {summary.diagnosis.suggestion}" in log
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


def test_the_candidate_changes_of_a_compute_bound_step_follow_its_config_and_memory(tiny_config):
    plain = tiny_config()
    assert candidate_changes(plain, max_batch_size=16) == [{"batch_size": 16}]
    assert candidate_changes(plain, max_batch_size=8) == []
    frugal = tiny_config(remat="full", scan_layers=True)
    assert candidate_changes(frugal, max_batch_size=8) == [{"remat": "none"}, {"scan_layers": False}]
    # On a TPU whose step loses the most in attention, heads twice as wide come first: same width, half the heads.
    wider = {"model.n_heads": 1, "model.n_kv_heads": 1}
    assert candidate_changes(plain, 8, "attention", "tpu") == [wider]
    assert candidate_changes(plain, 8, "attention", "cpu") == candidate_changes(plain, 8, "mlp", "tpu") == []
    assert with_fields(plain, wider).model.head_dim == 2 * plain.model.head_dim
    for kept in ({"lora": {"rank": 4}}, {"model": {"n_heads": 1}}, {"model": {"d_model": 256, "n_heads": 2}}):
        assert wider_heads(tiny_config(**kept)) is None  # fixed weights, one head, heads 128 wide already


@pytest.mark.slow
def test_a_checked_suggestion_times_the_run_and_each_change_and_names_the_fastest_that_helps(tiny_config, tmp_path):
    config = tiny_config(remat="full")
    summary = profile_training(config, tmp_path / "profile", steps=2, checks=0)
    wider = {"model.n_heads": 1, "model.n_kv_heads": 1}
    candidates = [{"remat": "none"}, {"batch_size": 16}, {"seq_len": 10**6}, wider]
    diagnosis = check_changes(config, summary, candidates)
    baseline, *changes = diagnosis.checked
    assert (baseline.change, baseline.speedup) == ({}, 1.0) and baseline.tokens_per_s > 0
    for change in (*changes[:2], changes[3]):
        assert change.tokens_per_s > 0 and change.speedup == pytest.approx(change.tokens_per_s / baseline.tokens_per_s)
    assert changes[2].tokens_per_s is None and "seq_len" in changes[2].error  # a change that cannot run says why
    helping = [c for c in changes if c.speedup and c.speedup >= 1.05]
    if helping:
        best = max(helping, key=lambda c: c.speedup)
        assert diagnosis.suggestion.startswith(f"set {named_fields(best.change)}: it trained at")
        assert ("for a run that starts from scratch" in diagnosis.suggestion) == (best.change == wider)
    else:
        tried = "remat=none; batch_size=16; seq_len=1000000; model.n_heads=1 and model.n_kv_heads=1"
        assert f"timed here and not faster: {tried}" in diagnosis.suggestion
    unchecked = check_changes(config, summary, [])  # what a 125M on a v5e gave: no candidate to time
    assert unchecked.checked == [] and unchecked.suggestion.endswith(
        "(nothing to time here: twice the batch exceeds the memory estimate, remat is off, layers unrolled)"
    )
