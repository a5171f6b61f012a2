"""Checkpoints: policies, retention, in-progress and corrupt checkpoints, and exact resume after SIGKILL."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until

from tradewind.core import NotFoundError, read_json
from tradewind.runs import RunLayout, read_metrics
from tradewind.runs.config import CheckpointConfig
from tradewind.trainer.checkpoint import read_checkpoint
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.state import TrainState


def state(step: int) -> TrainState:
    """A small state whose every field says which step it is."""
    return TrainState(
        params={"w": np.full((4, 4), float(step), np.float32)},
        opt_state={"mu": np.full((4,), -float(step), np.float32)},
        step=step,
        data_step=step + 1000,
        rng=np.array([step, 7 * step], np.uint32),
    )


def test_keep_last_n_plus_every_k_decides_which_checkpoints_stay(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(keep_last=2, keep_every=4, async_save=False))
    for step in range(1, 11):
        checkpointer.save(state(step))
    checkpointer.close()
    assert Checkpointer(tmp_path / "ckpt").steps() == [4, 8, 9, 10]


def test_step_policy_saves_on_multiples_and_the_final_step_only():
    checkpointer_policy = CheckpointConfig(every_steps=5)
    checkpointer = Checkpointer.__new__(Checkpointer)
    checkpointer.policy, checkpointer.last_save_time = checkpointer_policy, time.monotonic()
    assert [s for s in range(1, 13) if checkpointer.should_save(s, final=s == 12)] == [5, 10, 12]


def test_time_policy_saves_once_the_interval_has_passed_since_the_last_save():
    checkpointer = Checkpointer.__new__(Checkpointer)
    checkpointer.policy = CheckpointConfig(every_minutes=1.0)
    checkpointer.last_save_time = time.monotonic()
    assert not checkpointer.should_save(3)
    checkpointer.last_save_time = time.monotonic() - 61
    assert checkpointer.should_save(4)


def test_async_save_returns_and_the_checkpoint_reads_back_after_close(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=True))
    checkpointer.save(state(3))
    checkpointer.close()
    restored = Checkpointer(tmp_path / "ckpt").restore(state(0))
    assert restored.step == 3
    np.testing.assert_array_equal(restored.params["w"], state(3).params["w"])


def test_a_checkpoint_still_being_written_is_never_chosen_for_restore(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False))
    checkpointer.save(state(2))
    checkpointer.close()
    # What orbax leaves while step 5 is being written (or after a crash mid-write).
    partial = tmp_path / "ckpt" / "5.orbax-checkpoint-tmp-1700000000"
    partial.mkdir()
    (partial / "garbage").write_bytes(b"\0" * 10)
    reopened = Checkpointer(tmp_path / "ckpt")
    assert reopened.steps() == [2]
    assert reopened.restore(state(0)).step == 2


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, capsys):
    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False))
    checkpointer.save(state(2))
    checkpointer.save(state(4))
    checkpointer.close()
    for path in (tmp_path / "ckpt" / "4").rglob("*"):
        if path.is_file():
            path.write_bytes(b"corrupt")
    reopened = Checkpointer(tmp_path / "ckpt")
    restored = reopened.restore(state(0))
    assert restored.step == 2
    np.testing.assert_array_equal(restored.params["w"], state(2).params["w"])
    assert len(reopened.warnings) == 1 and "checkpoint 4" in reopened.warnings[0]
    with pytest.raises(Exception):  # noqa: B017 (an explicit step is not silently replaced)
        reopened.restore(state(0), step=4)


def test_every_field_of_the_training_state_comes_back_from_a_checkpoint(tmp_path):
    saved = state(6)
    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False))
    checkpointer.save(saved)
    checkpointer.close()
    restored = read_checkpoint(tmp_path / "ckpt", state(0))
    assert (restored.step, restored.data_step) == (6, 1006)
    np.testing.assert_array_equal(restored.rng, saved.rng)
    np.testing.assert_array_equal(restored.params["w"], saved.params["w"])
    np.testing.assert_array_equal(restored.opt_state["mu"], saved.opt_state["mu"])
    assert set(saved.to_checkpoint()) == {field.name for field in dataclasses.fields(TrainState)}


def test_restoring_from_an_empty_folder_is_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="no checkpoints"):
        Checkpointer(tmp_path / "ckpt").restore(state(0))


def start_run(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tradewind.trainer", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def final_params(run_dir: Path) -> list[np.ndarray]:
    import jax

    from tradewind.trainer.restore import load_run_model

    return [np.asarray(leaf) for leaf in jax.tree.leaves(load_run_model(run_dir).params)]


@pytest.mark.slow
def test_a_run_killed_mid_training_resumes_to_bitwise_the_same_parameters(tiny_config, tmp_path):
    config = tiny_config(steps=240, log_every=20, eval_every=80, checkpoints={"every_steps": 20, "keep_last": 2})
    runs = {}
    for name in ("killed", "straight"):
        runs[name] = RunLayout(tmp_path / name)
        runs[name].root.mkdir()
        runs[name].config.write_text(config.model_dump_json(), encoding="utf-8")

    straight = start_run(runs["straight"].root)  # the uninterrupted reference, alongside
    process = start_run(runs["killed"].root)

    def checkpointed() -> bool:
        assert process.poll() is None, process.stderr.read()
        return any(p.name.isdigit() and int(p.name) >= 40 for p in runs["killed"].checkpoints.glob("*"))

    # Wait until a checkpoint has been completed (listed under its step number), then kill at once.
    wait_until(checkpointed, 120, "a checkpoint at step 40 or later", interval=0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not runs["killed"].summary.exists(), "the run finished before it could be killed; lengthen it"

    result = subprocess.run(
        [sys.executable, "-m", "tradewind.trainer", str(runs["killed"].root)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert straight.wait(timeout=300) == 0, straight.stderr.read()[-3000:]

    summary = read_json(runs["killed"].summary)
    assert summary["resumed_from_step"] >= 40 and summary["steps"] == 240
    for a, b in zip(final_params(runs["killed"].root), final_params(runs["straight"].root), strict=True):
        np.testing.assert_array_equal(a, b)
    killed_rows = read_metrics(runs["killed"].metrics)
    straight_rows = read_metrics(runs["straight"].metrics)
    assert [r.step for r in killed_rows] == [r.step for r in straight_rows]
    assert [r.eval_loss for r in killed_rows] == [r.eval_loss for r in straight_rows]
    # The first log row after the resume averages fewer steps; every later one must match exactly.
    resumed = summary["resumed_from_step"]
    later = [i for i, r in enumerate(straight_rows) if r.step > resumed + config.log_every]
    assert later and [killed_rows[i].loss for i in later] == [straight_rows[i].loss for i in later]
