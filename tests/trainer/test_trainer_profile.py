"""Profiling builds the run as training does, times its steps and leaves a trace behind."""

import subprocess
import sys

import jax
import pytest

from tradewind.core import InvalidInputError, read_json
from tradewind.trainer import ProfileSummary, RunLayout, profile_training


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


@pytest.mark.slow
def test_profile_module_profiles_the_run_folder_from_its_config_json(tiny_config, tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.config.write_text(tiny_config(steps=2).model_dump_json(), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "tradewind.trainer.profile", str(layout.root), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = ProfileSummary.model_validate(read_json(layout.profile / "summary.json"))
    assert summary.steps == 2
    assert summary.trace_dir == str(layout.profile / "trace")
    assert not layout.metrics.exists()  # profiling leaves the run's own files alone
