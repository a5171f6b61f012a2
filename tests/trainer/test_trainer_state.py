"""The training state: what a run continues from, and its round trip through the checkpoint pytree."""

import jax
import jax.numpy as jnp
import numpy as np

from tradewind.trainer.state import TrainState


def params():
    return {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)}


def test_a_new_state_is_at_step_zero_with_the_loader_at_its_start_and_the_seeds_key():
    state = TrainState.start(params(), {"mu": jnp.ones(3)}, seed=7)
    assert (state.step, state.data_step) == (0, 0)
    assert state.rng.dtype == np.uint32 and state.rng.shape == (2,)
    np.testing.assert_array_equal(state.rng, jax.random.key_data(jax.random.key(7)))
    assert not np.array_equal(state.rng, TrainState.start(params(), {}, seed=8).rng)


def test_advancing_counts_one_update_and_one_batch_and_keeps_the_key():
    state = TrainState.start(params(), {"mu": jnp.ones(3)}, seed=0)
    new_params = {"w": state.params["w"] + 1, "b": state.params["b"]}
    after = state.advanced(new_params, {"mu": jnp.zeros(3)}).advanced(new_params, {"mu": jnp.zeros(3)})
    assert (after.step, after.data_step) == (2, 2)
    assert after.params is new_params and np.array_equal(after.rng, state.rng)
    assert state.step == 0  # the state is a value: advancing made a new one


def test_a_state_round_trips_through_its_checkpoint_pytree_as_host_values():
    state = TrainState.start(params(), {"mu": jnp.ones(3)}, seed=3).advanced(params(), {"mu": jnp.full(3, 2.0)})
    tree = state.to_checkpoint()
    assert set(tree) == {"params", "opt_state", "step", "data_step", "rng"}
    # What a checkpoint restores: numpy scalars and arrays, the key possibly in another integer type.
    restored = TrainState.from_checkpoint(
        {**jax.tree.map(np.asarray, tree), "step": np.int64(1), "rng": tree["rng"].astype(np.int64)}
    )
    assert (restored.step, restored.data_step) == (1, 1) and type(restored.step) is int
    assert restored.rng.dtype == np.uint32 and np.array_equal(restored.rng, state.rng)
    np.testing.assert_array_equal(restored.opt_state["mu"], np.full(3, 2.0))
    np.testing.assert_array_equal(restored.params["w"], np.arange(6.0).reshape(2, 3))
