"""`tradewind train` and `tradewind export` (via `python -m tradewind.trainer.cli`), and the shipped configs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tradewind.core import load_config, read_json
from tradewind.trainer import RunLayout, TrainConfig, read_metrics

EXPERIMENTS = sorted((Path(__file__).parents[2] / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_shipped_experiment_config_parses(path):
    config = load_config(TrainConfig, path)
    assert config.steps > 0 and config.model.d_model > 0


def test_the_experiments_folder_ships_configs():
    assert len(EXPERIMENTS) >= 4


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tradewind.trainer.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_train_command_runs_two_steps_with_overrides_then_export_writes_an_hf_directory(tiny_cache, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        "train",
        str(next(p for p in EXPERIMENTS if p.stem == "nano-shakespeare")),
        "--set",
        f"dataset={tiny_cache}",
        "--set",
        "steps=2",
        "--set",
        "model.d_model=32",
        "--set",
        "model.n_layers=1",
        "--set",
        "seq_len=32",
        "--set",
        "log_every=1",
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    layout = RunLayout(run_dir)
    assert read_json(layout.summary)["steps"] == 2
    assert json.loads(layout.config.read_text())["model"]["d_model"] == 32
    assert [row.step for row in read_metrics(layout.metrics)] == [0, 1, 2]
    assert "train" in result.stderr  # the progress bar and the final line go to stderr

    exported = cli("export", str(run_dir), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_size"] == 32
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size > 32 * 258 * 4


def test_train_command_reports_a_bad_override_naming_the_field(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("dataset: nowhere\n")
    result = cli("train", str(config), "--set", "model.n_heads=3", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "model.n_heads" in result.stderr and "Traceback" not in result.stderr
