"""The memory options a run can take to fit a chip, each trained for real on the CPU: what it changes in memory,
and that it leaves the losses as they were (or within what its rounding explains)."""

import jax
import numpy as np
import pytest

from tradewind.runs import RunLayout, read_metrics
from tradewind.trainer import read_checkpoint, setup_training, train


@pytest.mark.slow
def test_moments_kept_in_host_memory_train_the_same_losses_and_come_back_from_a_checkpoint(tiny_config, tmp_path):
    runs = {}
    for in_host in (False, True):
        config = tiny_config(steps=12, eval_every=6, log_every=2, optimizer={"host_state": in_host})
        runs[in_host] = config, tmp_path / str(in_host), train(config, tmp_path / str(in_host))
    losses = {}
    for in_host, (_, folder, _) in runs.items():
        losses[in_host] = [row.loss for row in read_metrics(RunLayout(folder).metrics) if row.loss is not None]
    assert len(losses[True]) == 6
    # The same arithmetic in another memory: 1e-5 is the bound the trainer's other options are held to.
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-5)
    assert runs[True][2].final_eval_loss == pytest.approx(runs[False][2].final_eval_loss, abs=1e-5)

    config, folder, _ = runs[True]
    setup = setup_training(config)
    kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(setup.state.opt_state) if leaf.ndim}
    assert kinds == {"pinned_host"}
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(setup.state.params)} == {"device"}
    restored = read_checkpoint(RunLayout(folder).checkpoints, setup.state)
    assert restored.step == 12
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(restored.opt_state) if leaf.ndim} == {"pinned_host"}
    moments = [np.asarray(leaf) for leaf in jax.tree.leaves(restored.opt_state) if leaf.ndim]
    assert any(np.abs(moment).sum() > 0 for moment in moments)  # the trained moments, not the initial zeros
