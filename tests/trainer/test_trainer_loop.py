"""The training loop itself: hooks run at the steps they want, and a resumed run gets its whole state back."""

import shutil

import numpy as np
import pytest

from tradewind.runs import RunLayout
from tradewind.trainer import Checkpointer, TrainState, read_checkpoint, run_steps, setup_training, train
from tradewind.trainer.hooks import Interval


class Recorder:
    """A hook that wants every `every`-th step and notes what the loop hands it."""

    def __init__(self, every: int):
        self.every, self.seen = every, []

    def wants(self, step: int) -> bool:
        return step % self.every == 0

    def __call__(self, state: TrainState, interval: Interval) -> None:
        self.seen.append((state.step, state.data_step, len(interval.metrics), interval.seconds > 0))
        interval.clear()


@pytest.mark.slow
def test_hooks_run_at_the_steps_they_want_with_the_updates_since_the_last_wait(tiny_config):
    setup = setup_training(tiny_config(steps=7))
    recorder = Recorder(every=3)
    state = run_steps(setup, setup.state, [recorder])
    assert (state.step, state.data_step) == (7, 7)
    assert recorder.seen == [(3, 3, 3, True), (6, 6, 3, True)]
    assert run_steps(setup, state, [recorder], last_step=9).step == 9
    assert recorder.seen[-1][:3] == (9, 9, 2)  # steps 8 and 9 since the last wait


@pytest.mark.slow
def test_a_resumed_run_continues_with_the_rng_its_checkpoint_saved(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_config(steps=4), run_dir)
    layout = RunLayout(run_dir)
    saved = read_checkpoint(layout.checkpoints, setup_training(tiny_config(steps=4)).state)
    # Give checkpoint 4 a key no seed would make, then extend the run (an unfinished run resumes).
    marked = TrainState(saved.params, saved.opt_state, saved.step, saved.data_step, np.array([17, 29], np.uint32))
    shutil.rmtree(layout.checkpoints / "4")
    checkpointer = Checkpointer(layout.checkpoints)
    checkpointer.save(marked)
    checkpointer.close()
    layout.summary.unlink()
    train(tiny_config(steps=6), run_dir)
    final = read_checkpoint(layout.checkpoints, saved)
    assert (final.step, final.data_step) == (6, 6)
    np.testing.assert_array_equal(final.rng, [17, 29])
