"""The pure train and eval steps: functions of pytrees, jitted and placed by `tradewind.trainer.setup`.

The model is split once into a static `graphdef`, the state the run trains (`params`: every weight, or a LoRA
run's adapters and their dropout streams) and the state it only reads (`frozen`: a LoRA run's base model, else
empty); the steps are plain functions of pytrees that merge the graphdef back inside the loss, so `jax.jit`
traces them once and no nnx graph is walked per step.

One update, inside `jax.jit`:
    batch [B, S+1] -> `grad_accum` microbatches -> summed loss and gradients (lax.scan) -> mean
    -> optimizer update (at a unit rate) * learning_rate -> (skip it if the loss is not finite and
    `on_nonfinite="skip"`) -> the dropout streams one update on
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tradewind.data import DocumentBatch
from tradewind.runs.flops import block_logits
from tradewind.runs.models.base import BlockRemat
from tradewind.trainer.cross_entropy import fused_cross_entropy
from tradewind.trainer.lora import advance_dropout

Params = Any  # an nnx.State of the model's parameters
Batch = jax.Array | DocumentBatch  # token windows [batch, seq + 1], or packed documents with their masks
TrainStep = Callable[..., tuple[Params, optax.OptState, dict[str, jax.Array]]]
EvalStep = Callable[..., jax.Array]


def next_token_loss(
    graphdef: nnx.GraphDef,
    params: Params,
    batch: Batch,
    z_loss: float = 0.0,
    remat: BlockRemat = "none",
    *frozen: nnx.State,
    logits_per_block: int = block_logits("cpu"),
) -> tuple[jax.Array, jax.Array]:
    """Mean loss of predicting `batch[:, 1:]` from `batch[:, :-1]`: `(objective, cross-entropy)`, float32.

    A batch of packed documents (`DocumentBatch`) scores only the targets its loss mask marks, and each
    document attends to itself from position 0.

    The objective adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1. The
    output projection and the cross-entropy are one fused, blockwise step (`tradewind.trainer.cross_entropy`):
    the [batch, seq, vocab] logits are never materialised.

    Args:
        graphdef: the model's static structure, from `nnx.split`.
        params: the model's parameters (those differentiated).
        batch: token windows [batch, seq + 1] (int32), or a `DocumentBatch` of such arrays.
        z_loss: weight of the z-loss term (0 leaves it out of the graph).
        remat: what each block keeps for the backward pass (the same values, less memory, more compute); one
            policy, or one per block.
        frozen: the rest of the model's state (a LoRA run's base model and dropout streams).
        logits_per_block: the fused cross-entropy's block (`block_logits` of the platform the step runs on).
    """
    model = nnx.merge(graphdef, params, *frozen)
    if isinstance(batch, DocumentBatch):
        inputs = batch.tokens[:, :-1]
        targets = jnp.where(batch.loss_mask[:, 1:] > 0, batch.tokens[:, 1:], -1)  # -1: not scored
        segments, positions = batch.segments[:, :-1], batch.positions[:, :-1]
    else:
        inputs, targets, segments, positions = batch[:, :-1], batch[:, 1:], None, None
    hidden, _ = model.features(inputs, remat=remat, segments=segments, positions=positions)  # [batch, seq, d_model]
    rows = hidden.reshape(-1, hidden.shape[-1]).astype(model.dtype)  # [batch * seq, d_model]
    with jax.named_scope("loss"):
        return fused_cross_entropy(rows, model.head_weight(), targets.reshape(-1), z_loss, logits_per_block)


def loss_and_grads(
    graphdef: nnx.GraphDef,
    params: Params,
    batch: Batch,
    grad_accum: int,
    z_loss: float,
    remat: BlockRemat = "none",
    *frozen: nnx.State,
    logits_per_block: int = block_logits("cpu"),
) -> tuple[jax.Array, Params]:
    """Cross-entropy and gradient of the objective with respect to `params` (the rest of the model's state is
    `frozen`), over `grad_accum` equal microbatches: each microbatch's mean weighed by the targets it scores, so
    that the result is the whole batch's mean whatever the split (a microbatch of packed chats may score few)."""

    def one(microbatch: jax.Array) -> tuple[jax.Array, Params]:
        (_, cross_entropy), grads = jax.value_and_grad(
            lambda p: next_token_loss(
                graphdef, p, microbatch, z_loss, remat, *frozen, logits_per_block=logits_per_block
            ),
            has_aux=True,
        )(params)
        return cross_entropy, grads

    if grad_accum == 1:
        return one(batch)
    microbatches = jax.tree.map(lambda x: x.reshape(grad_accum, -1, x.shape[-1]), batch)  # [accum, b, seq + 1]

    def accumulate(carry, microbatch):
        loss_sum, grad_sum, scored = carry
        loss, grads = one(microbatch)
        weight = scored_targets(microbatch)
        grad_sum = jax.tree.map(lambda total, g: total + weight * g, grad_sum, grads)
        return (loss_sum + weight * loss, grad_sum, scored + weight), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
    (loss_sum, grad_sum, scored), _ = jax.lax.scan(accumulate, zeros, microbatches)
    scored = jnp.maximum(scored, 1.0)
    return loss_sum / scored, jax.tree.map(lambda g: g / scored, grad_sum)


def scored_targets(batch: Batch) -> jax.Array:
    """How many targets `batch` scores (float32): every window's last seq_len tokens, or those its mask marks."""
    if isinstance(batch, DocumentBatch):
        return jnp.sum(batch.loss_mask[:, 1:] > 0).astype(jnp.float32)
    return jnp.float32(batch.shape[0] * (batch.shape[1] - 1))


def trained_tokens(batch: Batch) -> jax.Array:
    """How many tokens `batch` trains on (float32), what tokens/s and MFU count: every window's seq_len inputs, or
    the documents' inputs of packed documents, not their padding (which the step computes but learns nothing from)."""
    if isinstance(batch, DocumentBatch):
        return jnp.sum(batch.segments[:, :-1] > 0).astype(jnp.float32)
    return jnp.float32(batch.shape[0] * (batch.shape[1] - 1))


def weights_and_streams(params: Params) -> tuple[Params, Params]:
    """`params` split into the weights the optimizer updates and a LoRA run's dropout streams (else empty)."""
    return nnx.split_state(params, nnx.Not(nnx.RngState), nnx.RngState)


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    z_loss: float = 0.0,
    skip_nonfinite: bool = False,
    remat: BlockRemat = "none",
    logits_per_block: int = block_logits("cpu"),
) -> TrainStep:
    """The pure update `(params, opt_state, batch, learning_rate[, frozen]) -> (params, opt_state, metrics)`.

    `optimizer` is built at a unit learning rate (`build_optimizer`) over the trained weights; its update is
    scaled by `learning_rate`, a float32 scalar the loop passes in, so the compiled step serves any schedule.
    `params` may hold dropout streams beside the weights (a LoRA run's): they are not differentiated, and come
    back one update on. `frozen` is the state the step only reads (a LoRA run's base model).

    `metrics` holds `loss` (cross-entropy before the update), `grad_norm` (before clipping),
    `param_norm` (after the update), `skipped` (1.0 when a non-finite update was dropped) and `tokens` (those it
    trained on: `trained_tokens`).
    """

    def train_step(
        params: Params, opt_state: optax.OptState, batch: Batch, learning_rate: jax.Array, frozen: Params = None
    ):
        weights, streams = weights_and_streams(params)
        rest = (streams,) if frozen is None else (streams, frozen)
        loss, grads = loss_and_grads(
            graphdef, weights, batch, grad_accum, z_loss, remat, *rest, logits_per_block=logits_per_block
        )
        grad_norm = optax.tree.norm(grads)
        with jax.named_scope("optimizer"):
            updates, new_opt_state = optimizer.update(grads, opt_state, weights)
            updates = jax.tree.map(lambda update: learning_rate * update, updates)
            new_weights = optax.apply_updates(weights, updates)
        skipped = jnp.zeros((), jnp.float32)
        if skip_nonfinite:
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            new_weights = jax.tree.map(keep, new_weights, weights)
            new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
            skipped = 1.0 - finite.astype(jnp.float32)
        param_norm = optax.tree.norm(new_weights)
        metrics = {"loss": loss, "grad_norm": grad_norm, "param_norm": param_norm, "skipped": skipped}
        metrics |= {"tokens": trained_tokens(batch)}
        return nnx.merge_state(new_weights, advance_dropout(streams)), new_opt_state, metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef, logits_per_block: int = block_logits("cpu")) -> EvalStep:
    """The pure evaluation `(params, batch[, frozen]) -> cross-entropy`; `graphdef` is the model's in its
    deterministic mode (no dropout)."""

    def eval_step(params: Params, batch: Batch, frozen: Params = None) -> jax.Array:
        rest = () if frozen is None else (frozen,)
        return next_token_loss(graphdef, params, batch, 0.0, "none", *rest, logits_per_block=logits_per_block)[1]

    return eval_step
