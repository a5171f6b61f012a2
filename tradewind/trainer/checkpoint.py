"""Saving and restoring a run's training state with orbax, in the background, by policy.

A checkpoint holds `{"params", "opt_state", "step", "data_step", "rng"}` under `<run>/checkpoints/<step>/`.
`data_step` is the loader's position (its whole state, see `PackedLoader`) and `rng` the run's key data,
so a restored run continues exactly where the saved one was.

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
    if checkpointer.should_save(step, final=step == config.steps):
        checkpointer.save(step, state)
    checkpointer.close()  # waits for the last write
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tradewind.core import NotFoundError
from tradewind.trainer.config import CheckpointConfig


class Checkpointer:
    """Writes and reads one run's checkpoints under `directory` as `policy` says.

    `read_only` opens another run's checkpoints (to sample, export or continue from them) without
    touching its folder: no creating, no cleaning up of the temporary folders of a save in progress.
    """

    def __init__(self, directory: Path, policy: CheckpointConfig | None = None, *, read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.policy = policy or CheckpointConfig()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.policy.keep_last,
            keep_period=self.policy.keep_every,
            enable_async_checkpointing=self.policy.async_save and not read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.last_save_time = time.monotonic()
        self.warnings: list[str] = []

    def should_save(self, step: int, *, final: bool = False) -> bool:
        """Whether the policy saves after `step` updates (always on the final step)."""
        if final:
            return True
        if self.policy.every_steps and step % self.policy.every_steps == 0:
            return True
        minutes = self.policy.every_minutes
        return bool(minutes) and time.monotonic() - self.last_save_time >= 60 * minutes

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Start writing `state` as checkpoint `step`; returns once the arrays are safe to donate."""
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.last_save_time = time.monotonic()

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return sorted(self.manager.all_steps())

    def restore(self, like: dict[str, Any], step: int | None = None) -> tuple[dict[str, Any], int]:
        """Read checkpoint `step` (default: the newest that reads back) into the structure of `like`.

        `like` holds arrays or `jax.ShapeDtypeStruct`s (with shardings, to restore onto a mesh).

        Raises:
            NotFoundError: no checkpoint, not that step, or none of them reads back.
        """
        steps = self.steps()
        if not steps:
            raise NotFoundError(f"no checkpoints in {self.directory}")
        if step is not None and step not in steps:
            raise NotFoundError(f"no checkpoint for step {step} in {self.directory}; saved steps: {steps}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        for candidate in [step] if step is not None else reversed(steps):
            try:
                return self.manager.restore(candidate, args=ocp.args.StandardRestore(abstract)), candidate
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

    def wait(self) -> None:
        """Block until pending writes are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending writes and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()


def save_checkpoint(
    directory: Path, step: int, params: Any, opt_state: Any, *, data_step: int | None = None, rng: Any = None
) -> Path:
    """Write params, optimizer state and step to `directory/<step>/` and wait until it is on disk.

    `data_step` defaults to `step`; `rng` (uint32 key data [2]) to the key of seed 0.

    Returns:
        The step's folder.
    """
    checkpointer = Checkpointer(directory, CheckpointConfig(async_save=False, keep_last=1_000_000))
    state = {
        "params": params,
        "opt_state": opt_state,
        "step": step,
        "data_step": step if data_step is None else data_step,
        "rng": np.zeros(2, np.uint32) if rng is None else np.asarray(rng, np.uint32),
    }
    checkpointer.save(step, state)
    checkpointer.close()
    return checkpointer.directory / str(step)


def read_checkpoint(directory: Path, like: dict[str, Any], step: int | None = None) -> tuple[dict[str, Any], int]:
    """Read checkpoint `step` (default: the newest that reads back) of the run whose checkpoints are in
    `directory`, read-only, into the structure of `like`; returns `(state, step)`.

    Raises:
        NotFoundError: the folder does not exist, has no checkpoint, not that step, or none reads back.
    """
    directory = Path(directory).absolute()
    if not directory.is_dir():
        raise NotFoundError(f"no checkpoints in {directory}: the folder does not exist")
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        return checkpointer.restore(like, step)
    finally:
        checkpointer.close()


def restore_checkpoint(directory: Path, params: Any, opt_state: Any, step: int | None = None) -> tuple[Any, Any, int]:
    """Read a checkpoint back into the structure of `params` and `opt_state`.

    Args:
        directory: the folder `save_checkpoint` or the training loop wrote into.
        params: parameters (arrays or `jax.ShapeDtypeStruct`s) of the same structure as the saved ones.
        opt_state: likewise, the optimizer state.
        step: the step to restore; the newest readable one if None.

    Returns:
        `(params, opt_state, step)` as saved.

    Raises:
        NotFoundError: no checkpoint (or not that step) in `directory`.
    """
    like = {"params": params, "opt_state": opt_state, "step": 0, "data_step": 0, "rng": np.zeros(2, np.uint32)}
    state, _ = read_checkpoint(directory, like, step)
    return state["params"], state["opt_state"], int(state["step"])
