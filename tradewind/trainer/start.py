"""The training job's entry: the devices open while the trainer imports.

Opening a TPU takes seconds (6.3 s for a v5e chip) and importing the trainer (Flax, Optax, Orbax and the loop)
2.4 s more; side by side they took 7.7 s instead of 10.2 (docs/reports/benchmarks.md, section TPU host). So a
job of one process imports JAX, starts opening its devices on a thread, and only then imports the trainer. A
gang's process must not touch its devices before `jax.distributed.initialize`, so it opens them in turn.

As a job, the backends run `train_job(run_dir=..., config=..., placement=...)` (a `TrainJob`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from tradewind.cluster.jobs import distributed_env
from tradewind.core import parse_config
from tradewind.runs.jobs import TrainJob
from tradewind.trainer.startup import StartupClock

PRELOAD = ("tradewind.trainer.loop",)  # what the fork server imports ahead of the jobs (cluster/forkserver.py)


def train_job(**job: Any) -> None:
    """The entry of a training job: validates its keyword arguments as a `TrainJob` and trains."""
    clock = StartupClock.since_process_start()
    request = parse_config(TrainJob, job, source="train job")
    if distributed_env() is None and not request.config.distributed.enabled:
        threading.Thread(target=_open_devices, name="open-devices", daemon=True).start()
    from tradewind.trainer.loop import train  # imported while the devices open

    train(request.config, request.run_dir, placement=request.placement, clock=clock)


def _open_devices() -> None:
    import jax

    with contextlib.suppress(Exception):  # the loop opens them again, and says what went wrong
        jax.devices()
