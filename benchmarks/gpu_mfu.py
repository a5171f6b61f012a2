"""MFU of a 125M-parameter Llama training step in bfloat16 compute on one GPU (synthetic tokens).

Command (on a machine with a GPU and jax[cuda] installed):
    .venv/bin/python benchmarks/gpu_mfu.py [--batch 16] [--seq 1024] [--steps 20]
    .venv/bin/python benchmarks/gpu_mfu.py --smoke          # tiny model on CPU, checks the script runs

Builds the `llama-125m` preset (vocab 50,257: 124M parameters) with `compute_dtype=bfloat16` (float32 parameters),
Tradewind's jitted train step (`make_train_step`, AdamW, clipping, donated buffers), times `--steps`
steps after two warm-up steps, and reports model FLOP/s (PaLM formula with the attention term) over
the peak of `tradewind.trainer.flops.PEAK_FLOPS` for the device (H100/H200: 989 TFLOP/s dense bf16).

Last line: one JSON object; value = MFU, baseline = 1.0 (the peak), ratio = MFU, unit "fraction".
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from tradewind.trainer import LlamaConfig, OptimizerConfig, build_model
from tradewind.trainer.flops import peak_flops
from tradewind.trainer.optimizer import build_optimizer
from tradewind.trainer.step import make_train_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="a tiny model for a CPU check of the script")
    args = parser.parse_args()
    if args.smoke:
        config = LlamaConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=128)
        args.batch, args.seq, args.steps = 4, 128, 3
    else:
        config = LlamaConfig(preset="llama-125m", vocab_size=50_257)  # GPT-2 vocabulary: 124M parameters
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), dtype=dtype))
    optimizer = build_optimizer(OptimizerConfig(learning_rate=3e-4))
    opt_state = optimizer.init(params)
    step = jax.jit(make_train_step(graphdef, optimizer), donate_argnums=(0, 1))
    batch = jax.random.randint(jax.random.key(0), (args.batch, args.seq + 1), 0, config.vocab_size, jnp.int32)
    for _ in range(2):
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(args.steps):
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_s = args.batch * args.seq / seconds
    achieved = tokens_per_s * config.flops_per_token(args.seq)
    device = jax.devices()[0]
    peak, source = peak_flops(device.device_kind if device.platform != "cpu" else "cpu", os.cpu_count() or 1)
    mfu = achieved / peak
    print(f"device: {device.device_kind} ({device.platform}); compute dtype {jnp.dtype(dtype).name}")
    print(f"model: {config.count_params() / 1e6:.1f}M parameters, batch {args.batch} x seq {args.seq}")
    print(f"{seconds * 1000:.1f} ms/step, {tokens_per_s:,.0f} tok/s, {achieved / 1e12:.2f} TFLOP/s")
    print(f"peak {peak / 1e12:.1f} TFLOP/s ({source}) -> MFU {mfu:.3f}")
    print(
        json.dumps(
            {
                "benchmark": "gpu_mfu_125m_bf16",
                "value": round(mfu, 4),
                "baseline": 1.0,
                "ratio": round(mfu, 4),
                "unit": "fraction",
            }
        )
    )


if __name__ == "__main__":
    main()
