"""How long an async checkpoint save blocks the training loop, against a synchronous save of the same state.

Command:
    .venv/bin/python benchmarks/checkpoint.py

The state is a ~20M-parameter Llama's parameters and AdamW state (about 240 MB of float32). A synchronous
save (`CheckpointConfig(async_save=False)`) blocks until the files are on disk; an async save blocks
only while orbax copies the arrays off the device and starts its writer thread, and the loop goes on
while it writes. Each is measured 3 times into fresh folders; medians are reported.

Last line: one JSON object; value = async blocking seconds, baseline = sync seconds,
ratio = baseline / value (target >= 4).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
from flax import nnx

from tradewind.trainer import CheckpointConfig, Checkpointer, LlamaConfig, OptimizerConfig, TrainState, build_model
from tradewind.trainer.optimizer import build_optimizer

REPEATS = 3


def make_state() -> TrainState:
    config = LlamaConfig(preset="llama-20m", vocab_size=32_000)
    _, params = nnx.split(build_model(config, rngs=nnx.Rngs(0)))
    opt_state = build_optimizer(OptimizerConfig()).init(params)
    return TrainState.start(params, opt_state, seed=0).advanced(params, opt_state)


def blocked_seconds(state: TrainState, folder: Path, async_save: bool) -> tuple[float, float]:
    """(seconds the caller was blocked by save(), seconds until the checkpoint was complete)."""
    checkpointer = Checkpointer(folder, CheckpointConfig(async_save=async_save))
    start = time.perf_counter()
    checkpointer.save(state)
    blocked = time.perf_counter() - start
    checkpointer.close()
    return blocked, time.perf_counter() - start


def main() -> None:
    state = make_state()
    size = sum(x.nbytes for x in jax.tree.leaves(state.to_checkpoint()) if hasattr(x, "nbytes"))
    print(f"state: {size / 1e6:,.0f} MB")
    results = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(REPEATS):
            for async_save in (False, True):
                results[async_save].append(blocked_seconds(state, Path(tmp) / f"{async_save}-{i}", async_save))
    sync = statistics.median(b for b, _ in results[False])
    async_blocked = statistics.median(b for b, _ in results[True])
    async_total = statistics.median(t for _, t in results[True])
    print(f"sync save blocks:   {sync:.3f} s")
    print(f"async save blocks:  {async_blocked:.3f} s (complete on disk after {async_total:.3f} s)")
    print(
        json.dumps(
            {
                "benchmark": "checkpoint_blocking_seconds",
                "value": round(async_blocked, 4),
                "baseline": round(sync, 4),
                "ratio": round(sync / async_blocked, 2),
                "unit": "s",
            }
        )
    )


if __name__ == "__main__":
    main()
