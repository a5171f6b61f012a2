"""Tokens/s of one jitted train step under different settings (XLA flags, compute dtype), each in a fresh process.

Command:
    .venv/bin/python benchmarks/train_step_settings.py [--rounds 3] [--steps 5]

The model is `train_vs_torch.py`'s 7.36M Llama (vocabulary 8192, d_model 256, 4 layers, d_ff 688, untied head,
seq 256, batch 16) on random tokens, with Tradewind's own train step and optimizer. XLA reads its flags when
JAX starts, so every setting runs in a process of its own; the settings take turns, in reverse order every
other round, and each one's median over the rounds is compared with the first setting's (the default).
Compilation and one warm-up step are not timed.

Last line: one JSON object; value is the fastest setting's median tokens/s, baseline the default's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from statistics import median

SETTINGS: dict[str, dict[str, str]] = {
    "default (float32)": {},
    "oneDNN dots": {"XLA_FLAGS": "--xla_cpu_experimental_onednn_fusion_type=dot"},
    "XNNPACK dots": {"XLA_FLAGS": "--xla_cpu_experimental_xnn_fusion_type=dot"},
    "bfloat16 compute": {"COMPUTE_DTYPE": "bfloat16"},
}


def time_step(steps: int) -> dict[str, float]:
    """Tokens/s of the train step in this process, with `COMPUTE_DTYPE` from the environment."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from tradewind.runs import LlamaConfig, OptimizerConfig
    from tradewind.trainer import build_model, build_optimizer
    from tradewind.trainer.step import make_train_step

    config = LlamaConfig(
        vocab_size=8192, d_model=256, n_layers=4, n_heads=4, d_ff=688, max_seq_len=256, tie_embeddings=False
    )
    dtype = jnp.dtype(os.environ.get("COMPUTE_DTYPE", "float32"))
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), dtype=dtype))
    optimizer = build_optimizer(OptimizerConfig())
    opt_state = optimizer.init(params)
    step = jax.jit(make_train_step(graphdef, optimizer), donate_argnums=(0, 1))
    batch = jnp.asarray(np.random.default_rng(0).integers(0, 8192, (16, 257)), jnp.int32)
    for _ in range(2):  # compilation, then one warm-up step
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
        jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
    jax.block_until_ready(metrics)
    return {"tokens_per_s": steps * 16 * 256 / (time.perf_counter() - start), "loss": float(metrics["loss"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one timing, as JSON
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(time_step(args.steps)))
        return
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        order = list(SETTINGS.items())
        for name, env in order if round_ % 2 == 0 else reversed(order):
            command = [sys.executable, __file__, "--worker", "--steps", str(args.steps)]
            done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"])
    default = median(runs["default (float32)"])
    for name, values in runs.items():
        shown = ", ".join(f"{x:,.0f}" for x in values)
        print(f"{name:22} {median(values):8,.0f} tokens/s  x{median(values) / default:.3f}  (runs: {shown})")
    best = max(runs, key=lambda name: median(runs[name]))
    print(
        json.dumps(
            {
                "benchmark": "train_step_settings_tokens_per_s",
                "value": round(median(runs[best]), 1),
                "baseline": round(default, 1),
                "ratio": round(median(runs[best]) / default, 3),
                "unit": "tokens/s",
                "fastest": best,
            }
        )
    )


if __name__ == "__main__":
    main()
