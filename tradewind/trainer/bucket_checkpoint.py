"""Checkpoints in a bucket orbax cannot write to (`s3://`): made in the process's own folder, then copied up whole.

orbax-checkpoint (0.12.8) builds tensorstore specs for `gs://` and local paths only, and a multi-process save
assumes one folder every process sees. For any other bucket, a checkpoint is therefore made in two moves:

1. process 0 copies the state on its device (an array spread over processes is first gathered to every host, a
   collective), so that the next update, which may donate the arrays, cannot change it;
2. a thread of process 0 saves that copy with orbax into its own folder, as a checkpoint of one process, then
   copies the step's folder to `<url>/<step>/`, marker last (`core.buckets.upload_folder`), and deletes from the
   bucket the steps orbax no longer keeps. Training goes on meanwhile; the next save and `close` wait for it.

A step counts once its marker is in the bucket. To restore, each process downloads the step into its own folder,
reads it there, and places each array as `like` says.

Process 0 holds a second copy of the state meanwhile, and a state spread over processes is gathered to every host:
right for the models a CPU or GPU run trains from S3, not for a model sharded because it fits no host; that
belongs on `gs://`, which orbax writes shard by shard.

Example:
    checkpointer = BucketCopyCheckpointer("s3://bucket/runs/r1/checkpoints", config.checkpoints)
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import threading
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from tradewind.cluster.jobs import local_dir
from tradewind.core.buckets import MARKER, download_folder, join_url, remote_fs, upload_folder
from tradewind.runs.config import CheckpointConfig
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.state import TrainState


class BucketCopyCheckpointer(Checkpointer):
    """A run's checkpoints under bucket prefix `url`, made and read through this process's own folder."""

    def __init__(self, url: str, policy: CheckpointConfig | None = None, *, read_only: bool = False):
        self.url = url.rstrip("/")
        local = local_dir() / "checkpoints" / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        local.mkdir(parents=True, exist_ok=True)
        me = jax.process_index()
        self.alone = ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"process{me}"
        )
        super().__init__(local, policy, read_only=read_only)
        self.copying: threading.Thread | None = None
        self.copy_error: BaseException | None = None
        # A step saved here but killed before its copy finished is not a checkpoint: the next save may redo it.
        copied = set(self.steps())
        for step in self.manager.all_steps():
            if step not in copied:
                shutil.rmtree(self.directory / str(step))
        self.manager.reload()

    def _options(self, read_only: bool) -> ocp.CheckpointManagerOptions:
        # Each process keeps its own folder, so orbax must neither create it nor wait for the others in it; and
        # `save` runs orbax in a thread of its own, so orbax need not start another.
        options = super()._options(read_only)
        return dataclasses.replace(
            options, create=False, multiprocessing_options=self.alone, enable_async_checkpointing=False
        )

    def save(self, state: TrainState) -> None:
        """Gather `state` (every process), save it (process 0), and copy it to the bucket behind training."""
        writer = jax.process_index() == 0
        snapshot = _copy_on_device(jax.tree.map(lambda leaf: _held(leaf, writer), state.to_checkpoint()))
        self.last_save_time = time.monotonic()
        if not writer:
            return
        self._finish_copy()
        self.copying = threading.Thread(
            target=self._save_and_copy, args=(state.step, snapshot), name="checkpoint save", daemon=True
        )
        self.copying.start()

    def steps(self) -> list[int]:
        """Steps whose copy in the bucket is complete, oldest first."""
        fs, path = remote_fs(self.url)
        fs.invalidate_cache(path)
        try:
            found = fs.glob(f"{path}/*/{MARKER}")
        except FileNotFoundError:
            return []
        return sorted(int(name.split("/")[-2]) for name in found if name.split("/")[-2].isdigit())

    def _restore_step(self, step: int, like: dict[str, Any]) -> dict[str, Any]:
        folder = self.directory / str(step)
        if not folder.is_dir():
            download_folder(join_url(self.url, str(step)), folder)
            self.manager.reload()
        abstract = jax.tree.map(_host_like, like)
        saved = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        return jax.tree.map(_place, saved, like)

    def wait(self) -> None:
        super().wait()
        self._finish_copy()

    def close(self) -> None:
        self._finish_copy()
        super().close()

    def _save_and_copy(self, step: int, snapshot: dict[str, Any]) -> None:
        try:
            host = jax.tree.map(lambda leaf: np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf, snapshot)
            self.manager.save(step, args=ocp.args.StandardSave(host), force=True)
            upload_folder(self.directory / str(step), join_url(self.url, str(step)))
            kept = set(self.manager.all_steps())
            fs, path = remote_fs(self.url)
            for old in self.steps():
                if old not in kept:
                    fs.rm_file(f"{path}/{old}/{MARKER}")  # first: a step without its marker is never read
                    fs.rm(f"{path}/{old}", recursive=True)
                    shutil.rmtree(self.directory / str(old), ignore_errors=True)
        except BaseException as error:  # raised in the training thread by the next save or close
            self.copy_error = error

    def _finish_copy(self) -> None:
        if self.copying is not None:
            self.copying.join()
            self.copying = None
        if self.copy_error is not None:
            error, self.copy_error = self.copy_error, None
            raise error


def _held(value: Any, writer: bool) -> Any:
    """For the `writer`, a leaf as this process holds it whole: an array on its devices, or one spread over
    processes gathered to every host (a collective, which every process joins; the others keep nothing)."""
    if not isinstance(value, jax.Array):
        return value
    if (value.is_fully_replicated or value.is_fully_addressable) and not writer:
        return None
    if value.is_fully_replicated:
        return value.addressable_data(0)
    if value.is_fully_addressable:
        return value
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _copy_on_device(tree: Any) -> Any:
    """`tree` with each device array copied, so that the next update (which may donate the originals' buffers)
    cannot change it; one `device_put` for all of them takes a third of the time of a copy per array."""
    leaves, treedef = jax.tree.flatten(tree)
    on_device = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    for i, copy in zip(on_device, jax.device_put([leaves[i] for i in on_device], may_alias=False), strict=True):
        leaves[i] = copy
    return treedef.unflatten(leaves)


def _host_like(value: Any) -> Any:
    """What orbax restores an array leaf of `like` into: a host array of its shape and dtype."""
    if isinstance(value, jax.Array | jax.ShapeDtypeStruct | np.ndarray):
        return np.empty(value.shape, value.dtype)
    return value


def _place(saved: Any, like: Any) -> Any:
    """A restored host value placed as `like` is (its sharding over this run's devices), or as it is."""
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return saved
    return jax.make_array_from_callback(saved.shape, sharding, lambda index: saved[index])
