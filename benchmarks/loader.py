"""Loader throughput: shuffled (16, 1025) batches from a memory-mapped cache, against bare `np.memmap` reads.

Command:
    .venv/bin/python benchmarks/loader.py [--tokens 200_000_000]

A token file of `--tokens` random uint16 ids (400 MB by default, larger than the CPU caches, and read
back through the page cache) is written once. Then, on the same file:

    ours      PackedLoader(memmap, batch_size=16, seq_len=1024).batch(step) for consecutive steps:
              Feistel-shuffled windows, int32 batches, any step addressable
    baseline  np.memmap with a random window start per row, stacked and cast to int32 (no epoch
              permutation, no resumability)

Prints readable lines (also a 4-shard `ShardedTokens` stream, a two-source `MixtureLoader`, and
`iter_batches` with background prefetch), then one JSON line: value = our tokens/s, baseline = the bare
memmap tokens/s, ratio = value / baseline (higher is better; target >= 0.8 and >= 10 M tokens/s).

The same file also holds documents (geometric lengths, mean `DOC_TOKENS`) with a memory-mapped uint8 loss
mask beside it: `DocumentLoader(memmap, mask, document_starts, batch_size=16, seq_len=1024).batch(step)`
builds whole-document windows with segment ids, positions and the loss mask. The JSON line adds its
tokens/s as `documents` and `documents_ratio` = that / PackedLoader's (same process, same file), and the
seconds its constructor took to pack the documents into windows as `documents_pack_s`.

With `--remote`: training from a bucket's copy of the cache against training from the local cache. The same
small run (Tiny Shakespeare, `REMOTE_RUN`) is launched through `launch_training` on the local backend,
alternately with its cache in the workspace and with `storage` on a `gcp-storage-emulator` on loopback (the
process copies the cache to its own folder, then reads it there), `--repeats` times each. Prints one JSON
line: value = the bucket runs' median training tokens/s, baseline = the local runs', ratio = value / baseline
(target >= 0.9); also the medians of the whole runs' wall seconds, copy included.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tradewind.data import MixtureLoader, PackedLoader, ShardedTokens
from tradewind.data.packing import DocumentLoader

BATCH, SEQ = 16, 1024
DOC_TOKENS = 300
SECONDS = 2.0


def rate(read_batch) -> float:
    """Tokens per second of `read_batch(step)` over about SECONDS, after a short warm-up."""
    for step in range(20):
        read_batch(step)
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < SECONDS:
        for _ in range(50):
            read_batch(10_000 + steps)
            steps += 1
    return steps * BATCH * (SEQ + 1) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=lambda v: int(v.replace("_", "")), default=200_000_000)
    parser.add_argument("--remote", action="store_true", help="train from a bucket's copy against a local cache")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tradewind-bench-loader-"))
    try:
        if args.remote:
            remote(work, args.repeats)
        else:
            run(work, args.tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, count: int) -> None:
    path = work / "tokens.bin"
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, count, 10_000_000):
            f.write(rng.integers(0, 50_000, size=min(10_000_000, count - start), dtype=np.uint16).tobytes())
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    print(f"token file: {count:,} uint16 tokens ({path.stat().st_size / 1e6:,.0f} MB); batches of ({BATCH}, {SEQ + 1})")

    loader = PackedLoader(tokens, batch_size=BATCH, seq_len=SEQ, seed=0)
    ours = rate(loader.batch)

    starts_rng = np.random.default_rng(1)
    last_start = len(tokens) - (SEQ + 1)

    def bare(step: int) -> np.ndarray:
        starts = starts_rng.integers(0, last_start, size=BATCH)
        return np.stack([tokens[s : s + SEQ + 1] for s in starts]).astype(np.int32)

    baseline = rate(bare)

    quarter = len(tokens) // 4
    sharded = ShardedTokens([tokens[i * quarter : (i + 1) * quarter] for i in range(4)], tokens.dtype)
    sharded_rate = rate(PackedLoader(sharded, batch_size=BATCH, seq_len=SEQ, seed=0).batch)
    mixture = MixtureLoader([tokens[:quarter], tokens[quarter:]], [0.3, 0.7], batch_size=BATCH, seq_len=SEQ)
    mixture_rate = rate(mixture.batch)
    prefetched = loader.iter_batches(start_step=0, prefetch=4)
    prefetch_rate = rate(lambda step: next(prefetched))
    prefetched.close()

    mask_path = work / "loss_mask.bin"
    with open(mask_path, "wb") as f:
        for start in range(0, count, 10_000_000):
            f.write(rng.integers(0, 2, size=min(10_000_000, count - start), dtype=np.uint8).tobytes())
    mask = np.memmap(mask_path, dtype=np.uint8, mode="r")
    lengths = rng.geometric(1 / DOC_TOKENS, size=2 * count // DOC_TOKENS + 10)
    ends = np.cumsum(lengths)
    document_starts = np.concatenate([[0], ends[ends < count], [count]]).astype(np.int64)
    start = time.perf_counter()
    documents = DocumentLoader(tokens, mask, document_starts, batch_size=BATCH, seq_len=SEQ, seed=0)
    pack_s = time.perf_counter() - start
    documents_rate = rate(documents.batch)

    print(f"bare np.memmap random windows: {baseline / 1e6:8.1f} M tokens/s")
    print(f"PackedLoader.batch:            {ours / 1e6:8.1f} M tokens/s")
    print(f"  over 4 shards (ShardedTokens): {sharded_rate / 1e6:6.1f} M tokens/s")
    print(f"  MixtureLoader, 2 sources:      {mixture_rate / 1e6:6.1f} M tokens/s")
    print(f"  iter_batches(prefetch=4):      {prefetch_rate / 1e6:6.1f} M tokens/s (consumer side)")
    print(
        f"DocumentLoader.batch:          {documents_rate / 1e6:8.1f} M tokens/s ({documents_rate / ours:.2f}x "
        f"PackedLoader; {documents.num_documents:,} documents packed into {documents.num_windows:,} windows "
        f"in {pack_s:.2f} s)"
    )
    print(
        json.dumps(
            {
                "benchmark": "loader_batches",
                "value": round(ours),
                "baseline": round(baseline),
                "ratio": round(ours / baseline, 3),
                "unit": "tokens/s",
                "documents": round(documents_rate),
                "documents_ratio": round(documents_rate / ours, 3),
                "documents_pack_s": round(pack_s, 3),
            }
        )
    )


REMOTE_RUN = {
    "model": {"d_model": 96, "n_layers": 2, "n_heads": 4, "max_seq_len": 128},
    "steps": 120,
    "batch_size": 16,
    "seq_len": 128,
    "eval_every": 120,
    "log_every": 10,
    "checkpoint": False,
}


def remote(work: Path, repeats: int) -> None:
    """Train `REMOTE_RUN` from the local cache and from a bucket's copy, alternately; print the JSON line."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from bucket_servers import start_gcs_emulator, stop

    from tradewind.tools import LaunchTrainingRequest, ToolContext, WaitForRunRequest, launch_training, wait_for_run

    server, bucket = start_gcs_emulator()
    try:
        ctx = ToolContext.open(work / "workspace", allowed_paths=(bucket,))
        (ctx.workspace.root / "settings.yaml").write_text("backend: local\n")
        runs: dict[str, list] = {"local": [], "bucket": []}
        for i in range(repeats):
            for kind, storage in (("local", None), ("bucket", f"{bucket}/bench-{i}")):
                request = LaunchTrainingRequest(dataset="builtin:tinyshakespeare", storage=storage, **REMOTE_RUN)
                run_id = launch_training(ctx, request).run_id
                done = wait_for_run(ctx, WaitForRunRequest(run_id=run_id, timeout_s=900))
                assert done.status == "SUCCEEDED", done.log_tail
                runs[kind].append(done.summary)
                print(f"{kind:6} {done.summary.mean_tokens_per_s:,.0f} tok/s, {done.summary.wall_s:.1f} s", flush=True)
    finally:
        stop(server)
    speed = {kind: statistics.median(s.mean_tokens_per_s for s in summaries) for kind, summaries in runs.items()}
    wall = {kind: statistics.median(s.wall_s for s in summaries) for kind, summaries in runs.items()}
    print(
        json.dumps(
            {
                "benchmark": "train_from_bucket_tokens_per_s",
                "value": round(speed["bucket"]),
                "baseline": round(speed["local"]),
                "ratio": round(speed["bucket"] / speed["local"], 3),
                "unit": "tokens/s",
                "wall_s": {kind: round(seconds, 1) for kind, seconds in wall.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
