"""Saving and restoring a run's training state with orbax.

A checkpoint holds `{"params", "opt_state", "step"}` under `<run>/checkpoints/<step>/`, written by an
`ocp.CheckpointManager`, which finishes a step folder before it is listed, so a crash mid-save leaves no
half checkpoint behind. Since the loader's position is a function of the step alone, these three are
the whole state a resumed run needs.

Example:
    save_checkpoint(layout.checkpoints, step, params, opt_state)
    params, opt_state, step = restore_checkpoint(layout.checkpoints, like_params, like_opt_state)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from tradewind.core import NotFoundError


def save_checkpoint(directory: Path, step: int, params: Any, opt_state: Any) -> Path:
    """Write params, optimizer state and step to `directory/<step>/` and wait until it is on disk.

    Returns:
        The step's folder.
    """
    directory = Path(directory).absolute()
    state = {"params": params, "opt_state": opt_state, "step": step}
    with ocp.CheckpointManager(directory) as manager:
        manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
    return directory / str(step)


def restore_checkpoint(directory: Path, params: Any, opt_state: Any, step: int | None = None) -> tuple[Any, Any, int]:
    """Read a checkpoint back into the structure of `params` and `opt_state`.

    Args:
        directory: the folder `save_checkpoint` wrote into.
        params: parameters (arrays or `jax.ShapeDtypeStruct`s) of the same structure as the saved ones.
        opt_state: likewise, the optimizer state.
        step: the step to restore; the latest one if None.

    Returns:
        `(params, opt_state, step)` as saved.

    Raises:
        NotFoundError: no checkpoint (or not that step) in `directory`.
    """
    directory = Path(directory).absolute()
    if not directory.is_dir():
        raise NotFoundError(f"no checkpoints in {directory}: the folder does not exist")
    with ocp.CheckpointManager(directory) as manager:
        steps = sorted(manager.all_steps())
        if not steps:
            raise NotFoundError(f"no checkpoints in {directory}")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise NotFoundError(f"no checkpoint for step {step} in {directory}; saved steps: {steps}")
        like = {"params": params, "opt_state": opt_state, "step": 0}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    return restored["params"], restored["opt_state"], int(restored["step"])
