"""Saving and restoring a run's training state with orbax, in the background, by policy: `Checkpointer`, for a
folder or a bucket orbax writes itself (`gs://`); `bucket_checkpoint.BucketCopyCheckpointer` extends it for the
others, and `checkpoint.open_checkpointer` picks between them.

A checkpoint holds one `TrainState` (its layout is `TrainState.to_checkpoint`) under
`<run>/checkpoints/<step>/`, so a restored run continues exactly where the saved one was.

Semantics:
- Saves are asynchronous (`CheckpointConfig.async_save`): `Checkpointer.save` copies the arrays off the
  device and returns; a background thread writes them. Orbax writes into a temporary folder and renames
  it when complete, so a checkpoint still being written (or cut off by a crash) is never listed, and
  hence never restored; leftovers are cleaned up when the folder is next opened.
- Policies: every `every_steps` steps, and/or when `every_minutes` of wall-clock time passed since the
  last save, and always at the last step. `keep_last` newest are kept, plus every step divisible by
  `keep_every` for good.
- Restore takes the newest checkpoint that reads back; one that does not (corrupt or partial files) is
  reported with a warning on stderr and in the run log, and the one before it is tried.

Example:
    checkpointer = Checkpointer(layout.checkpoints, config.checkpoints)
    if checkpointer.should_save(state.step, final=state.step == config.steps):
        checkpointer.save(state)
    checkpointer.close()  # waits for the last write
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from tradewind.core import NotFoundError
from tradewind.core.buckets import is_remote, remote_fs
from tradewind.runs.config import CheckpointConfig
from tradewind.trainer.state import TrainState


class Checkpointer:
    """Writes and reads one run's checkpoints under `directory` as `policy` says.

    `read_only` opens another run's checkpoints (to sample, export or continue from them) without
    touching its folder: no creating, no cleaning up of the temporary folders of a save in progress.
    """

    def __init__(self, directory: str | Path, policy: CheckpointConfig | None = None, *, read_only: bool = False):
        if is_remote(directory):
            self.directory: str | Path = str(directory)
            fs, path = remote_fs(self.directory)
            fs.invalidate_cache(path)  # orbax lists through fsspec: see the bucket as it is now, not as listed before
        else:
            self.directory = Path(directory).absolute()
        self.policy = policy or CheckpointConfig()
        self.manager = ocp.CheckpointManager(self.directory, options=self._options(read_only))
        self.last_save_time = time.monotonic()
        self.warnings: list[str] = []

    def _options(self, read_only: bool) -> ocp.CheckpointManagerOptions:
        return ocp.CheckpointManagerOptions(
            max_to_keep=self.policy.keep_last,
            keep_period=self.policy.keep_every,
            enable_async_checkpointing=self.policy.async_save and not read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
        )

    def should_save(self, step: int, *, final: bool = False) -> bool:
        """Whether the policy saves after `step` updates (always on the final step)."""
        if final:
            return True
        if self.policy.every_steps and step % self.policy.every_steps == 0:
            return True
        minutes = self.policy.every_minutes
        return bool(minutes) and time.monotonic() - self.last_save_time >= 60 * minutes

    def save(self, state: TrainState) -> None:
        """Start writing `state` as checkpoint `state.step`; returns once the arrays are safe to donate."""
        self.manager.save(state.step, args=ocp.args.StandardSave(state.to_checkpoint()), force=True)
        self.last_save_time = time.monotonic()

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return sorted(self.manager.all_steps())

    def restore(self, like: TrainState, step: int | None = None) -> TrainState:
        """Read checkpoint `step` (default: the newest that reads back) into the structure of `like`.

        `like`'s params and optimizer state hold arrays or `jax.ShapeDtypeStruct`s (with shardings, to restore
        onto a mesh).

        Raises:
            NotFoundError: no checkpoint, not that step, or none of them reads back.
        """
        steps = self.steps()
        if not steps:
            raise NotFoundError(f"no checkpoints in {self.directory}")
        if step is not None and step not in steps:
            raise NotFoundError(f"no checkpoint for step {step} in {self.directory}; saved steps: {steps}")
        for candidate in [step] if step is not None else reversed(steps):
            try:
                return TrainState.from_checkpoint(self._restore_step(candidate, like.to_checkpoint()))
            except Exception as error:  # orbax raises many kinds for damaged files
                if step is not None:
                    raise
                message = (
                    f"warning: checkpoint {candidate} in {self.directory} could not be read "
                    f"({type(error).__name__}: {str(error)[:200]}); trying the previous one"
                )
                self.warnings.append(message)
                print(message, file=sys.stderr, flush=True)
                print(message, flush=True)
        raise NotFoundError(f"none of the checkpoints {steps} in {self.directory} could be read")

    def _restore_step(self, step: int, like: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint `step`'s pytree, its arrays placed as those of `like` (a `TrainState.to_checkpoint()`)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def wait(self) -> None:
        """Block until pending writes are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending writes and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
