"""`tradewind export` (via `python -m tradewind.trainer.cli`): a finished run as a Hugging Face directory.

`tradewind train` launches through the tools and is tested with them (tests/tools/test_tools_runs.py).
"""

import json
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tradewind.trainer.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_export_writes_an_hf_directory_for_a_run_named_by_id_or_by_workspace_path(ctx, finished_run, tmp_path):
    workspace = str(ctx.workspace.root)
    for run, out in ((finished_run.run_id, tmp_path / "by-id"), (f"runs/{finished_run.run_id}", tmp_path / "by-path")):
        exported = cli("export", run, "--workspace", workspace, "--format", "hf", "--out", str(out))
        assert exported.returncode == 0, exported.stderr[-3000:]
        assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
        assert (out / "model.safetensors").stat().st_size > 32 * 258 * 4
    assert (tmp_path / "by-id" / "model.safetensors").read_bytes() == (
        tmp_path / "by-path" / "model.safetensors"
    ).read_bytes()
    relative = cli("export", finished_run.run_id, "--workspace", workspace, "--out", "exports/tiny")
    assert relative.returncode == 0, relative.stderr[-3000:]
    assert (ctx.workspace.root / "exports" / "tiny" / "tokenizer.json").is_file()  # --out starts at the workspace


@pytest.mark.slow
def test_export_of_an_unknown_run_names_the_recent_ones_without_a_traceback(ctx, finished_run, tmp_path):
    exported = cli("export", "run-nope", "--workspace", str(ctx.workspace.root), "--out", str(tmp_path / "x"))
    assert exported.returncode == 2
    assert "unknown run id 'run-nope'" in exported.stderr and "Traceback" not in exported.stderr
