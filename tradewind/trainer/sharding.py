"""The device mesh and where every array lives on it: parameters, optimizer state and batches.

The mesh has three axes, `("data", "fsdp", "tensor")`. Batches split their rows over `data` x `fsdp`.

Each weight names its logical axes by the module that holds it (`WEIGHT_AXES`), and `RULES` maps them to mesh
axes, Megatron's way: the width of the residual stream (`embed`) splits over `fsdp`; the attention heads and
the MLP's hidden units over `tensor`, so a block's first matmuls (q, k, v; gate and up) split their outputs
(column-parallel) and the matmuls after them (o; down) their inputs (row-parallel), and each half of a block
needs one all-reduce over `tensor`; the vocabulary splits over `tensor` (and then `fsdp`) in the embedding
and the head. A dimension its mesh axes do not divide stays whole. Arrays of no known module (norm scales
are vectors) follow the shape rule `spec_for`. An optimizer's moments sit under the same module names, so
each lands where its parameter does. The model pins its residual stream to the batch split
(`models.layers.batch_sharded`).

Example:
    mesh = build_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    params = place(params, param_shardings(mesh, params))
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tradewind.core import ConfigError
from tradewind.runs.config import MeshConfig, TrainConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# The logical axes of each weight, by the module that holds it: kernels are [in, out], embeddings [rows, width];
# None: that dimension stays whole.
WEIGHT_AXES = {
    **dict.fromkeys(("q_proj", "k_proj", "v_proj", "qkv"), ("embed", "heads")),
    **dict.fromkeys(("o_proj", "proj"), ("heads", "embed")),
    **dict.fromkeys(("gate_proj", "up_proj", "fc"), ("embed", "mlp")),
    **dict.fromkeys(("down_proj", "fc_out"), ("mlp", "embed")),
    **dict.fromkeys(("embed", "wte"), ("vocab", "embed")),
    "wpe": ("position", "embed"),
    # The width stays whole: the fused cross-entropy loops over blocks of rows, and a head split by width was
    # gathered whole in every iteration (10 s of network per step for a 2-layer 1B-wide model on a v5p-8).
    "lm_head": (None, "vocab"),
}
# The mesh axes each logical axis splits over, in order; an axis an earlier dimension took is skipped, and the
# others (position) stay whole. The vocabulary takes fsdp too, so an embedding is split by rows over both.
RULES = {"embed": ("fsdp",), "heads": ("tensor",), "mlp": ("tensor",), "vocab": ("tensor", "fsdp")}


def build_mesh(config: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """A `(data, fsdp, tensor)` mesh over `devices` (all of them, across processes, by default). Over several
    TPU slices it is a hybrid mesh whose data axis spans the slices.

    Raises:
        ConfigError: the axis sizes do not multiply to the number of devices, or fsdp x tensor spans slices.
    """
    devices = jax.devices() if devices is None else devices
    count = len(devices)
    data = config.data
    if data == -1:
        if count % (config.fsdp * config.tensor):
            raise ConfigError(f"mesh: fsdp * tensor = {config.fsdp * config.tensor} does not divide {count} devices")
        data = count // (config.fsdp * config.tensor)
    if data * config.fsdp * config.tensor != count:
        raise ConfigError(
            f"mesh: data * fsdp * tensor = {data} * {config.fsdp} * {config.tensor} must equal the {count} devices"
        )
    slices = len({getattr(device, "slice_index", 0) for device in devices})
    if slices == 1:
        return Mesh(np.array(devices).reshape(data, config.fsdp, config.tensor), AXES)
    # Several TPU slices talk over the data-centre network (DCN), far slower than a slice's own links (ICI):
    # only the data axis may span slices, so fsdp's gathers and tensor's reductions stay inside one.
    if data % slices:
        raise ConfigError(
            f"mesh: data = {data} must be a multiple of the {slices} slices: only the data axis may span slices "
            f"(fsdp * tensor = {config.fsdp * config.tensor} devices must fit in one slice)"
        )
    ici, dcn = (data // slices, config.fsdp, config.tensor), (slices, 1, 1)
    return Mesh(mesh_utils.create_hybrid_device_mesh(ici, dcn, devices), AXES)


def check_batch_split(config: TrainConfig, mesh: Mesh) -> None:
    """Refuse a microbatch whose rows do not split evenly over the mesh's `data` x `fsdp` devices.

    Raises:
        ConfigError: naming the microbatch and the devices.
    """
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    if (config.batch_size // config.grad_accum) % rows:
        raise ConfigError(
            f"batch_size / grad_accum = {config.batch_size // config.grad_accum} must be divisible by the mesh's "
            f"data * fsdp = {rows} ({mesh.devices.size} devices)"
        )


def spec_for(shape: tuple[int, ...], mesh: Mesh) -> P:
    """The shape rule, for arrays of no known module: a matrix (two or more dimensions) splits its first
    dimension over `fsdp` and its last over `tensor` where the sizes divide; vectors and scalars stay whole."""
    if len(shape) < 2:
        return P()
    dims: list[Any] = [None] * len(shape)
    if shape[0] % mesh.shape["fsdp"] == 0 and mesh.shape["fsdp"] > 1:
        dims[0] = "fsdp"
    if shape[-1] % mesh.shape["tensor"] == 0 and mesh.shape["tensor"] > 1:
        dims[-1] = "tensor"
    return P(*dims)


def weight_spec(names: list[str], shape: tuple[int, ...], mesh: Mesh) -> P:
    """The partition spec of the array at a tree path of `names` (`[..., module, variable]`): by its module's
    logical axes (`WEIGHT_AXES`, `RULES`), else by `spec_for`. A weight of stacked blocks (`blocks.layer...`,
    `models.layers.StackedBlocks`) keeps its leading layer axis whole and splits the rest as one layer's. A LoRA
    run's projection holds its weights under `base` (`trainer.lora.LoRALinear`): they split as the projection's."""
    if "base" in names:
        return weight_spec([name for name in names if name != "base"], shape, mesh)
    if "layer" in names and "blocks" in names:
        return P(None, *weight_spec([name for name in names if name != "layer"], shape[1:], mesh))
    variable = next((i for i in range(len(names) - 1, 0, -1) if names[i] in ("kernel", "embedding", "bias")), None)
    axes = WEIGHT_AXES.get(names[variable - 1]) if variable is not None else None
    if axes is None:
        return spec_for(shape, mesh)
    if names[variable] == "bias":
        axes = axes[-1:]
    if len(axes) != len(shape):  # a factored moment (Adafactor's row or column statistics)
        return P()
    dims: list[Any] = []
    taken: set[str] = set()
    for axis, size in zip(axes, shape, strict=True):
        split = tuple(a for a in RULES.get(axis, ()) if a not in taken and mesh.shape[a] > 1)
        while split and size % math.prod(mesh.shape[a] for a in split):
            split = split[:-1]  # the last mesh axes that do not divide the size go
        taken.update(split)
        dims.append(split[0] if len(split) == 1 else (split or None))
    return P(*dims)


def param_shardings(mesh: Mesh, tree: Any) -> Any:
    """A `NamedSharding` for every leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s), by `weight_spec`."""

    def sharding(path: tuple, x: Any) -> NamedSharding:
        names = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", "")))) for key in path]
        return NamedSharding(mesh, weight_spec(names, tuple(x.shape), mesh))

    return jax.tree_util.tree_map_with_path(sharding, tree)


def optimizer_shardings(mesh: Mesh, opt_state: Any, in_host: bool) -> Any:
    """Where the optimizer state lives: as its parameters (`param_shardings`), in the hosts' pinned memory with
    `in_host` (`OptimizerConfig.host_state`)."""
    shardings = param_shardings(mesh, opt_state)
    return jax.tree.map(lambda sharding: sharding.with_memory_kind("pinned_host"), shardings) if in_host else shardings


def on_device(shardings: Any) -> Any:
    """`shardings` in the devices' own memory."""
    return jax.tree.map(lambda sharding: sharding.with_memory_kind("device"), shardings)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches [batch, seq + 1]: rows split over `data` x `fsdp`."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def place(tree: Any, shardings: Any) -> Any:
    """Put arrays (the same on every process) onto the mesh as global arrays. In one process they move there
    directly: a round trip through the host would leave two copies on the device until the first is freed, which a
    1B model on a 16 GiB chip cannot afford."""

    def put(x: Any, sharding: NamedSharding) -> jax.Array:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # a dropout stream's key: placed as its key data
            return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)
