"""What each memory option does to learning: the same run, the same tokens, with and without it.

Command:
    .venv/bin/python benchmarks/memory_options.py [--model demo|125m] [--steps 300] [--options bf16_moments,...]

A TPU launch that does not fit its chip turns these options on by itself (`tradewind/tools/tpu_fit.py`), so a
user should know what each costs in what is learned, not only in speed. This trains one model on Tiny
Shakespeare (byte tokens) for `--steps` steps once as it is and once with each option, one after the other in
this process, and compares the final eval loss with each option against the run without: the issue's bar is
within 1%. `remat`, `scan_layers` and `host_state` compute the same arithmetic (their own tests hold their
losses to 1e-5 on a CPU; a TPU may fuse and round them differently); `bf16_moments` rounds the moments; `adafactor`
is another update rule (a factored second moment and no momentum), run at the same learning rate. `none_again` is
the run without an option once more: on a TPU two runs of the same program need not round alike, and how far
apart they land is the scale the options' differences are read against.

`--model demo` (the default) is the demo's 1.6M-parameter model, which trains in minutes on a laptop CPU;
`--model 125m` is the 125M Llama at sequence 2048 (for a chip).

Last line: one JSON object; `value` is the largest relative final-eval-loss difference of any option, `options`
each option's final eval loss and its relative difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from tradewind.data import build_token_cache, builtin_corpus_path, load_tokenizer
from tradewind.demo import DEMO_MODEL, DEMO_TRAINING
from tradewind.runs import TrainConfig
from tradewind.trainer import train

MODELS: dict[str, dict[str, Any]] = {
    "demo": {"model": DEMO_MODEL, **DEMO_TRAINING},
    "125m": {
        "model": {"preset": "llama-125m", "max_seq_len": 2048},
        "batch_size": 16,
        "seq_len": 2048,
        "eval_batches": 8,
    },
}
OPTIONS: dict[str, dict[str, Any]] = {
    "none_again": {},  # the run without an option, again: how far two runs of the same arithmetic land apart here
    "bf16_moments": {"optimizer": {"bf16_moments": True}},
    "host_state": {"optimizer": {"host_state": True}},
    "remat_full_scan": {"remat": "full", "scan_layers": True},
    "adafactor": {"optimizer": {"type": "adafactor"}},
}
BAR = 0.01  # within 1% of the run without the option


def final_eval_loss(cache: Path, out: Path, model: str, steps: int, option: dict[str, Any]) -> float:
    fields: dict[str, Any] = {**MODELS[model], "dataset": str(cache), "steps": steps, "checkpoint": False}
    fields |= {"tensorboard": False, "eval_every": steps, "log_every": max(1, steps // 10)}
    for key, value in option.items():
        fields[key] = {**fields.get(key, {}), **value} if isinstance(value, dict) else value
    return train(TrainConfig.model_validate(fields), out).final_eval_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="demo")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma-separated, of: " + ", ".join(OPTIONS))
    args = parser.parse_args()
    names = args.options.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        build_token_cache([builtin_corpus_path("tinyshakespeare")], cache, load_tokenizer("byte"))
        baseline = final_eval_loss(cache, Path(tmp) / "baseline", args.model, args.steps, {})
        losses = {
            name: final_eval_loss(cache, Path(tmp) / name, args.model, args.steps, OPTIONS[name]) for name in names
        }
    options = {name: {"eval_loss": loss, "relative": loss / baseline - 1} for name, loss in losses.items()}
    print(f"{args.model}, {args.steps} steps: final eval loss {baseline:.4f} without an option")
    for name, figures in options.items():
        verdict = "within" if abs(figures["relative"]) <= BAR else "OUTSIDE"
        print(f"  {name}: {figures['eval_loss']:.4f} ({figures['relative']:+.2%}, {verdict} {BAR:.0%})")
    result = {
        "benchmark": "memory_options_learning",
        "model": args.model,
        "steps": args.steps,
        "baseline": round(baseline, 4),
        "value": round(max(abs(figures["relative"]) for figures in options.values()), 5),
        "options": {
            name: {key: round(value, 5) for key, value in figures.items()} for name, figures in options.items()
        },
        "unit": "relative final eval loss difference",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
