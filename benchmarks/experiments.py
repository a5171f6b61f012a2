"""How much of an experiment's wall time is training: budgeted runs launched and awaited as an agent does.

Command:
    .venv/bin/python benchmarks/experiments.py [--experiments 3] [--budget-s 60]

Issue 14 asks that a fixed-budget experiment (`time_budget_s`) spend its time training: on 2 CPU cores with
a 60 s budget, at most 15% of the wall time outside training (process start, compilation, evaluation,
bookkeeping) and at least 50 experiments per hour. This opens a fresh workspace on the local backend,
tokenizes Tiny Shakespeare (untimed), then runs `--experiments` experiments one after the other, each the
demo's model (1.3M parameters, batch 16, sequence 128) with a `time_budget_s` budget, through the tools'
Python API: `launch_training`, then `wait_for_run` until it ends. The workspace's runs share a persistent
XLA compilation cache, so the first experiment compiles cold and the rest warm; both are reported.

Per experiment, `wall` runs from the `launch_training` call to `wait_for_run` returning the finished run
(what an agent waits), and `train_s` is the summary's seconds of training (the updates and the loop's
periodic evaluations). Overhead fraction = 1 - train_s / wall; experiments per hour = 3600 / mean wall.
The overhead is broken down as:

- launch: the `launch_training` call itself (config, data check, limits, submit);
- process start: `launch_training` returning to the record's started_at (the job's process start, JAX
  import, device set-up);
- compile: the summary's `compile_s`;
- val: the summary's `val_s` (the final evaluation on the fixed val tokens);
- in-run rest: the summary's `wall_s` less compile, train and val (model set-up, the first evaluation,
  the final checkpoint, writing the summary);
- end: what remains of the wall (the process's exit, `wait_for_run` noticing, the clock gap between
  the record's started_at and the trainer's own start).

Last line: one JSON object with `value` = `overhead_fraction` (mean), `overhead_fraction_warm` (mean after the
first), `experiments_per_hour`, the targets, `met`, and the per-experiment figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from tradewind.demo import DEMO_MODEL, DEMO_TRAINING
from tradewind.tools import (
    LaunchTrainingRequest,
    TokenizeDatasetRequest,
    ToolContext,
    WaitForRunRequest,
    launch_training,
    tokenize_dataset,
    wait_for_run,
)
from tradewind.trainer.metrics import TrainSummary
from tradewind.trainer.record import read_record

DATASET = "builtin:tinyshakespeare"
TARGET_OVERHEAD = 0.15
TARGET_PER_HOUR = 50.0


def run_experiment(ctx: ToolContext, index: int, budget_s: float) -> dict:
    """Launch one budgeted run, wait for it, and split its wall time into training and the rest."""
    start = time.perf_counter()
    run = launch_training(
        ctx,
        LaunchTrainingRequest(
            dataset=DATASET,
            model=DEMO_MODEL,
            time_budget_s=budget_s,
            note=f"benchmark experiment {index}",
            **DEMO_TRAINING,
        ),
    )
    launch_s, launched_at = time.perf_counter() - start, datetime.now(UTC)
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run.run_id, timeout_s=max(600, 10 * budget_s)))
    wall = time.perf_counter() - start
    if done.status != "SUCCEEDED":
        raise SystemExit(f"run {run.run_id} ended {done.status}: {done.reason}\n" + "\n".join(done.log_tail or []))
    folder = ctx.workspace.run_dir(run.run_id)
    record = read_record(folder / "run.json")
    summary = TrainSummary.model_validate_json((folder / "summary.json").read_text())
    process_start_s = (datetime.fromisoformat(record.started_at) - launched_at).total_seconds()
    in_run_rest_s = summary.wall_s - summary.compile_s - summary.train_s - (summary.val_s or 0.0)
    return {
        "run_id": run.run_id,
        "wall_s": round(wall, 2),
        "train_s": round(summary.train_s, 2),
        "overhead_fraction": round(1 - summary.train_s / wall, 4),
        "steps": summary.steps,
        "val_bpb": summary.val_bpb,
        "breakdown_s": {
            "launch": round(launch_s, 2),
            "process_start": round(process_start_s, 2),
            "compile": round(summary.compile_s, 2),
            "val": round(summary.val_s or 0.0, 2),
            "in_run_rest": round(in_run_rest_s, 2),
            "end": round(wall - launch_s - process_start_s - summary.wall_s, 2),
        },
    }


def describe(result: dict) -> str:
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in result["breakdown_s"].items())
    return (
        f"{result['run_id']}: wall {result['wall_s']:.1f}s, train {result['train_s']:.1f}s "
        f"({result['steps']} steps, val_bpb {result['val_bpb']:.3f}), overhead {result['overhead_fraction']:.1%} "
        f"[{parts}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=3, help="experiments in sequence (default 3)")
    parser.add_argument("--budget-s", type=float, default=60.0, help="time_budget_s of each (default 60)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="tradewind-experiments-"))
    try:
        ctx = ToolContext.open(root / "workspace")
        (ctx.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
        tokenize_dataset(ctx, TokenizeDatasetRequest(input=DATASET))  # untimed: the first launch would do it
        print(f"{args.experiments} experiments of {args.budget_s:g}s on {os.cpu_count()} CPUs, demo model")
        results = []
        for index in range(args.experiments):
            results.append(run_experiment(ctx, index, args.budget_s))
            print(("cold  " if index == 0 else "warm  ") + describe(results[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    overhead = statistics.mean(r["overhead_fraction"] for r in results)
    warm = [r["overhead_fraction"] for r in results[1:]]
    overhead_warm = statistics.mean(warm) if warm else None
    per_hour = 3600 / statistics.mean(r["wall_s"] for r in results)
    mean_breakdown = {
        name: round(statistics.mean(r["breakdown_s"][name] for r in results), 2) for name in results[0]["breakdown_s"]
    }
    met = overhead <= TARGET_OVERHEAD and per_hour >= TARGET_PER_HOUR
    print(f"overhead: mean {overhead:.1%}" + (f", warm {overhead_warm:.1%}" if warm else ""))
    print(f"experiments per hour: {per_hour:.1f}")
    print("mean overhead breakdown (s): " + ", ".join(f"{k} {v:.1f}" for k, v in mean_breakdown.items()))
    print(
        json.dumps(
            {
                "benchmark": "experiments",
                "value": round(overhead, 4),
                "unit": "fraction of wall time not training",
                "budget_s": args.budget_s,
                "experiments": args.experiments,
                "overhead_fraction": round(overhead, 4),
                "overhead_fraction_warm": None if overhead_warm is None else round(overhead_warm, 4),
                "experiments_per_hour": round(per_hour, 1),
                "targets": {"overhead_fraction": TARGET_OVERHEAD, "experiments_per_hour": TARGET_PER_HOUR},
                "met": met,
                "mean_breakdown_s": mean_breakdown,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    main()
