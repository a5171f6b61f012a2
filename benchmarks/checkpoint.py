"""How long an async checkpoint save blocks the training loop, against a synchronous save of the same state.

Command:
    .venv/bin/python benchmarks/checkpoint.py

The state is a ~20M-parameter Llama's parameters and AdamW state (about 240 MB of float32). A synchronous
save (`CheckpointConfig(async_save=False)`) blocks until the files are on disk; an async save blocks
only while orbax copies the arrays off the device and starts its writer thread, and the loop goes on
while it writes. Each is measured 3 times into fresh folders; medians are reported.

Last line: one JSON object; value = async blocking seconds, baseline = sync seconds,
ratio = baseline / value (target >= 4).

With `--remote`, the same async save into buckets on loopback servers the benchmark starts (gs:// on
`gcp-storage-emulator`, which orbax writes itself; s3:// on `moto`, saved locally and copied up behind the
loop, see `tradewind.trainer.bucket_checkpoint`), against a local async save: one JSON line per bucket,
value = its blocking seconds, baseline = the local async save's, ratio = value / baseline (target <= 1.1: a
save to a bucket blocks the step no more than a local one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
from flax import nnx

from tradewind.cluster.jobs import LOCAL_DIR_ENV
from tradewind.runs import CheckpointConfig, LlamaConfig, OptimizerConfig
from tradewind.trainer import Checkpointer, TrainState, build_model
from tradewind.trainer.bucket_checkpoint import BucketCopyCheckpointer
from tradewind.trainer.optimizer import build_optimizer

REPEATS = 3


def make_state() -> TrainState:
    config = LlamaConfig(preset="llama-20m", vocab_size=32_000)
    _, params = nnx.split(build_model(config, rngs=nnx.Rngs(0)))
    opt_state = build_optimizer(OptimizerConfig()).init(params)
    return TrainState.start(params, opt_state, seed=0).advanced(params, opt_state)


def blocked_seconds(
    state: TrainState, folder: Path | str, async_save: bool, kind: type[Checkpointer] = Checkpointer
) -> tuple[float, float]:
    """(seconds the caller was blocked by save(), seconds until the checkpoint was complete)."""
    checkpointer = kind(folder, CheckpointConfig(async_save=async_save))
    start = time.perf_counter()
    checkpointer.save(state)
    blocked = time.perf_counter() - start
    checkpointer.close()
    return blocked, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", action="store_true", help="also save to gs:// and s3:// servers on loopback")
    args = parser.parse_args()
    state = make_state()
    size = sum(x.nbytes for x in jax.tree.leaves(state.to_checkpoint()) if hasattr(x, "nbytes"))
    print(f"state: {size / 1e6:,.0f} MB")
    if args.remote:
        remote(state)
        return
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


def remote(state: TrainState) -> None:
    """Async saves into each bucket against local async saves of the same state, interleaved."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from bucket_servers import start_gcs_emulator, start_s3_server, stop

    servers = [start_gcs_emulator(), start_s3_server()]
    try:
        kinds = {"local": Checkpointer, "gs": Checkpointer, "s3": BucketCopyCheckpointer}
        roots = {"gs": servers[0][1], "s3": servers[1][1]}
        results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
        with tempfile.TemporaryDirectory() as tmp:
            os.environ[LOCAL_DIR_ENV] = tmp  # the s3 checkpointer's own folder
            for i in range(REPEATS):
                for kind, checkpointer in kinds.items():
                    where = f"{roots[kind]}/bench-{i}" if kind in roots else Path(tmp) / f"local-{i}"
                    results[kind].append(blocked_seconds(state, where, True, checkpointer))
        local = statistics.median(b for b, _ in results["local"])
        for kind, runs in results.items():
            blocked, total = statistics.median(b for b, _ in runs), statistics.median(t for _, t in runs)
            print(f"{kind:5} async save blocks {blocked:.3f} s (complete after {total:.3f} s)")
        for kind in roots:
            blocked = statistics.median(b for b, _ in results[kind])
            print(
                json.dumps(
                    {
                        "benchmark": f"checkpoint_blocking_seconds_{kind}",
                        "value": round(blocked, 4),
                        "baseline": round(local, 4),
                        "ratio": round(blocked / local, 2),
                        "unit": "s",
                    }
                )
            )
    finally:
        for process, _ in servers:
            stop(process)


if __name__ == "__main__":
    main()
