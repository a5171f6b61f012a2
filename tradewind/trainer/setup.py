"""`setup_training`: everything a run needs around the pure steps, built and compiled once.

Shared by `train`, `profile_training` and the benchmarks: it opens the token cache, builds the model (in the
precision policy's compute dtype), the optimizer and the loaders, places parameters and optimizer state on the
device mesh (`tradewind.trainer.sharding`), and compiles the train and eval steps ahead of time so that
compilation is timed on its own.

Example:
    setup = setup_training(config)
    rate = setup.plan.learning_rate(0)
    params, opt_state, metrics = setup.train_step(setup.state.params, setup.state.opt_state, batch, rate, setup.frozen)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tradewind.core import ConfigError
from tradewind.data import CacheManifest
from tradewind.runs.batches import Loader, open_run_data
from tradewind.runs.config import TrainConfig
from tradewind.runs.flops import block_logits, peak_flops
from tradewind.runs.hf import check_matches_hf
from tradewind.runs.models.base import Attention, AttentionChoice
from tradewind.runs.models.configs import ModelConfig
from tradewind.trainer.hf import load_hf_params
from tradewind.trainer.lora import add_adapters
from tradewind.trainer.models import build_model, count_params
from tradewind.trainer.models.layers import SPLASH_BLOCKS, stacked_params
from tradewind.trainer.optimizer import build_optimizer
from tradewind.trainer.plan import StepPlan
from tradewind.trainer.sharding import (
    batch_sharding,
    build_mesh,
    check_batch_split,
    on_device,
    optimizer_shardings,
    param_shardings,
    place,
)
from tradewind.trainer.startup import StartupClock
from tradewind.trainer.state import TrainState
from tradewind.trainer.step import EvalStep, Params, TrainStep, make_eval_step, make_train_step, weights_and_streams


def compute_dtype(choice: str, platform: str | None = None) -> Any:
    """The matmul dtype of the precision policy: 'auto' is bfloat16 on GPU/TPU and float32 on CPU.

    `platform` is where the run's devices are ('cpu', 'gpu', 'tpu'); None: this process's default backend.
    """
    if choice == "auto":
        return jnp.float32 if (platform or jax.default_backend()) == "cpu" else jnp.bfloat16
    return jnp.dtype(choice)


def attention_kernel(choice: AttentionChoice, dtype: Any, seq_len: int, platform: str | None = None) -> Attention:
    """The attention kernel of the run's training steps: 'auto' is `dot_product` where it is cuDNN's flash
    attention (a GPU, 16-bit compute `dtype`), splash on a TPU where `seq_len` is whole 128-token blocks, and
    the reference elsewhere. Splash off a TPU is Pallas's interpreter. `platform` as in `compute_dtype`.

    Raises:
        ConfigError: splash where the sequence is not whole 128-token blocks, or on a GPU (a TPU kernel).
    """
    platform = platform or jax.default_backend()
    whole_blocks = seq_len % SPLASH_BLOCKS[-1] == 0
    if choice == "auto":
        if platform == "gpu" and jnp.dtype(dtype).itemsize == 2:
            return "dot_product"
        return "splash" if platform == "tpu" and whole_blocks else "reference"
    if choice == "splash" and not whole_blocks:
        raise ConfigError(
            f"attention: splash attention tiles the sequence in blocks of {SPLASH_BLOCKS[-1]} tokens, and seq_len "
            f"{seq_len} is not a multiple of {SPLASH_BLOCKS[-1]}; change seq_len or use attention 'reference'"
        )
    if choice == "splash" and platform == "gpu":
        raise ConfigError("attention: splash is a TPU kernel; on a GPU use 'dot_product' (cuDNN's) or 'auto'")
    if choice == "splash" and platform != "tpu":
        return "splash_interpret"
    return choice


def build_run_model(
    config: TrainConfig,
    model_config: ModelConfig,
    platform: str | None = None,
    *,
    initial_params: dict[str, Any] | None = None,
    dtype: Any = None,
) -> nnx.Module:
    """The run's model, as its steps execute it: the precision policy's compute dtype (or `dtype`), the
    attention kernel and scanned or unrolled blocks for `platform` (as in `compute_dtype`), weights seeded by
    `config.seed` or taken from `initial_params` (a pure dict, e.g. `init_from`'s), and a LoRA run's adapters
    (`config.lora`, seeded by `config.seed` too, so that a rebuilt model has the run's initial adapters)."""
    dtype = dtype or compute_dtype(config.compute_dtype, platform)
    model = build_model(
        model_config,
        rngs=nnx.Rngs(config.seed),
        dtype=dtype,
        attention=attention_kernel(config.attention, dtype, config.seq_len, platform),
        scan_layers=config.scan_layers,
    )
    if initial_params is not None:
        nnx.update(model, replace_params(nnx.state(model), initial_params))
    if config.lora is not None:
        add_adapters(model, config.lora, nnx.Rngs(config.seed))
    return model


def init_from_params(config: TrainConfig) -> dict[str, Any] | None:
    """The weights of the Hugging Face folder `config.init_from` as a pure dict, or None when it is unset.

    Raises:
        ConfigError: the folder's `config.json` describes another model than `config.model` (never train
            silently with other values), or a tensor is missing.
        NotFoundError: no `config.json` or weights.
    """
    if not config.init_from:
        return None
    check_matches_hf(config.model, Path(config.init_from))
    return load_hf_params(Path(config.init_from))[1]


# A LoRA run trains its adapters and carries their dropout streams; the rest of its model is frozen.
LORA_TRAINED = nnx.Any(nnx.LoRAParam, nnx.RngState)


def split_run_model(
    model: nnx.Module, config: TrainConfig, frozen_dtype: Any = jnp.bfloat16
) -> tuple[nnx.GraphDef, nnx.GraphDef, Params, Params]:
    """The run's model as its steps take it: `(graphdef, eval_graphdef, params, frozen)`.

    `params` is what the run trains and checkpoints: every weight, or a LoRA run's adapters (with their dropout
    streams). `frozen` is what it only reads: a LoRA run's base model, held in `frozen_dtype` (bfloat16 for
    training: it is only ever multiplied in the compute dtype); empty otherwise. `eval_graphdef` is `graphdef`
    with dropout off.
    """
    if config.lora is None:
        graphdef, params = nnx.split(model)
        return graphdef, graphdef, params, nnx.State({})
    graphdef, params, frozen = nnx.split(model, LORA_TRAINED, ...)
    deterministic = nnx.view(model, deterministic=True, raise_if_not_found=False)
    eval_graphdef = nnx.split(deterministic, LORA_TRAINED, ...)[0]
    return graphdef, eval_graphdef, params, jax.tree.map(lambda x: _cast(x, frozen_dtype), frozen)


def _cast(x: Any, dtype: Any) -> Any:
    """`x` (an array, or an abstract one: a TPU compile's model is never materialised) in `dtype`."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
    return x.astype(dtype)


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
    if expected["blocks"].keys() == {"layer"}:  # a scanned model holds its blocks stacked
        pure = stacked_params(pure)
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

    `state` is the initial state, placed on `mesh`; `train_step` donates its params and optimizer state, so
    after the first step only the state it returns is valid. Pass batches through `put_batch`, and the
    learning rate of the update from `plan` (the run's step count and schedule).
    """

    config: TrainConfig
    model_config: ModelConfig
    parameters: int
    trainable_parameters: int
    state: TrainState
    frozen: Params
    plan: StepPlan
    train_loader: Loader
    eval_data: list[Any]
    train_step: TrainStep
    eval_step: EvalStep
    compile_s: float
    mesh: Mesh
    graphdef: nnx.GraphDef  # what the train step merges
    eval_graphdef: nnx.GraphDef  # what the eval step merges: dropout off
    flops_per_token: float
    peak_flops: float
    peak_flops_source: str
    val_bytes_per_token: float | None
    put_batch: Callable[[Any], Any]


def setup_training(
    config: TrainConfig, initial_params: Params | None = None, clock: StartupClock | None = None
) -> TrainSetup:
    """Open the dataset, build the model, optimizer and loaders, and compile the train and eval steps.

    Args:
        config: the run.
        initial_params: host parameters to start from instead of a fresh initialisation (same structure).
        clock: marks the stages "data", "model" and "compile" as they end.

    Raises:
        NotFoundError: no token cache at `config.dataset`, or it lacks a `train` or `val` split.
        ConfigError: the model's vocabulary is smaller than the tokenizer's, or the mesh does not fit.
        InvalidInputError: a split is too short for one batch of `batch_size` x `seq_len`.
    """
    clock = clock or StartupClock()
    data = open_run_data(config)
    config = config.with_vocabulary(data.cache.manifest.tokenizer.vocab_size)
    model_config = resolve_model_config(config.model, data.cache.manifest)
    mesh = build_mesh(config.mesh)
    check_batch_split(config, mesh)
    clock.mark("data")

    model = build_run_model(config, model_config, initial_params=initial_params)
    parameters = count_params(model)
    graphdef, eval_graphdef, params, frozen = split_run_model(model, config)
    del model  # placing copies its arrays on a mesh of several devices: the originals go once nothing holds them
    params = place(params, param_shardings(mesh, params))
    frozen = place(frozen, param_shardings(mesh, frozen))
    optimizer = build_optimizer(config.optimizer)
    weights, _ = weights_and_streams(params)
    opt_state = jax.eval_shape(optimizer.init, weights)
    opt_sharding = optimizer_shardings(mesh, opt_state, config.optimizer.host_state)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_sharding)(weights)

    rows_sharding = batch_sharding(mesh)

    def put_batch(batch: Any) -> Any:
        """A host batch (an array, or a `DocumentBatch` of arrays) on the mesh, rows split over its batch axes."""
        if jax.process_count() == 1:
            return jax.device_put(batch, rows_sharding)
        # Every process holds the same global batch; each hands over only its own devices' rows.
        return jax.tree.map(
            lambda rows: jax.make_array_from_callback(rows.shape, rows_sharding, lambda index: rows[index]), batch
        )

    eval_data = [put_batch(data.val.batch(i)) for i in range(config.eval_batches)]  # same batches every eval
    clock.mark("model")
    train_lowered, eval_lowered = lower_steps(
        config, (graphdef, eval_graphdef), optimizer, mesh, params, opt_state, eval_data[0], frozen
    )
    train_step, eval_step = compile_steps(train_lowered, eval_lowered, mesh)
    clock.mark("compile")

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
        trainable_parameters=sum(leaf.size for leaf in jax.tree.leaves(weights)),
        state=TrainState.start(params, opt_state, config.seed),
        frozen=frozen,
        plan=StepPlan.of(config),
        train_loader=data.train,
        eval_data=eval_data,
        train_step=train_step,
        eval_step=eval_step,
        compile_s=clock.stages["compile"],
        mesh=mesh,
        graphdef=graphdef,
        eval_graphdef=eval_graphdef,
        flops_per_token=config.flops_per_token(model_config.vocab_size),
        peak_flops=peak,
        peak_flops_source=source,
        val_bytes_per_token=(val.bytes / val.tokens) if val is not None and val.bytes and val.tokens else None,
        put_batch=put_batch,
    )


def lower_steps(
    config: TrainConfig,
    graphdefs: tuple[nnx.GraphDef, nnx.GraphDef],
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    params: Params,
    opt_state: optax.OptState,
    batch: Any,
    frozen: Params,
) -> tuple[Any, Any]:
    """`config`'s train and eval steps, lowered for `mesh` (`.compile()` each): `(params, opt_state, batch,
    learning_rate, frozen)` and `(params, batch, frozen)`.

    `graphdefs` are the train and eval steps' (`split_run_model`). `params`, `opt_state`, `batch` (one
    `[batch_size, seq_len + 1]` batch) and `frozen` may be arrays on the mesh or abstract ones
    (`jax.ShapeDtypeStruct`s with their shardings): `tradewind.trainer.compile` compiles the same steps for a
    TPU slice it does not hold. The train step donates its parameters and optimizer state. With
    `optimizer.host_state` the state stays in host memory between steps: the step brings it to the devices for the
    update, and its result goes back.
    """
    graphdef, eval_graphdef = graphdefs
    params_sharding = param_shardings(mesh, params)
    opt_sharding = optimizer_shardings(mesh, opt_state, config.optimizer.host_state)
    frozen_sharding = param_shardings(mesh, frozen)
    scalar = NamedSharding(mesh, PartitionSpec())
    logits_per_block = block_logits(mesh.devices.flat[0].platform)  # a TPU's also when compiling for one elsewhere
    step_fn = make_train_step(
        graphdef,
        optimizer,
        grad_accum=config.grad_accum,
        z_loss=config.z_loss,
        skip_nonfinite=config.on_nonfinite == "skip",
        remat=config.block_remat,
        logits_per_block=logits_per_block,
    )
    if config.optimizer.host_state:
        step_fn = _state_brought_to_devices(step_fn, on_device(opt_sharding))
    train_step = jax.jit(
        step_fn,
        in_shardings=(params_sharding, opt_sharding, batch_sharding(mesh), scalar, frozen_sharding),
        out_shardings=(params_sharding, opt_sharding, None),
        donate_argnums=(0, 1),
    )
    learning_rate = jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar)
    eval_step = jax.jit(make_eval_step(eval_graphdef, logits_per_block))
    with jax.set_mesh(mesh):  # the model pins its activations' batch split on this mesh (`layers.batch_sharded`)
        train_lowered = train_step.lower(params, opt_state, batch, learning_rate, frozen)
        eval_lowered = eval_step.lower(params, batch, frozen)
    return train_lowered, eval_lowered


def _state_brought_to_devices(step: TrainStep, shardings: Any) -> TrainStep:
    """`step`, with its optimizer state moved from host memory to `shardings` (on the devices) first."""

    def step_with_state_on_devices(params: Params, opt_state: optax.OptState, *rest: Any) -> Any:
        return step(params, jax.device_put(opt_state, shardings), *rest)

    return step_with_state_on_devices


# The steps this process compiled last, by what they compute: a process that trains the same config again (the
# warm process, `tradewind.cluster.warm`) runs them instead of loading them from the compile cache, which took 7 s
# for a 125M train step on a TPU v5e. Only the last run's: each program keeps its executable in the devices' memory.
_LAST_COMPILED: dict[str, tuple[Any, Any]] = {}


def compile_steps(train_lowered: Any, eval_lowered: Any, mesh: Mesh) -> tuple[Any, Any]:
    """The train and eval steps compiled, or as this process compiled the same two for the same devices last."""
    programs = [f"{lowered.as_text()}{lowered.in_tree}{lowered.out_tree}" for lowered in (train_lowered, eval_lowered)]
    key = hashlib.sha256(f"{programs}{mesh.device_ids.tolist()}".encode()).hexdigest()
    if key not in _LAST_COMPILED:
        _LAST_COMPILED.clear()  # first let go of the programs of another run
        _LAST_COMPILED[key] = (train_lowered.compile(), eval_lowered.compile())
    return _LAST_COMPILED[key]


def evaluate(setup: TrainSetup, params: Params) -> float:
    """Mean loss of `params` over the fixed val batches (waits for the result)."""
    losses = [setup.eval_step(params, batch, setup.frozen) for batch in setup.eval_data]
    host = [np.asarray(x if x.is_fully_addressable else x.addressable_data(0)) for x in losses]
    return float(sum(host)) / len(host)
