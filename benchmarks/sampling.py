"""Latency of `sample_text` through the warm sampling worker, cold and warm.

Command:
    .venv/bin/python benchmarks/sampling.py

Trains a tiny byte-level run (10 steps, d_model 32, 2 layers) in a temporary workspace, then times
`sample_text` (prompt "ROMEO:", 20 tokens, temperature 0.8): the first call, which starts the workspace's
worker (job start, JAX import, checkpoint load, compilation), and 10 calls after it with the same options,
which the warm worker answers. The issue asks for a warm call under 2 s.

Prints readable lines, then one JSON line: value = the warm median in seconds, baseline = the first (cold)
call in seconds, ratio = baseline / value (higher is better).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from tradewind.data import build_token_cache, builtin_corpus_path, load_tokenizer
from tradewind.runs.sample_client import socket_path
from tradewind.tools import ToolContext
from tradewind.tools.sampling import SampleTextRequest, sample_text

WARM_CALLS = 10


def main() -> None:
    from tradewind.runs import TrainConfig
    from tradewind.trainer import train  # loads JAX

    with tempfile.TemporaryDirectory() as folder:
        ctx = ToolContext.open(Path(folder) / "workspace")
        cache = ctx.workspace.root / "datasets" / "tiny"
        build_token_cache([builtin_corpus_path("tinyshakespeare")], cache, load_tokenizer("byte"))
        config = TrainConfig(
            dataset=str(cache),
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
            steps=10,
            batch_size=8,
            seq_len=32,
            eval_every=10,
            eval_batches=1,
            tensorboard=False,
        )
        train(config, ctx.workspace.run_dir("r1", must_exist=False))
        request = SampleTextRequest(run_id="r1", prompt="ROMEO:", max_tokens=20, temperature=0.8)
        try:
            start = time.perf_counter()
            sample_text(ctx, request)
            cold = time.perf_counter() - start
            warm = []
            for _ in range(WARM_CALLS):
                start = time.perf_counter()
                sample_text(ctx, request)
                warm.append(time.perf_counter() - start)
        finally:
            socket_path(ctx.workspace.jobs_dir).unlink(missing_ok=True)  # the worker exits within a second
    p50 = statistics.median(warm)
    print(f"first (cold) sample_text: {cold:.3f} s")
    print(f"warm sample_text: median {p50:.3f} s, min {min(warm):.3f} s, max {max(warm):.3f} s over {WARM_CALLS}")
    result = {"value": round(p50, 4), "baseline": round(cold, 4), "ratio": round(cold / p50, 3), "unit": "s"}
    print(json.dumps({"benchmark": "sample_text_warm_p50", **result}))


if __name__ == "__main__":
    main()
