"""Tokens/s of the Tradewind training loop against a minimal hand-written `jax.jit` loop, plus model FLOP/s.

Command:
    .venv/bin/python benchmarks/train.py [--steps 40] [--pairs 15]

Part 1 trains the demo's model (Llama, d_model 160, 4 layers, batch 16, seq 128, byte vocabulary) on Tiny
Shakespeare both ways: `tradewind.trainer.train` (metrics, eval, loader, everything; its
`mean_tokens_per_s` counts step time only, as the loop reports it) and a bare loop of the same model,
optimizer, batches and step count (`jax.jit(value_and_grad) + optax.adamw`, donated buffers). Both
compile ahead of time, untimed, and both timings start at the first step. The two run back to back in
`--pairs` pairs, taking turns at going first. A shared machine's speed drifts by tens of percent over
minutes, so each pair gives one ratio and the result is the median of those ratios. Target >= 0.97.

Part 2 times a ~14M-parameter model at seq 256 (d_model 384, 8 layers) in the Tradewind step and
reports its model FLOP/s (PaLM formula, the model config's `flops_per_token`) against a float32 matmul ceiling
measured right before it (2048^3 `jnp.dot`; median of five pairs; target >= 0.5 of the ceiling) and
against the CPU's theoretical peak estimate.

Last line: one JSON object; value and baseline are the median tokens/s of each loop, ratio the median
of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from statistics import median

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tradewind.data import PackedLoader, build_token_cache, builtin_corpus_path, load_tokenizer, open_token_cache
from tradewind.runs import LlamaConfig, TrainConfig
from tradewind.runs.flops import peak_flops
from tradewind.trainer import build_model, train
from tradewind.trainer.setup import setup_training

MODEL = {"d_model": 160, "n_layers": 4, "n_heads": 4, "max_seq_len": 128}


def bare_loop(cache: Path, steps: int) -> float:
    """Tokens/s of the simplest correct loop: jit(value_and_grad + adamw), donated, numpy batches."""
    tokens = open_token_cache(cache).tokens("train")
    loader = PackedLoader(tokens, batch_size=16, seq_len=128, seed=0)
    model = build_model(LlamaConfig(vocab_size=258, **MODEL), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.1))
    opt_state = optimizer.init(params)

    def loss_fn(p, batch):
        logits = nnx.merge(graphdef, p)(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    def step(p, s, batch):
        loss, grads = jax.value_and_grad(loss_fn)(p, batch)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    # Compiled ahead and untimed, as Tradewind's step is; both timings include the first execution,
    # which costs a few hundred milliseconds more than the rest on CPU.
    step = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, loader.batch(0)).compile()
    start = time.perf_counter()
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, loader.batch(i))
    jax.block_until_ready(loss)
    return steps * 16 * 128 / (time.perf_counter() - start)


def tradewind_loop(cache: Path, steps: int, out: Path) -> float:
    config = TrainConfig(
        dataset=str(cache),
        model=MODEL,
        steps=steps,
        batch_size=16,
        seq_len=128,
        eval_every=steps,
        eval_batches=1,
        log_every=steps,
        checkpoint=False,
        tensorboard=False,
    )
    return train(config, out).mean_tokens_per_s


def matmul_ceiling(n: int = 2048, repeats: int = 10) -> float:
    a = jnp.ones((n, n), jnp.float32)
    b = jnp.ones((n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        c = dot(a, b)
    c.block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def model_flops(cache: Path, steps: int = 4) -> tuple[float, int]:
    """Model FLOP/s of the Tradewind train step for a ~14M-parameter Llama at seq 256."""
    config = TrainConfig(
        dataset=str(cache),
        model={"d_model": 384, "n_layers": 8, "n_heads": 6, "max_seq_len": 256},
        steps=steps,
        batch_size=8,
        seq_len=256,
        checkpoint=False,
    )
    setup = setup_training(config)
    batch = setup.put_batch(setup.train_loader.batch(0))
    params, opt_state, metrics = setup.train_step(
        setup.state.params, setup.state.opt_state, batch, np.float32(3e-4), setup.frozen
    )
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, metrics = setup.train_step(params, opt_state, batch, np.float32(3e-4), setup.frozen)
    jax.block_until_ready(metrics)
    tokens_per_s = steps * config.tokens_per_step / (time.perf_counter() - start)
    return tokens_per_s * setup.model_config.flops_per_token(config.seq_len), setup.parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        build_token_cache([builtin_corpus_path("tinyshakespeare")], cache, load_tokenizer("byte"))
        ours, bare, ratios = [], [], []
        for pair in range(args.pairs):
            run_dir = Path(tmp) / f"run{pair}"
            if pair % 2:
                ours.append(tradewind_loop(cache, args.steps, run_dir))
                bare.append(bare_loop(cache, args.steps))
            else:
                bare.append(bare_loop(cache, args.steps))
                ours.append(tradewind_loop(cache, args.steps, run_dir))
            ratios.append(ours[-1] / bare[-1])
        value, baseline, ratio = median(ours), median(bare), median(ratios)
        print(f"tradewind loop: {value:,.0f} tok/s (runs: {', '.join(f'{x:,.0f}' for x in ours)})")
        print(f"bare jit loop:  {baseline:,.0f} tok/s (runs: {', '.join(f'{x:,.0f}' for x in bare)})")
        print(f"ratio per pair: {', '.join(f'{x:.3f}' for x in ratios)} -> median {ratio:.3f}")

        ceilings, achieved, fractions = [], [], []
        for _ in range(5):
            ceilings.append(matmul_ceiling())
            flops, parameters = model_flops(cache)
            achieved.append(flops)
            fractions.append(flops / ceilings[-1])
        peak, source = peak_flops(
            jax.devices()[0].device_kind if jax.default_backend() != "cpu" else "cpu", os.cpu_count() or 1
        )
        print(f"model of {parameters / 1e6:.1f}M parameters at seq 256: {median(achieved) / 1e9:.1f} GFLOP/s")
        print(
            f"matmul ceiling (2048^3 float32 jnp.dot): {median(ceilings) / 1e9:.1f} GFLOP/s -> "
            f"{median(fractions):.2f} of it (per pair: {', '.join(f'{x:.2f}' for x in fractions)})"
        )
        print(f"theoretical peak {peak / 1e9:.0f} GFLOP/s ({source}) -> MFU {median(achieved) / peak:.2f}")
    print(
        json.dumps(
            {
                "benchmark": "train_loop_tokens_per_s",
                "value": round(value, 1),
                "baseline": round(baseline, 1),
                "ratio": round(ratio, 3),
                "unit": "tokens/s",
            }
        )
    )


if __name__ == "__main__":
    main()
