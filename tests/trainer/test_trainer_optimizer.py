"""The schedule warms up then decays to its floor; AdamW decays matrices and leaves norm scales alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tradewind.runs import OptimizerConfig, model_config
from tradewind.trainer import build_model, build_optimizer, build_schedule


def test_schedule_warms_up_linearly_from_zero_then_decays_by_cosine_to_the_minimum():
    config = OptimizerConfig(learning_rate=1e-2, warmup_steps=10, min_lr_ratio=0.1)
    schedule = build_schedule(config, total_steps=110)
    lrs = np.array([float(schedule(step)) for step in range(111)])
    assert lrs[0] == 0.0
    np.testing.assert_allclose(lrs[5], 5e-3, rtol=1e-5)
    np.testing.assert_allclose(lrs[10], 1e-2, rtol=1e-5)
    np.testing.assert_allclose(lrs[60], (1e-2 + 1e-3) / 2, rtol=1e-4)  # cosine midpoint
    np.testing.assert_allclose(lrs[110], 1e-3, rtol=1e-5)
    assert np.all(np.diff(lrs[:11]) > 0)
    assert np.all(np.diff(lrs[10:]) < 0)


@pytest.mark.parametrize(("warmup", "total"), [(0, 50), (100, 20)])
def test_schedule_handles_no_warmup_and_warmup_longer_than_the_run(warmup, total):
    config = OptimizerConfig(learning_rate=1e-2, warmup_steps=warmup, min_lr_ratio=0.1)
    schedule = build_schedule(config, total_steps=total)
    peak_step = min(warmup, total)
    np.testing.assert_allclose(float(schedule(peak_step)), 1e-2, rtol=1e-5)
    if peak_step < total:
        np.testing.assert_allclose(float(schedule(total)), 1e-3, rtol=1e-5)


def test_weight_decay_shrinks_matrices_but_not_norm_scales():
    model = build_model(model_config(vocab_size=50, d_model=32, n_layers=2, n_heads=2), rngs=nnx.Rngs(0))
    _, params = nnx.split(model)
    optimizer = build_optimizer(OptimizerConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5))
    zero_grads = jax.tree.map(jnp.zeros_like, params)  # Adam's own step is then 0: only decay moves params
    updates, _ = jax.jit(optimizer.update)(zero_grads, optimizer.init(params), params)
    moved = {
        jax.tree_util.keystr(path): bool(jnp.any(update != 0))
        for path, update in jax.tree_util.tree_leaves_with_path(updates)
    }
    assert any("scale" in name for name in moved)
    for name, did_move in moved.items():
        assert did_move == ("scale" not in name), name


def random_like(key, tree):
    """Standard normal values in the shapes of `tree`'s leaves."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)])


@pytest.mark.parametrize("rule", ["adamw", "lion", "adafactor"])
def test_bf16_moments_are_stored_in_bfloat16_and_update_as_float32_moments_do(rule):
    """Tolerance: after 30 updates of random gradients, the last update within 1% (relative, summed over the model)
    of the float32 moments' (measured: 0.36% AdamW, 0.14% Lion, 0.16% Adafactor). bfloat16 keeps 8 bits of
    mantissa: a stored moment is off by at most 0.4%, so Adam's mu / sqrt(nu) by at most 0.6%."""
    model = build_model(model_config(vocab_size=50, d_model=32, n_layers=2, n_heads=2), rngs=nnx.Rngs(0))
    _, params = nnx.split(model)
    keys = jax.random.split(jax.random.key(1), 30)
    results = {}
    for bf16 in (False, True):
        optimizer = build_optimizer(OptimizerConfig(type=rule, bf16_moments=bf16))
        state, update = optimizer.init(params), jax.jit(optimizer.update)
        for key in keys:
            updates, state = update(random_like(key, params), state, params)
        floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
        results[bf16] = updates, {x.dtype for x in floats}
    (exact, exact_dtypes), (rounded, rounded_dtypes) = results[False], results[True]
    assert exact_dtypes == {jnp.dtype("float32")} and rounded_dtypes == {jnp.dtype("bfloat16")}
    pairs = zip(jax.tree.leaves(exact), jax.tree.leaves(rounded), strict=True)
    difference = sum(float(jnp.abs(a - b).sum()) for a, b in pairs)
    assert difference <= 0.01 * sum(float(jnp.abs(a).sum()) for a in jax.tree.leaves(exact))
