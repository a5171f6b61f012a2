"""The pure train and eval steps, and `setup_training`, which builds everything a run needs around them.

The model is split once into a static `graphdef` and a pytree of parameters; the steps are plain
functions of pytrees that merge the graphdef back inside the loss, so `jax.jit` traces them once and no
nnx graph is walked per step. Parameters and optimizer state are donated and placed on the device mesh
(`tradewind.trainer.sharding`). `setup_training` is shared by `train`, `profile_training` and the
benchmarks: it opens the token cache, builds model, optimizer and loaders, and compiles both steps ahead
of time so that compilation is timed on its own.

One update, inside `jax.jit`:
    batch [B, S+1] -> `grad_accum` microbatches -> summed loss and gradients (lax.scan) -> mean
    -> optimizer update -> (skip it if the loss is not finite and `on_nonfinite="skip"`)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from tradewind.core import ConfigError
from tradewind.data import CacheManifest, PackedLoader
from tradewind.trainer.batches import open_run_data
from tradewind.trainer.config import ModelConfig, TrainConfig
from tradewind.trainer.flops import flops_per_token, peak_flops
from tradewind.trainer.model import build_model, count_params
from tradewind.trainer.optimizer import build_optimizer, build_schedule
from tradewind.trainer.sharding import batch_sharding, build_mesh, param_shardings, place

Params = Any  # an nnx.State of the model's parameters
TrainStep = Callable[[Params, optax.OptState, Any], tuple[Params, optax.OptState, dict[str, jax.Array]]]
EvalStep = Callable[[Params, Any], jax.Array]


def compute_dtype(choice: str) -> Any:
    """The matmul dtype of the precision policy: 'auto' is bfloat16 on GPU/TPU and float32 on CPU."""
    if choice == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(choice)


def next_token_loss(
    graphdef: nnx.GraphDef, params: Params, batch: jax.Array, z_loss: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Mean loss of predicting `batch[:, 1:]` from `batch[:, :-1]`: `(objective, cross-entropy)`, float32.

    The objective adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1.

    Args:
        graphdef: the model's static structure, from `nnx.split`.
        params: the model's parameters.
        batch: token windows [batch, seq + 1] (int32).
        z_loss: weight of the z-loss term (0 leaves it out of the graph).
    """
    model = nnx.merge(graphdef, params)
    logits = model(batch[:, :-1]).astype(jnp.float32)  # [batch, seq, vocab]
    targets = batch[:, 1:]  # [batch, seq]
    cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    if not z_loss:
        return cross_entropy, cross_entropy
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [batch, seq]
    return cross_entropy + z_loss * jnp.mean(jnp.square(log_z)), cross_entropy


def loss_and_grads(
    graphdef: nnx.GraphDef, params: Params, batch: jax.Array, grad_accum: int, z_loss: float
) -> tuple[jax.Array, Params]:
    """Cross-entropy and gradient of the objective, averaged over `grad_accum` equal microbatches."""

    def one(microbatch: jax.Array) -> tuple[jax.Array, Params]:
        (_, cross_entropy), grads = jax.value_and_grad(
            lambda p: next_token_loss(graphdef, p, microbatch, z_loss), has_aux=True
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
) -> TrainStep:
    """The pure update `(params, opt_state, batch) -> (params, opt_state, metrics)`.

    `metrics` holds `loss` (cross-entropy before the update), `grad_norm` (before clipping),
    `param_norm` (after the update) and `skipped` (1.0 when a non-finite update was dropped).
    """

    def train_step(params: Params, opt_state: optax.OptState, batch: jax.Array):
        loss, grads = loss_and_grads(graphdef, params, batch, grad_accum, z_loss)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
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


def replace_params(params: Params, pure: dict[str, Any]) -> Params:
    """`params` with every value taken from the pure dict `pure` (e.g. imported weights).

    Raises:
        ConfigError: `pure` lacks a parameter or has one of another shape (the model config differs).
    """
    expected = nnx.to_pure_dict(params)
    flat_expected = dict(jax.tree_util.tree_flatten_with_path(expected)[0])
    flat_new = dict(jax.tree_util.tree_flatten_with_path(pure)[0])
    for path, value in flat_expected.items():
        name = jax.tree_util.keystr(path)
        if path not in flat_new:
            raise ConfigError(f"init_from: the weights have no parameter {name}")
        if tuple(flat_new[path].shape) != tuple(value.shape):
            raise ConfigError(
                f"init_from: parameter {name} has shape {tuple(flat_new[path].shape)}, the model expects "
                f"{tuple(value.shape)}; make `model` match the imported config"
            )
    nnx.replace_by_pure_dict(params, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), pure))
    return params


@dataclass
class TrainSetup:
    """Everything a run needs, built by `setup_training`.

    `params` and `opt_state` are the initial state, placed on `mesh`; `train_step` donates its inputs, so
    after the first step only the state it returns is valid. Pass batches through `put_batch`.
    """

    config: TrainConfig
    model_config: ModelConfig
    parameters: int
    params: Params
    opt_state: optax.OptState
    schedule: optax.Schedule
    train_loader: PackedLoader
    eval_data: list[Any]
    train_step: TrainStep
    eval_step: EvalStep
    compile_s: float
    mesh: Mesh
    graphdef: nnx.GraphDef
    flops_per_token: float
    peak_flops: float
    peak_flops_source: str
    val_bytes_per_token: float | None
    put_batch: Callable[[np.ndarray], Any]


def setup_training(config: TrainConfig, initial_params: Params | None = None) -> TrainSetup:
    """Open the dataset, build the model, optimizer and loaders, and compile the train and eval steps.

    Args:
        config: the run.
        initial_params: host parameters to start from instead of a fresh initialisation (same structure).

    Raises:
        NotFoundError: no token cache at `config.dataset`, or it lacks a `train` or `val` split.
        ConfigError: the model's vocabulary is smaller than the tokenizer's, or the mesh does not fit.
        InvalidInputError: a split is too short for one batch of `batch_size` x `seq_len`.
    """
    data = open_run_data(config)
    model_config = resolve_model_config(config.model, data.cache.manifest)
    mesh = build_mesh(config.mesh)
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    if (config.batch_size // config.grad_accum) % rows:
        raise ConfigError(
            f"batch_size / grad_accum = {config.batch_size // config.grad_accum} must be divisible by the "
            f"mesh's data * fsdp = {rows}"
        )

    model = build_model(model_config, rngs=nnx.Rngs(config.seed), dtype=compute_dtype(config.compute_dtype))
    parameters = count_params(model)
    graphdef, params = nnx.split(model)
    if initial_params is not None:
        params = replace_params(params, initial_params)
    params_sharding = param_shardings(mesh, params)
    params = place(params, params_sharding)
    optimizer = build_optimizer(config.optimizer, config.steps)
    opt_sharding = param_shardings(mesh, jax.eval_shape(optimizer.init, params))
    opt_state = jax.jit(optimizer.init, out_shardings=opt_sharding)(params)

    rows_sharding = batch_sharding(mesh)

    def put_batch(batch: np.ndarray) -> jax.Array:
        if jax.process_count() == 1:
            return jax.device_put(batch, rows_sharding)
        # Every process holds the same global batch; each hands over only its own devices' rows.
        return jax.make_array_from_callback(batch.shape, rows_sharding, lambda index: batch[index])

    eval_data = [put_batch(data.val.batch(i)) for i in range(config.eval_batches)]  # same batches every eval
    start = time.perf_counter()
    step_fn = make_train_step(
        graphdef,
        optimizer,
        grad_accum=config.grad_accum,
        z_loss=config.z_loss,
        skip_nonfinite=config.on_nonfinite == "skip",
    )
    train_step = jax.jit(
        step_fn,
        in_shardings=(params_sharding, opt_sharding, rows_sharding),
        out_shardings=(params_sharding, opt_sharding, None),
        donate_argnums=(0, 1),
    )
    train_step = train_step.lower(params, opt_state, put_batch(data.train.batch(0))).compile()
    eval_step = jax.jit(make_eval_step(graphdef)).lower(params, eval_data[0]).compile()
    compile_s = time.perf_counter() - start

    val = data.cache.manifest.splits.get("val")
    device = jax.devices()[0]
    peak, source = (
        (config.peak_flops, "config.peak_flops")
        if config.peak_flops
        else peak_flops(device.device_kind if device.platform != "cpu" else "cpu", os.cpu_count() or 1)
    )
    return TrainSetup(
        config=config,
        model_config=model_config,
        parameters=parameters,
        params=params,
        opt_state=opt_state,
        schedule=build_schedule(config.optimizer, config.steps),
        train_loader=data.train,
        eval_data=eval_data,
        train_step=train_step,
        eval_step=eval_step,
        compile_s=compile_s,
        mesh=mesh,
        graphdef=graphdef,
        flops_per_token=flops_per_token(model_config, config.seq_len),
        peak_flops=peak,
        peak_flops_source=source,
        val_bytes_per_token=(val.bytes / val.tokens) if val is not None and val.bytes and val.tokens else None,
        put_batch=put_batch,
    )


def evaluate(setup: TrainSetup, params: Params) -> float:
    """Mean loss of `params` over the fixed val batches (waits for the result)."""
    losses = [setup.eval_step(params, batch) for batch in setup.eval_data]
    host = [np.asarray(x if x.is_fully_addressable else x.addressable_data(0)) for x in losses]
    return float(sum(host)) / len(host)
