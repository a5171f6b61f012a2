"""The pure train and eval steps, and `setup_training`, which builds everything a run needs around them.

The model is split once into a static `graphdef` and a pytree of parameters; the steps are plain
functions of pytrees that merge the graphdef back inside the loss, so `jax.jit` traces them once and no
nnx graph is walked per step. `setup_training` is shared by `train` and `profile_training`: it opens
the token cache, builds model, optimizer and loaders, and compiles both steps ahead of time so that
compilation is timed on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tradewind.core import ConfigError
from tradewind.data import CacheManifest, PackedLoader
from tradewind.trainer.batches import open_run_data
from tradewind.trainer.config import ModelConfig, TrainConfig
from tradewind.trainer.model import build_model, count_params
from tradewind.trainer.optimizer import build_optimizer, build_schedule

Params = Any  # an nnx.State of the model's parameters
TrainStep = Callable[[Params, optax.OptState, np.ndarray], tuple[Params, optax.OptState, dict[str, jax.Array]]]
EvalStep = Callable[[Params, np.ndarray], jax.Array]


def next_token_loss(graphdef: nnx.GraphDef, params: Params, batch: jax.Array) -> jax.Array:
    """Mean cross-entropy, in float32, of predicting `batch[:, 1:]` from `batch[:, :-1]`.

    Args:
        graphdef: the model's static structure, from `nnx.split`.
        params: the model's parameters.
        batch: token windows [batch, seq + 1] (int32).
    """
    model = nnx.merge(graphdef, params)
    logits = model(batch[:, :-1])  # [batch, seq, vocab]
    targets = batch[:, 1:]  # [batch, seq]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)  # [batch, seq]
    return losses.mean()


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation) -> TrainStep:
    """The pure update `(params, opt_state, batch) -> (params, opt_state, {"loss", "grad_norm"})`.

    `loss` is the loss before the update; `grad_norm` the gradient's global norm before clipping.
    """

    def train_step(params: Params, opt_state: optax.OptState, batch: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: next_token_loss(graphdef, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return train_step


def make_eval_step(graphdef: nnx.GraphDef) -> EvalStep:
    """The pure evaluation `(params, batch) -> loss`."""

    def eval_step(params: Params, batch: jax.Array) -> jax.Array:
        return next_token_loss(graphdef, params, batch)

    return eval_step


def resolve_model_config(config: ModelConfig, manifest: CacheManifest) -> ModelConfig:
    """`config` with `vocab_size` taken from the dataset's tokenizer when it is None.

    Raises:
        ConfigError: the configured vocabulary is smaller than the tokenizer's.
    """
    vocab = manifest.tokenizer.vocab_size
    if config.vocab_size is None:
        return config.model_copy(update={"vocab_size": vocab})
    if config.vocab_size < vocab:
        raise ConfigError(
            f"model.vocab_size: {config.vocab_size} is smaller than the dataset tokenizer's vocabulary "
            f"({vocab}, {manifest.tokenizer.name}); leave it null to take the tokenizer's size"
        )
    return config


@dataclass
class TrainSetup:
    """Everything a run needs, built by `setup_training`.

    `params` and `opt_state` are the initial state; `train_step` donates its inputs, so after the first
    step only the state it returns is valid.
    """

    config: TrainConfig
    model_config: ModelConfig
    parameters: int
    params: Params
    opt_state: optax.OptState
    schedule: optax.Schedule
    train_loader: PackedLoader
    eval_data: list[np.ndarray]
    train_step: TrainStep
    eval_step: EvalStep
    compile_s: float


def setup_training(config: TrainConfig) -> TrainSetup:
    """Open the dataset, build the model, optimizer and loaders, and compile the train and eval steps.

    Raises:
        NotFoundError: no token cache at `config.dataset`, or it lacks a `train` or `val` split.
        ConfigError: the model's vocabulary is smaller than the tokenizer's.
        InvalidInputError: a split is too short for one batch of `batch_size` x `seq_len`.
    """
    data = open_run_data(config)
    model_config = resolve_model_config(config.model, data.cache.manifest)
    train_loader = data.train
    eval_data = [data.val.batch(i) for i in range(config.eval_batches)]  # the same batches at every eval

    model = build_model(model_config, rngs=nnx.Rngs(config.seed))
    parameters = count_params(model)
    graphdef, params = nnx.split(model)
    optimizer = build_optimizer(config.optimizer, config.steps)
    opt_state = optimizer.init(params)

    start = time.perf_counter()
    batch = train_loader.batch(0)
    train_step = jax.jit(make_train_step(graphdef, optimizer), donate_argnums=(0, 1))
    train_step = train_step.lower(params, opt_state, batch).compile()
    eval_step = jax.jit(make_eval_step(graphdef)).lower(params, eval_data[0]).compile()
    compile_s = time.perf_counter() - start

    return TrainSetup(
        config=config,
        model_config=model_config,
        parameters=parameters,
        params=params,
        opt_state=opt_state,
        schedule=build_schedule(config.optimizer, config.steps),
        train_loader=train_loader,
        eval_data=eval_data,
        train_step=train_step,
        eval_step=eval_step,
        compile_s=compile_s,
    )


def evaluate(setup: TrainSetup, params: Params) -> float:
    """Mean loss of `params` over the fixed val batches (waits for the result)."""
    total = sum(setup.eval_step(params, batch) for batch in setup.eval_data)
    return float(total) / len(setup.eval_data)
