"""Does bfloat16 pay on this CPU? The demo trained in float32 and in bfloat16: speed, and how far the curves part.

Command:
    .venv/bin/python benchmarks/bf16_curve.py [--steps 200]

Issue 12's precision policy may choose bfloat16 matmuls (float32 master weights) on a CPU with AMX or
AVX512-BF16 only when it is faster and its loss curve matches float32's. This trains the demo's model and
settings on Tiny Shakespeare (byte tokens) for `--steps` steps in each dtype, one after the other in this
process, with a metrics row every step, and prints the tokens/s of each, the training-loss gap per window of
steps (mean and largest absolute difference), and the eval losses side by side.

Last line: one JSON object; value is bfloat16's tokens/s, baseline float32's, ratio their quotient, and
`final_eval_gap` bfloat16's final eval loss minus float32's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tradewind.data import build_token_cache, builtin_corpus_path, load_tokenizer
from tradewind.demo import DEMO_MODEL, DEMO_TRAINING
from tradewind.runs import TrainConfig, read_metrics
from tradewind.trainer import train

DTYPES = ("float32", "bfloat16")


def run(cache: Path, out: Path, dtype: str, steps: int):
    config = TrainConfig(
        dataset=str(cache),
        model=DEMO_MODEL,
        steps=steps,
        compute_dtype=dtype,
        checkpoint=False,
        tensorboard=False,
        **{**DEMO_TRAINING, "log_every": 1},
    )
    summary = train(config, out)
    return summary, read_metrics(out / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        build_token_cache([builtin_corpus_path("tinyshakespeare")], cache, load_tokenizer("byte"))
        results = {dtype: run(cache, Path(tmp) / dtype, dtype, args.steps) for dtype in DTYPES}

    f32, bf16 = results["float32"][0], results["bfloat16"][0]
    losses = {
        dtype: {row.step: row.loss for row in rows if row.loss is not None} for dtype, (_, rows) in results.items()
    }
    steps = sorted(set(losses["float32"]) & set(losses["bfloat16"]))
    print(f"tokens/s: float32 {f32.mean_tokens_per_s:,.0f}, bfloat16 {bf16.mean_tokens_per_s:,.0f}")
    window = max(1, args.steps // 4)
    for start in range(0, args.steps, window):
        gaps = [abs(losses["bfloat16"][s] - losses["float32"][s]) for s in steps if start < s <= start + window]
        if gaps:
            print(f"steps {start + 1}-{start + window}: loss gap mean {sum(gaps) / len(gaps):.4f}, max {max(gaps):.4f}")
    evals = {
        dtype: [(row.step, row.eval_loss) for row in rows if row.eval_loss is not None]
        for dtype, (_, rows) in results.items()
    }
    for (step, a), (_, b) in zip(evals["float32"], evals["bfloat16"], strict=True):
        print(f"eval at step {step}: float32 {a:.4f}, bfloat16 {b:.4f}")
    result = {
        "benchmark": "bf16_curve_tokens_per_s",
        "value": round(bf16.mean_tokens_per_s, 1),
        "baseline": round(f32.mean_tokens_per_s, 1),
        "ratio": round(bf16.mean_tokens_per_s / f32.mean_tokens_per_s, 3),
        "final_eval_gap": round(bf16.final_eval_loss - f32.final_eval_loss, 4),
        "unit": "tokens/s",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
