"""Next-token cross-entropy fused with the output projection, computed a block of rows at a time.

The plain way, `logits = x @ W` and then a softmax cross-entropy, writes a [tokens, vocab] float32 array
and reads it back several times (log-sum-exp, softmax, its gradient, two gradient matmuls). Here each
block of rows does everything while its logits are in cache: the logits, their log-sum-exp, the gradient of
the loss with respect to them (softmax minus one-hot, over the token count), and the two matmuls that turn
that into gradients of `x` and `W`. The backward pass only scales those by the incoming cotangent. The
same three matmuls as the unfused pass, nothing recomputed, and no array larger than [rows, vocab]:
the issue-12 model (vocab 8192) trains 1.17-1.23x as fast on CPU (docs/reports/benchmarks.md).

Example:
    objective, cross_entropy = fused_cross_entropy(x, model.head_weight(), targets, 0.0, block_logits("tpu"))
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tradewind.runs.flops import block_logits


def block_rows(tokens: int, vocab: int, logits_per_block: int) -> int:
    """Rows per block: the power of two whose [rows, vocab] logits hold about `logits_per_block` values (at
    least 8), but no more than `tokens` rounded up to a power of two."""
    rows = max(8, 1 << max(0, (logits_per_block // vocab).bit_length() - 1))
    return min(rows, 1 << max(0, (tokens - 1).bit_length()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def fused_cross_entropy(
    x: jax.Array, weight: jax.Array, targets: jax.Array, z_loss: float, logits_per_block: int = block_logits("cpu")
) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy of predicting `targets` from the logits `x @ weight`: `(objective, cross_entropy)`.

    The objective adds `z_loss * mean(logsumexp(logits)^2)`; both are float32 and both differentiable. Rows
    whose target is -1 are not scored: the means are over the others (e.g. a chat's assistant tokens).

    Args:
        x: hidden states [tokens, d_model], in the compute dtype.
        weight: the output projection [d_model, vocab], in the compute dtype.
        targets: the next token of each row [tokens] (int32), or -1.
        z_loss: weight of the z-loss term (static; 0 leaves it out).
        logits_per_block: the logits a block holds (static; `block_logits` of the platform).
    """
    objective, cross_entropy, _ = _over_blocks(x, weight, targets, z_loss, logits_per_block, with_grads=False)
    return objective, cross_entropy


def _forward(x, weight, targets, z_loss, logits_per_block):
    objective, cross_entropy, grads = _over_blocks(x, weight, targets, z_loss, logits_per_block, with_grads=True)
    grads = [(dx.astype(x.dtype), dw.astype(weight.dtype)) for dx, dw in grads]
    return (objective, cross_entropy), (grads, targets)


def _backward(z_loss, logits_per_block, residuals, cotangents):
    grads, targets = residuals
    g_objective, g_cross_entropy = cotangents
    if z_loss:  # the objective's gradients, then the cross-entropy's
        (dx_objective, dw_objective), (dx_ce, dw_ce) = grads
        dx = g_objective * dx_objective + g_cross_entropy * dx_ce
        dw = g_objective * dw_objective + g_cross_entropy * dw_ce
    else:  # the two outputs are the same function
        ((dx, dw),) = grads
        dx, dw = (g_objective + g_cross_entropy) * dx, (g_objective + g_cross_entropy) * dw
    dx_dtype, dw_dtype = grads[0][0].dtype, grads[0][1].dtype  # the inputs' dtypes
    return dx.astype(dx_dtype), dw.astype(dw_dtype), np.zeros(targets.shape, jax.dtypes.float0)


fused_cross_entropy.defvjp(_forward, _backward)


def _over_blocks(
    x: jax.Array, weight: jax.Array, targets: jax.Array, z_loss: float, logits_per_block: int, *, with_grads: bool
):
    """Objective, cross-entropy and (`with_grads`) per differentiable output the float32 gradients
    `(dx [tokens, d_model], dw [d_model, vocab])` of its mean: the objective's first when `z_loss`."""
    tokens, d_model = x.shape
    vocab = weight.shape[1]
    scored = jnp.maximum(jnp.sum(targets >= 0), 1).astype(jnp.float32)  # the means' denominator
    rows = block_rows(tokens, vocab, logits_per_block)
    n_blocks = -(-tokens // rows)
    padding = n_blocks * rows - tokens
    x = jnp.pad(x, ((0, padding), (0, 0)))
    targets = jnp.pad(targets, (0, padding), constant_values=-1)  # -1 marks a padding row
    # Block i holds rows i, i + n_blocks, i + 2 * n_blocks, ...: when the rows are sharded over devices
    # (data parallel), every block has rows on every device, so the loop never gathers a block.
    x_blocks = x.reshape(rows, n_blocks, d_model).swapaxes(0, 1)  # [n_blocks, rows, d_model]
    target_blocks = targets.reshape(rows, n_blocks).T  # [n_blocks, rows]

    def block(dw_sums, inputs):
        xb, tb = inputs  # [rows, d_model], [rows]
        logits = jnp.dot(xb, weight, preferred_element_type=jnp.float32)  # [rows, vocab]
        log_z = jax.nn.logsumexp(logits, axis=-1)  # [rows]
        real = tb >= 0
        target_logit = jnp.take_along_axis(logits, jnp.maximum(tb, 0)[:, None], axis=-1)[:, 0]
        sums = (jnp.sum(jnp.where(real, log_z - target_logit, 0.0)), jnp.sum(jnp.where(real, jnp.square(log_z), 0.0)))
        if not with_grads:
            return dw_sums, (sums, ())
        probs = jnp.exp(logits - log_z[:, None])  # [rows, vocab]
        one_hot = jnp.arange(vocab)[None, :] == tb[:, None]  # a padding row matches no token
        d_ce = jnp.where(real[:, None], probs - one_hot, 0.0) / scored  # d mean cross-entropy / d logits
        d_logits = [d_ce]
        if z_loss:  # d z_loss * mean(log_z^2) / d logits = 2 z_loss log_z softmax / scored
            d_logits.insert(0, d_ce + jnp.where(real, 2.0 * z_loss * log_z / scored, 0.0)[:, None] * probs)
        d_logits = [d.astype(weight.dtype) for d in d_logits]
        dx = tuple(jnp.dot(d, weight.T, preferred_element_type=jnp.float32) for d in d_logits)  # [rows, d_model]
        dw_sums = tuple(
            s + jnp.dot(xb.T, d, preferred_element_type=jnp.float32) for s, d in zip(dw_sums, d_logits, strict=True)
        )
        return dw_sums, (sums, dx)

    n_outputs = (2 if z_loss else 1) if with_grads else 0
    zeros = tuple(jnp.zeros((d_model, vocab), jnp.float32) for _ in range(n_outputs))
    dw_sums, ((ce_sums, log_z_sq_sums), dx_blocks) = jax.lax.scan(block, zeros, (x_blocks, target_blocks))
    cross_entropy = jnp.sum(ce_sums) / scored
    objective = cross_entropy + z_loss * jnp.sum(log_z_sq_sums) / scored if z_loss else cross_entropy
    dx = [b.swapaxes(0, 1).reshape(n_blocks * rows, d_model)[:tokens] for b in dx_blocks]  # [tokens, d_model]
    return objective, cross_entropy, list(zip(dx, dw_sums, strict=True))
