"""Opening a run's checkpoints wherever they are: a folder or `gs://`, which orbax writes itself
(`orbax_checkpoint.Checkpointer`), or another bucket (`s3://`), whose checkpoints are made in this process's own
folder and copied (`bucket_checkpoint.BucketCopyCheckpointer`). The save policies and what a restore does are in
`orbax_checkpoint`.

Example:
    checkpointer = open_checkpointer(layout.checkpoints, config.checkpoints)
    state = read_checkpoint(layout.checkpoints, like)  # the newest that reads back
"""

from __future__ import annotations

from pathlib import Path

from tradewind.core import NotFoundError
from tradewind.core.buckets import is_remote
from tradewind.runs.config import CheckpointConfig
from tradewind.trainer.bucket_checkpoint import BucketCopyCheckpointer
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.state import TrainState


def open_checkpointer(
    location: str | Path, policy: CheckpointConfig | None = None, *, read_only: bool = False
) -> Checkpointer:
    """The checkpoints at `location`: a folder, a bucket orbax writes itself (`gs://`), or one it cannot
    (`s3://`), whose checkpoints go through this process's own folder (`bucket_checkpoint`)."""
    if is_remote(location) and not str(location).startswith("gs://"):
        return BucketCopyCheckpointer(str(location), policy, read_only=read_only)
    return Checkpointer(location, policy, read_only=read_only)


def read_checkpoint(location: str | Path, like: TrainState, step: int | None = None) -> TrainState:
    """Read checkpoint `step` (default: the newest that reads back) of the run whose checkpoints are at
    `location` (a folder or a bucket prefix), read-only, into the structure of `like`.

    Raises:
        NotFoundError: the folder does not exist, has no checkpoint, not that step, or none reads back.
    """
    if not is_remote(location):
        location = Path(location).absolute()
        if not location.is_dir():
            raise NotFoundError(f"no checkpoints in {location}: the folder does not exist")
    checkpointer = open_checkpointer(location, read_only=True)
    try:
        return checkpointer.restore(like, step)
    finally:
        checkpointer.close()
