"""Llama shapes compiled for the TPU slices that hold them, on this machine, with no TPU (libtpu's compile-only client).

Command:
    .venv/bin/python benchmarks/tpu_compile.py                      # every shape (hours on 2 cores)
    .venv/bin/python benchmarks/tpu_compile.py --only 125m          # one shape
    .venv/bin/python benchmarks/tpu_compile.py --only 70b --scan --remat full --per-chip-batch 1  # 70B, no weight made
    .venv/bin/python benchmarks/tpu_compile.py --only 125m --max-batch   # also the largest batch per chip that fits
    .venv/bin/python benchmarks/tpu_compile.py --only 125m --remat full  # blocks recomputed in the backward pass
    .venv/bin/python benchmarks/tpu_compile.py --only 125m --scan        # the blocks as one loop (scan_layers)
    .venv/bin/python benchmarks/tpu_compile.py --only 125m --attention reference  # not splash (auto's pick)
    .venv/bin/python benchmarks/tpu_compile.py --depths                  # compile time against depth, scanned or not

Needs the `tpu` extra. Each shape is a Llama at sequence 2048 (8B at 4096 too) in bfloat16 compute, its
parameters and AdamW state sharded over every chip of the slice (fsdp), `per_chip_batch` sequences per chip. For
each it compiles the train and eval steps (`tradewind.trainer.tpu_compile.compile_for_tpu`) and reports HBM
per chip against the chip's, the compile time here, and the roofline step estimate with its MFU and tokens/s
per chip: estimates, not measurements. With `--max-batch` it doubles the per-chip batch until a compile runs
out of HBM, and reports the largest that fitted. With `--depths` it compiles one narrow Llama (d 256, sequence 512,
fsdp over a v5litepod-8) at 12 and 48 layers, unrolled and scanned (and at 12 with full remat), to show how
compile time grows with depth.

One JSON object per line, one line per shape and slice.
"""

from __future__ import annotations

import argparse
import json
import os

from tradewind.cluster.tpus import TPU_COMPILE_ENV, tpu_slice

os.environ.update({**TPU_COMPILE_ENV, **os.environ})  # before JAX starts

from tradewind.runs import TrainConfig
from tradewind.trainer.tpu_compile import compile_for_tpu

VOCAB_32K, VOCAB_128K = 32_768, 128_256
# Each shape: a model preset with its vocabulary, the sequence length, and the slices that hold it.
SHAPES = {
    "125m": ({"preset": "llama-125m", "vocab_size": VOCAB_32K}, 2048, ["v5litepod-8"]),
    "1b": ({"preset": "llama-1b", "vocab_size": VOCAB_128K}, 2048, ["v5p-8", "v6e-8"]),
    "8b": ({"preset": "llama-8b", "vocab_size": VOCAB_128K}, 2048, ["v5p-64", "v6e-64"]),
    "8b-4k": ({"preset": "llama-8b", "vocab_size": VOCAB_128K}, 4096, ["v5p-64", "v6e-64"]),
    # Llama 3 70B's shape: no weight is made on this machine, only its shapes (issue 24, item 2).
    "70b": (
        {"d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "d_ff": 28672, "vocab_size": VOCAB_128K}
        | {"tie_embeddings": False, "rope_theta": 500000.0},
        2048,
        ["v5p-128"],
    ),
}


def config_for(model: dict, seq_len: int, chips: int, per_chip_batch: int, **choices) -> TrainConfig:
    """The shape's run: `choices` are its `remat`, `scan_layers` and `attention`."""
    return TrainConfig(
        **choices,
        dataset="unused",
        model={**model, "max_seq_len": seq_len},
        seq_len=seq_len,
        batch_size=per_chip_batch * chips,
        compute_dtype="bfloat16",
        mesh={"data": 1, "fsdp": chips, "tensor": 1},
    )


def measure(name: str, tpu_type: str, per_chip_batch: int, max_batch: bool, **choices) -> dict:
    model, seq_len, _ = SHAPES[name]
    chips = tpu_slice(tpu_type).chips
    config = config_for(model, seq_len, chips, per_chip_batch, **choices)
    report = compile_for_tpu(config, model["vocab_size"], tpu_type)
    row = {
        "shape": name,
        "target": tpu_type,
        "chips": chips,
        "seq_len": seq_len,
        "per_chip_batch": per_chip_batch,
        "remat": config.remat,
        "scan_layers": config.scan_layers,
        "attention": report.attention,
        "parameters": TrainConfig(dataset="unused", model=model).model.count_params(),
        "fits": report.fits,
        "hbm_gib_per_chip": round(report.hbm_bytes / 2**30, 2),
        "hbm_gib_available": round(report.hbm_available_bytes / 2**30, 2),
        "compile_s": round(report.compile_s, 1),
        "estimated_step_s": report.step and round(report.step.seconds, 4),
        "estimated_mfu": report.step and round(report.step.mfu, 3),
        "estimated_tokens_per_s_per_chip": report.step and round(report.step.tokens_per_s_per_chip),
        "bound_by": report.step
        and max(("compute", "hbm", "network"), key=lambda part: getattr(report.step, f"{part}_s")),
    }
    if max_batch:
        largest, batch = (per_chip_batch if report.fits else 0), per_chip_batch * 2
        while report.fits:
            config = config_for(model, seq_len, chips, batch, **choices)
            report = compile_for_tpu(config, model["vocab_size"], tpu_type)
            largest, batch = (batch if report.fits else largest), batch * 2
        row["largest_per_chip_batch"] = largest
    return row


def depth_scaling() -> list[dict]:
    """Compile time and HBM per chip of one narrow Llama at 12 and 48 layers, unrolled and scanned (and at 12
    layers with full remat)."""
    rows = []
    cases = [(layers, scan, "none") for scan in (False, True) for layers in (12, 48)]
    for layers, scan, remat in [*cases, (12, False, "full"), (12, True, "full")]:
        model = {"d_model": 256, "n_layers": layers, "n_heads": 4, "vocab_size": 8192}
        report = compile_for_tpu(config_for(model, 512, 8, 1, remat=remat, scan_layers=scan), 8192, "v5litepod-8")
        rows.append(
            {
                "layers": layers,
                "scan_layers": scan,
                "remat": remat,
                "compile_s": round(report.compile_s, 1),
                "hbm_mib_per_chip": round(report.hbm_bytes / 2**20, 1),
                "all_gathers": sum(c.count for c in report.collectives if c.kind == "all-gather"),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(SHAPES), action="append", help="shapes to compile (default: all)")
    parser.add_argument("--per-chip-batch", type=int, default=4, help="sequences per chip (default 4)")
    parser.add_argument("--max-batch", action="store_true", help="also find the largest per-chip batch that fits")
    parser.add_argument("--remat", choices=["none", "full", "save_matmuls"], default="none", help="what blocks keep")
    parser.add_argument("--scan", action="store_true", help="run the blocks as one loop (scan_layers)")
    parser.add_argument("--attention", choices=["auto", "reference", "splash"], default="auto", help="the kernel")
    parser.add_argument("--depths", action="store_true", help="only the compile time against depth")
    args = parser.parse_args()
    if args.depths:
        depth_scaling()
        return
    for name in args.only or list(SHAPES):
        for tpu_type in SHAPES[name][2]:
            choices = {"remat": args.remat, "scan_layers": args.scan, "attention": args.attention}
            row = measure(name, tpu_type, args.per_chip_batch, args.max_batch, **choices)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
