"""Llama training steps measured on one GPU: MFU and memory, against what the compiled program predicts.

Command (on a machine with a GPU and jax[cuda]):
    python benchmarks/gpu_mfu.py                    # every case below, each in its own process
    python benchmarks/gpu_mfu.py --case 1b:dot_product:full
    python benchmarks/gpu_mfu.py --smoke            # a tiny model on CPU: checks that the script runs

The GPU path of `benchmarks/tpu_compile.py`: the same Llama presets at sequence 2048, bfloat16 compute with
float32 parameters and AdamW state, Tradewind's own train step (`make_train_step`: clipping, donated
buffers), for each attention kernel and remat policy in `CASES`. Each case runs in a fresh process, so that the
device's peak memory is its own, and reports:

- measured: seconds per step (after two warm-up steps), tokens/s, MFU (PaLM's model FLOPs over the device's
  dense bf16 peak, `tradewind.runs.flops.PEAK_FLOPS`), and the device's peak bytes in use;
- predicted from the compiled program, as `tradewind compile` does for a TPU: the HBM it needs
  (arguments + outputs + temporaries - aliases) and the roofline MFU (model FLOPs / peak against the compiler's
  bytes accessed / HBM bandwidth), so that the TPU estimates can be read against a real device.

One JSON object per line per case; a case that runs out of memory says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

# Model presets with their vocabulary, sequence length and global batch, as `benchmarks/tpu_compile.py` has them.
SHAPES = {
    "125m": ({"preset": "llama-125m", "vocab_size": 32_768, "max_seq_len": 2048}, 2048, 16),
    "1b": ({"preset": "llama-1b", "vocab_size": 128_256, "max_seq_len": 2048}, 2048, 16),
}
# shape:attention:remat, most telling first (a short lease may end before the last).
CASES = [
    "125m:dot_product:none",
    "125m:reference:none",
    "1b:dot_product:none",
    "1b:dot_product:full",
    "1b:reference:full",
    "125m:dot_product:full",
]
# HBM bandwidth per device kind (bytes/s, the data sheets'), for the roofline's memory term.
HBM_BYTES_PER_S = {"h100": 3.35e12, "h200": 4.8e12, "a100": 2.0e12}


def measure(case: str, steps: int, smoke: bool) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tradewind.runs import OptimizerConfig, model_config
    from tradewind.runs.flops import peak_flops
    from tradewind.trainer.models import build_model
    from tradewind.trainer.optimizer import build_optimizer
    from tradewind.trainer.step import make_train_step
    from tradewind.trainer.tpu_compile import compiler_cost, hbm_needed

    name, attention, remat = case.split(":")
    model, seq, batch_size = SHAPES[name]
    if smoke:
        model, seq, batch_size = {"vocab_size": 512, "d_model": 64, "n_layers": 2, "max_seq_len": 128}, 128, 4
    config = model_config(**model)
    device = jax.devices()[0]
    dtype = jnp.float32 if device.platform == "cpu" else jnp.bfloat16
    graphdef, params = nnx.split(build_model(config, rngs=nnx.Rngs(0), dtype=dtype, attention=attention))
    optimizer = build_optimizer(OptimizerConfig(learning_rate=3e-4))
    opt_state = optimizer.init(params)
    batch = jax.random.randint(jax.random.key(0), (batch_size, seq + 1), 0, config.vocab_size, jnp.int32)
    row = {"case": case, "device": device.device_kind, "parameters": config.count_params(), "batch": batch_size}
    step_fn = jax.jit(make_train_step(graphdef, optimizer, remat=remat), donate_argnums=(0, 1))
    try:
        start = time.perf_counter()
        step = step_fn.lower(params, opt_state, batch, 3e-4).compile()
        row["compile_s"] = round(time.perf_counter() - start, 1)
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
        row["first_loss"] = round(float(metrics["loss"]), 5)  # the same weights in every case: kernels agree?
        params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
        jax.block_until_ready(metrics)
        start = time.perf_counter()
        for _ in range(steps):
            params, opt_state, metrics = step(params, opt_state, batch, 3e-4)
        jax.block_until_ready(metrics)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return {**row, "out_of_memory": str(error).splitlines()[0][:300]}
    seconds = (time.perf_counter() - start) / steps
    kind = device.device_kind.lower() if device.platform != "cpu" else "cpu"
    peak, _ = peak_flops(kind, 1)
    model_flops = config.flops_per_token(seq) * batch_size * seq
    compute_s = model_flops / peak
    bandwidth = next((value for key, value in HBM_BYTES_PER_S.items() if key in kind), None)
    hbm_s = compiler_cost(step).get("bytes accessed", 0.0) / bandwidth if bandwidth else 0.0
    stats = device.memory_stats() or {}
    return {
        **row,
        "step_s": round(seconds, 4),
        "tokens_per_s": round(batch_size * seq / seconds),
        "mfu": round(compute_s / seconds, 3),
        "roofline_mfu": round(compute_s / max(compute_s, hbm_s), 3),
        "roofline_bound_by": "hbm" if hbm_s > compute_s else "compute",
        "peak_gib_measured": stats.get("peak_bytes_in_use") and round(stats["peak_bytes_in_use"] / 2**30, 2),
        "gib_predicted": round(hbm_needed(step.memory_analysis()) / 2**30, 2),
        "loss": round(float(metrics["loss"]), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help=f"shape:attention:remat (default: {', '.join(CASES)})")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=480, help="start no case after this many seconds")
    parser.add_argument("--case-timeout-s", type=float, default=180, help="stop a case after this many seconds")
    parser.add_argument("--smoke", action="store_true", help="a tiny model for a CPU check of the script")
    args = parser.parse_args()
    cases = args.case or CASES
    if len(cases) == 1:
        print(json.dumps(measure(cases[0], args.steps, args.smoke)), flush=True)
        return
    started = time.perf_counter()
    for case in cases:
        if time.perf_counter() - started > args.budget_s:
            print(json.dumps({"case": case, "skipped": f"over the {args.budget_s:.0f} s budget"}), flush=True)
            continue
        command = [sys.executable, __file__, "--case", case, "--steps", str(args.steps)] + ["--smoke"] * args.smoke
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=args.case_timeout_s)
        except subprocess.TimeoutExpired:
            print(json.dumps({"case": case, "error": f"over {args.case_timeout_s:.0f} s"}), flush=True)
            continue
        lines = result.stdout.strip().splitlines()
        print(
            lines[-1] if result.returncode == 0 and lines else json.dumps({"case": case, "error": result.stderr[-800:]})
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
