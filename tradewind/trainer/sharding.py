"""The device mesh and where every array lives on it: parameters, optimizer state and batches.

The mesh has three axes, `("data", "fsdp", "tensor")`. Batches split their rows over `data` x `fsdp`.
Each matrix (any array of two or more dimensions) splits its first dimension over `fsdp` and its last over
`tensor` when those sizes divide them, and is replicated along a dimension otherwise; vectors and scalars
are replicated. The rule looks only at shapes, so an Adam moment lands exactly where its parameter does.

Example:
    mesh = build_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    params = place(params, param_shardings(mesh, params))
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tradewind.core import ConfigError
from tradewind.trainer.config import MeshConfig, TrainConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


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
    """The partition spec of an array of `shape` under the module's rule."""
    if len(shape) < 2:
        return P()
    dims: list[Any] = [None] * len(shape)
    if shape[0] % mesh.shape["fsdp"] == 0 and mesh.shape["fsdp"] > 1:
        dims[0] = "fsdp"
    if shape[-1] % mesh.shape["tensor"] == 0 and mesh.shape["tensor"] > 1:
        dims[-1] = "tensor"
    return P(*dims)


def param_shardings(mesh: Mesh, tree: Any) -> Any:
    """A `NamedSharding` for every leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s)."""
    return jax.tree.map(lambda x: NamedSharding(mesh, spec_for(tuple(x.shape), mesh)), tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches [batch, seq + 1]: rows split over `data` x `fsdp`."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def place(tree: Any, shardings: Any) -> Any:
    """Put host arrays (the same on every process) onto the mesh as global arrays."""

    def put(x: Any, sharding: NamedSharding) -> jax.Array:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)
