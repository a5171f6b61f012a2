"""The splash attention kernel's speed by its tiling (`BlockSizes`), on one TPU chip, at the trainer's shapes.

Command (on a TPU VM):
    python benchmarks/attention_blocks.py --out FILE.jsonl [--shapes 350m,1b] [--vmem-kib 0,65536]
    python benchmarks/attention_blocks.py --smoke --out FILE.jsonl   # tiny shapes in Pallas's interpreter, any CPU

Attention is the part of a step that loses the most MFU on a v5e (docs/reports/benchmarks.md): the splash kernel
runs the 64-wide heads of the 125M and 1B Llamas at a fraction of the chip's peak. (The 350M's heads were 64 wide
until 2026-12-07, and `--shapes 350m_64` times them; that day's rows ran 16 key/value heads where it had 8.) Its
tiling is a free choice (the values are the same, the speed is not), so this times the causal kernel alone,
forward and forward with backward (the fused dq/dk/dv kernel, as the trainer runs it), for the trainer's own tiling
(`layers.splash_block_sizes`) and each change in `CANDIDATES`, then for the best forward change together with
the best backward change. Each candidate's output and gradients are compared with the trainer's tiling (a change
of tiling must not change the values beyond bfloat16's rounding). `--vmem-kib` runs the sweep again in a process
whose compiler may give a kernel more of the chip's VMEM (`--xla_tpu_scoped_vmem_limit_kib`): the larger blocks
need it.

Output: one JSON object per line (`--out`, and stdout): `kind` "blocks" with the shape, the candidate, its sizes,
the forward and forward-with-backward milliseconds (median of `--repeats`), the causal FLOP/s of each, and the
largest difference from the trainer's tiling; or "error" for a tiling that does not compile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHAPES = {  # batch, query heads, key/value heads, sequence, head width: the per-chip batches of tpu_chip.py
    "125m": (16, 12, 12, 2048, 64),
    "350m": (8, 8, 4, 2048, 128),
    "350m_64": (8, 16, 8, 2048, 64),  # the 350M's heads before they were 128 wide
    "1b": (8, 32, 8, 2048, 64),
}
SMOKE_SHAPE = (1, 2, 2, 256, 64)
FORWARD = {  # changes to the forward kernel's tiling
    "fwd_kv_compute_512": {"block_kv_compute": 512},
    "fwd_kv_compute_256": {"block_kv_compute": 256},
    "fwd_512": {"block_q": 512, "block_kv": 512, "block_kv_compute": 512},
    "fwd_512_compute_256": {"block_q": 512, "block_kv": 512, "block_kv_compute": 256},
    "fwd_q_512": {"block_q": 512},
    "fwd_kv_512": {"block_kv": 512, "block_kv_compute": 512},
    "fwd_q_2048": {"block_q": 2048},
    "fwd_kv_2048_compute_512": {"block_kv": 2048, "block_kv_compute": 512},
    "fwd_256": {"block_q": 256, "block_kv": 256, "block_kv_compute": 256},
}
BACKWARD = {  # changes to the backward kernel's tiling
    "bwd_kv_compute_512": {"block_kv_dkv_compute": 512},
    "bwd_kv_compute_256": {"block_kv_dkv_compute": 256},
    "bwd_512": {"block_q_dkv": 512, "block_kv_dkv": 512, "block_kv_dkv_compute": 512},
    "bwd_q_512": {"block_q_dkv": 512},
    "bwd_kv_512": {"block_kv_dkv": 512, "block_kv_dkv_compute": 512},
    "bwd_q_2048": {"block_q_dkv": 2048},
    "bwd_separate_1024": {"use_fused_bwd_kernel": False, "block_q_dq": 1024, "block_kv_dq": 1024},
    "bwd_separate_512": {"use_fused_bwd_kernel": False, "block_q_dq": 512, "block_kv_dq": 512},
}
LAYOUT = {  # the physical layout the kernel asks its inputs in (its interface is the same)
    "k_seq_minor": {"k_layout": "SEQ_MINOR"},
    "v_seq_minor": {"v_layout": "SEQ_MINOR"},
    "q_seq_minor": {"q_layout": "SEQ_MINOR"},
}
CANDIDATES = {"current": {}, **FORWARD, **BACKWARD, **LAYOUT}


def block_sizes(splash: Any, seq: int, change: dict[str, Any]) -> Any:
    """The trainer's tiling of `seq` with `change` applied (block sizes past `seq` are cut to it)."""
    from tradewind.trainer.models.layers import splash_block_sizes

    sizes = splash_block_sizes(seq) | change
    for name, value in sizes.items():
        if name.endswith("_layout"):
            sizes[name] = splash.QKVLayout[value] if isinstance(value, str) else value
        elif isinstance(value, int) and not isinstance(value, bool):
            sizes[name] = min(value, seq)
    return splash.BlockSizes(**sizes)


def timed(function: Any, arguments: tuple, repeats: int) -> float:
    """Median seconds of `function(*arguments)` after two warm-up calls."""
    import jax

    for _ in range(2):
        jax.block_until_ready(function(*arguments))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(function(*arguments))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sweep(shape_name: str, shape: tuple[int, ...], repeats: int, interpret: bool, vmem_kib: int) -> None:
    """Time every candidate on `shape`, then the best forward and backward changes together; a line each."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, heads, kv_heads, seq, width = shape
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (batch, heads, seq, width), jnp.bfloat16) * width**-0.5
    k = jax.random.normal(keys[1], (batch, kv_heads, seq, width), jnp.bfloat16)
    v = jax.random.normal(keys[2], (batch, kv_heads, seq, width), jnp.bfloat16)
    d_out = jax.random.normal(keys[3], (batch, heads, seq, width), jnp.bfloat16)
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq))] * heads)
    score_flops = 2 * batch * heads * seq * seq * width / 2  # one product over the causal half of the scores
    reference = None

    def measure(name: str, change: dict[str, Any]) -> dict[str, Any]:
        nonlocal reference
        row: dict[str, Any] = {"kind": "blocks", "shape": shape_name, "candidate": name, "vmem_kib": vmem_kib}
        try:
            sizes = block_sizes(splash, seq, change)
            kernel = jax.vmap(
                splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
            )
            forward = jax.jit(kernel)
            backward = jax.jit(jax.grad(lambda q, k, v: (kernel(q, k, v) * d_out).astype(jnp.float32).sum(), (0, 1, 2)))
            values = (forward(q, k, v), *backward(q, k, v))
            forward_s = timed(forward, (q, k, v), repeats)
            both_s = timed(backward, (q, k, v), repeats)
        except Exception as error:  # a tiling past the chip's VMEM does not compile: a finding too
            return row | {"kind": "error", "change": change, "error": f"{type(error).__name__}: {str(error)[:600]}"}
        if reference is None:
            reference = values
        difference = max(
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
            for a, b in zip(values, reference, strict=True)
        )
        return row | {
            "change": change,
            "sizes": {key: getattr(sizes, key) for key in sizes.__dataclass_fields__},
            "forward_ms": forward_s * 1e3,
            "forward_and_backward_ms": both_s * 1e3,
            "forward_tflops": 2 * score_flops / forward_s / 1e12,  # scores and values
            "forward_and_backward_tflops": 7 * score_flops / both_s / 1e12,  # and 5 products back (one a recompute)
            "max_difference_from_current": difference,
        }

    rows = {}
    for name, change in CANDIDATES.items():
        rows[name] = measure(name, change)
        print(json.dumps(rows[name], default=str), flush=True)
    timed_rows = {name: row for name, row in rows.items() if row["kind"] == "blocks"}
    if "current" not in timed_rows:
        return
    current = timed_rows["current"]
    best_forward = min((n for n in FORWARD if n in timed_rows), key=lambda n: timed_rows[n]["forward_ms"], default=None)
    backward_ms = {n: timed_rows[n]["forward_and_backward_ms"] - timed_rows[n]["forward_ms"] for n in timed_rows}
    best_backward = min((n for n in BACKWARD if n in timed_rows), key=backward_ms.get, default=None)
    best_layout = min(
        (n for n in LAYOUT if n in timed_rows), key=lambda n: timed_rows[n]["forward_and_backward_ms"], default=None
    )
    change: dict[str, Any] = {}
    parts = []
    if best_forward and timed_rows[best_forward]["forward_ms"] < current["forward_ms"]:
        change |= FORWARD[best_forward]
        parts.append(best_forward)
    if best_backward and backward_ms[best_backward] < backward_ms["current"]:
        change |= BACKWARD[best_backward]
        parts.append(best_backward)
    if best_layout and timed_rows[best_layout]["forward_and_backward_ms"] < current["forward_and_backward_ms"]:
        change |= LAYOUT[best_layout]
        parts.append(best_layout)
    if len(parts) > 1:
        print(json.dumps(measure("+".join(parts), change), default=str), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON lines file (appended to)")
    parser.add_argument("--shapes", default="350m,1b", help="comma-separated, of: " + ", ".join(SHAPES))
    parser.add_argument("--vmem-kib", default="0", help="comma-separated scoped VMEM limits; 0: the compiler's own")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in Pallas's interpreter (any platform)")
    parser.add_argument("--child", type=int, metavar="VMEM_KIB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        for name in args.shapes.split(","):
            sweep(name, SMOKE_SHAPE if args.smoke else SHAPES[name], args.repeats, args.smoke, args.child)
        return
    if args.out is None:
        parser.error("--out is required")
    with open(args.out, "a", encoding="utf-8") as out:
        for vmem_kib in map(int, args.vmem_kib.split(",")):
            env = dict(os.environ)
            if vmem_kib:
                flag = f"--xla_tpu_scoped_vmem_limit_kib={vmem_kib}"
                env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {flag}".strip()
            command = [sys.executable, __file__, "--child", str(vmem_kib), "--shapes", args.shapes]
            command += ["--repeats", str(args.repeats), *["--smoke"] * args.smoke]
            with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as process:
                assert process.stdout is not None
                for line in process.stdout:
                    if line.startswith("{"):
                        out.write(line)
                        out.flush()
                        print(line, end="", flush=True)
            if process.returncode:
                out.write(json.dumps({"kind": "error", "vmem_kib": vmem_kib, "exit_code": process.returncode}) + "\n")


if __name__ == "__main__":
    main()
