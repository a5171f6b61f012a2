"""The pure train and eval steps: functions of pytrees, jitted and placed by `tradewind.trainer.setup`.

The model is split once into a static `graphdef` and a pytree of parameters; the steps are plain
functions of pytrees that merge the graphdef back inside the loss, so `jax.jit` traces them once and no
nnx graph is walked per step.

One update, inside `jax.jit`:
    batch [B, S+1] -> `grad_accum` microbatches -> summed loss and gradients (lax.scan) -> mean
    -> optimizer update (at a unit rate) * learning_rate -> (skip it if the loss is not finite and
    `on_nonfinite="skip"`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tradewind.trainer.cross_entropy import fused_cross_entropy
from tradewind.trainer.models.base import Remat

Params = Any  # an nnx.State of the model's parameters
TrainStep = Callable[[Params, optax.OptState, Any, Any], tuple[Params, optax.OptState, dict[str, jax.Array]]]
EvalStep = Callable[[Params, Any], jax.Array]


def next_token_loss(
    graphdef: nnx.GraphDef, params: Params, batch: jax.Array, z_loss: float = 0.0, remat: Remat = "none"
) -> tuple[jax.Array, jax.Array]:
    """Mean loss of predicting `batch[:, 1:]` from `batch[:, :-1]`: `(objective, cross-entropy)`, float32.

    The objective adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1. The
    output projection and the cross-entropy are one fused, blockwise step (`tradewind.trainer.cross_entropy`):
    the [batch, seq, vocab] logits are never materialised.

    Args:
        graphdef: the model's static structure, from `nnx.split`.
        params: the model's parameters.
        batch: token windows [batch, seq + 1] (int32).
        z_loss: weight of the z-loss term (0 leaves it out of the graph).
        remat: what each block keeps for the backward pass (the same values, less memory, more compute).
    """
    model = nnx.merge(graphdef, params)
    hidden, _ = model.features(batch[:, :-1], remat=remat)  # [batch, seq, d_model]
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(model.dtype)  # [batch * seq, d_model]
    return fused_cross_entropy(rows, model.head_weight(), batch[:, 1:].reshape(-1), z_loss)


def loss_and_grads(
    graphdef: nnx.GraphDef,
    params: Params,
    batch: jax.Array,
    grad_accum: int,
    z_loss: float,
    remat: Remat = "none",
) -> tuple[jax.Array, Params]:
    """Cross-entropy and gradient of the objective, averaged over `grad_accum` equal microbatches."""

    def one(microbatch: jax.Array) -> tuple[jax.Array, Params]:
        (_, cross_entropy), grads = jax.value_and_grad(
            lambda p: next_token_loss(graphdef, p, microbatch, z_loss, remat), has_aux=True
        )(params)
        return cross_entropy, grads

    if grad_accum == 1:
        return one(batch)
    microbatches = batch.reshape(grad_accum, batch.shape[0] // grad_accum, batch.shape[1])  # [accum, b, seq + 1]

    def accumulate(carry, microbatch):
        loss_sum, grad_sum = carry
        loss, grads = one(microbatch)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss_sum, grad_sum), _ = jax.lax.scan(accumulate, zeros, microbatches)
    return loss_sum / grad_accum, jax.tree.map(lambda g: g / grad_accum, grad_sum)


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    z_loss: float = 0.0,
    skip_nonfinite: bool = False,
    remat: Remat = "none",
) -> TrainStep:
    """The pure update `(params, opt_state, batch, learning_rate) -> (params, opt_state, metrics)`.

    `optimizer` is built at a unit learning rate (`build_optimizer`); its update is scaled by `learning_rate`, a
    float32 scalar the loop passes in, so the compiled step serves any schedule.

    `metrics` holds `loss` (cross-entropy before the update), `grad_norm` (before clipping),
    `param_norm` (after the update) and `skipped` (1.0 when a non-finite update was dropped).
    """

    def train_step(params: Params, opt_state: optax.OptState, batch: jax.Array, learning_rate: jax.Array):
        loss, grads = loss_and_grads(graphdef, params, batch, grad_accum, z_loss, remat)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        updates = jax.tree.map(lambda update: learning_rate * update, updates)
        new_params = optax.apply_updates(params, updates)
        skipped = jnp.zeros((), jnp.float32)
        if skip_nonfinite:
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            new_params = jax.tree.map(keep, new_params, params)
            new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
            skipped = 1.0 - finite.astype(jnp.float32)
        metrics = {"loss": loss, "grad_norm": grad_norm, "param_norm": optax.tree.norm(new_params), "skipped": skipped}
        return new_params, new_opt_state, metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef) -> EvalStep:
    """The pure evaluation `(params, batch) -> cross-entropy`."""

    def eval_step(params: Params, batch: jax.Array) -> jax.Array:
        return next_token_loss(graphdef, params, batch)[1]

    return eval_step
