"""The fused, blockwise head + cross-entropy: the same values and gradients as logits then softmax cross-entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tradewind.runs.flops import block_logits
from tradewind.trainer.cross_entropy import block_rows, fused_cross_entropy


def plain(x, weight, targets, z_loss):
    """The unfused reference: the whole [tokens, vocab] logits, then optax's cross-entropy."""
    logits = jnp.dot(x, weight, preferred_element_type=jnp.float32)
    cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    log_z = jax.nn.logsumexp(logits, axis=-1)
    return cross_entropy + z_loss * jnp.mean(jnp.square(log_z)), cross_entropy


def inputs(tokens, d_model=16, vocab=50, dtype=jnp.float32, seed=0):
    kx, kw, kt = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (tokens, d_model)).astype(dtype)
    weight = (jax.random.normal(kw, (d_model, vocab)) * 0.5).astype(dtype)
    return x, weight, jax.random.randint(kt, (tokens,), 0, vocab)


def test_block_rows_hold_about_the_platforms_logits_and_never_exceed_the_tokens():
    cpu, tpu = block_logits("cpu"), block_logits("tpu")
    assert block_rows(4096, 8192, cpu) == 1024  # 32 MiB of float32 logits on a CPU
    assert block_rows(100_000, 50_257, cpu) == 128
    assert block_rows(100, 8192, cpu) == 128  # 100 tokens: one padded block
    assert block_rows(3, 10, cpu) == 4
    assert block_rows(32768, 32768, tpu) == 2048  # 256 MiB on an accelerator: a 125M's batch of 16 x 2048 in 16


# 37 tokens with a forced block of 8 rows: five blocks, the last padded with three rows that must count for nothing.
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
@pytest.mark.parametrize("tokens", [32, 37])
def test_values_and_gradients_of_both_outputs_match_the_plain_computation(tokens, z_loss):
    x, weight, targets = inputs(tokens)
    fused = jax.jit(lambda x, w: fused_cross_entropy(x, w, targets, z_loss, 8 * 50))  # 8 rows per block
    np.testing.assert_allclose(fused(x, weight), plain(x, weight, targets, z_loss), rtol=1e-6)
    for output in (0, 1):  # the objective, then the cross-entropy: each has its own gradient under z-loss
        got = jax.grad(lambda x, w, o=output: fused_cross_entropy(x, w, targets, z_loss, 8 * 50)[o], argnums=(0, 1))(
            x, weight
        )
        want = jax.grad(lambda x, w, o=output: plain(x, w, targets, z_loss)[o], argnums=(0, 1))(x, weight)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_a_weighted_sum_of_the_outputs_gets_the_weighted_sum_of_their_gradients():
    x, weight, targets = inputs(24)
    combined = lambda f: lambda x: 3.0 * f(x, weight, targets, 0.05)[0] - 2.0 * f(x, weight, targets, 0.05)[1]  # noqa: E731
    np.testing.assert_allclose(
        jax.grad(combined(fused_cross_entropy))(x), jax.grad(combined(plain))(x), rtol=1e-5, atol=1e-7
    )


def test_bfloat16_inputs_give_float32_losses_and_gradients_in_the_inputs_dtypes():
    x, weight, targets = inputs(64, dtype=jnp.bfloat16)
    objective, cross_entropy = fused_cross_entropy(x, weight, targets, 0.0)
    assert objective.dtype == cross_entropy.dtype == jnp.float32
    np.testing.assert_allclose(objective, plain(x, weight, targets, 0.0)[0], rtol=1e-6)
    dx, dw = jax.grad(lambda x, w: fused_cross_entropy(x, w, targets, 0.0)[0], argnums=(0, 1))(x, weight)
    assert dx.dtype == dw.dtype == jnp.bfloat16
    want_dx, want_dw = jax.grad(lambda x, w: plain(x, w, targets, 0.0)[0], argnums=(0, 1))(x, weight)
    np.testing.assert_allclose(dx.astype(jnp.float32), want_dx.astype(jnp.float32), rtol=2e-2, atol=1e-4)
    np.testing.assert_allclose(dw.astype(jnp.float32), want_dw.astype(jnp.float32), rtol=2e-2, atol=1e-4)
