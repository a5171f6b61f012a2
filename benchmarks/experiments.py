"""Experiments as an agent runs them: their wall time against their training, the token budget that matches a
60 s run, experiments per hour at that budget, and how often the ledger's rule would call two runs of one config
different.

Command:
    .venv/bin/python benchmarks/experiments.py [--budget-s 60] [--runs 6]

A fresh workspace on the local backend; Tiny Shakespeare tokenized first, untimed. Every experiment is the
demo's model (1.3M parameters, batch 16, sequence 128) through the tools' Python API, launched and awaited one
at a time, alone on the machine:

1. Calibration (issue 14): one run with `time_budget_s` (`--budget-s`). Its wall time is split into training
   and the rest (below). The tokens it trained, in whole steps, become the token budget: the same work as
   `--budget-s` of training on this machine as it is now (idle, for the figures that count).
2. Token budget (issue 27): `--runs` runs with that `token_budget`: the first launched as the calibration run
   was, the rest with `rerun_baseline` (new seeds), each awaited before the next. Experiments per hour =
   3600 / their mean wall.
3. Decision error (issue 27): for every choice of 3 of those runs as a baseline and its reruns, and one of the
   others as a candidate of the same config, whether the ledger's rule (`tradewind.tools.noise`) calls the
   candidate's delta beyond noise; the error rate is the share called so (target at most 5%). The same count
   for a bare 2-sigma rule, and for the baseline with every other run behind it, are printed beside it.

Per experiment, `wall` runs from the `launch_training` call to `wait_for_run` returning the finished run
(what an agent waits), and `train_s` is the summary's seconds of training (the updates and the loop's
periodic evaluations). Overhead fraction = 1 - train_s / wall. The overhead is broken down as:

- launch: the `launch_training` call itself (config, data check, limits, submit);
- process start: `launch_training` returning to the record's started_at (the job's process start, JAX
  import, device set-up);
- compile: the summary's `compile_s`;
- val: the summary's `val_s` (the final evaluation on the fixed val tokens);
- in-run rest: the summary's `wall_s` less compile, train and val (model set-up, the first evaluation,
  the final checkpoint, writing the summary);
- end: what remains of the wall (the process's exit, `wait_for_run` noticing, the clock gap between
  the record's started_at and the trainer's own start).

Last line: one JSON object with the calibration run, the token budget, experiments per hour at it, the
decision error rates, the targets and `met`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from tradewind.demo import DEMO_MODEL, DEMO_TRAINING
from tradewind.runs.metrics import TrainSummary
from tradewind.runs.record import read_record
from tradewind.tools import (
    LaunchTrainingRequest,
    RerunBaselineRequest,
    RunInfo,
    RunRequest,
    TokenizeDatasetRequest,
    ToolContext,
    WaitForRunRequest,
    get_run,
    launch_training,
    rerun_baseline,
    tokenize_dataset,
    wait_for_run,
)
from tradewind.tools.noise import MIN_RERUNS, pooled

DATASET = "builtin:tinyshakespeare"
TARGET_OVERHEAD = 0.15
TARGET_PER_HOUR = 50.0
TARGET_DECISION_ERROR = 0.05


def run_experiment(ctx: ToolContext, launch) -> dict:
    """Launch one run (`launch()` returns it), wait for it, and split its wall time into training and the rest."""
    start = time.perf_counter()
    run: RunInfo = launch()
    launch_s, launched_at = time.perf_counter() - start, datetime.now(UTC)
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run.run_id, timeout_s=3600))
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
        "tokens_seen": summary.tokens_seen,
        "val_bpb": summary.val_bpb,
        "load": os.getloadavg()[0] / (os.cpu_count() or 1),
        "breakdown_s": {
            "launch": round(launch_s, 2),
            "process_start": round(process_start_s, 2),
            "compile": round(summary.compile_s, 2),
            "val": round(summary.val_s or 0.0, 2),
            "in_run_rest": round(in_run_rest_s, 2),
            "end": round(wall - launch_s - process_start_s - summary.wall_s, 2),
        },
    }


def launched(ctx: ToolContext, run_id: str) -> RunInfo:
    return get_run(ctx, RunRequest(run_id=run_id))


def demo_run(ctx: ToolContext, **budget) -> RunInfo:
    return launch_training(ctx, LaunchTrainingRequest(dataset=DATASET, model=DEMO_MODEL, **DEMO_TRAINING, **budget))


def decision_errors(values: list[float]) -> dict:
    """How often runs of one config are called different: every choice of `MIN_RERUNS` + 1 of `values` as a baseline
    and its reruns, with each other value as a candidate; by the ledger's rule, by a bare 2-sigma rule, and with
    every other value behind the baseline (leave one out)."""
    ledger = bare = decisions = 0
    for chosen in itertools.combinations(range(len(values)), MIN_RERUNS + 1):
        baseline = [values[i] for i in chosen]
        noise = pooled([baseline])
        for candidate in (values[i] for i in range(len(values)) if i not in chosen):
            delta = abs(candidate - statistics.fmean(baseline))
            decisions += 1
            ledger += delta > noise.threshold(1, len(baseline))
            bare += delta > 2 * noise.sigma
    left_out = 0
    for index, candidate in enumerate(values):
        rest = values[:index] + values[index + 1 :]
        left_out += abs(candidate - statistics.fmean(rest)) > pooled([rest]).threshold(1, len(rest))
    return {
        "decisions": decisions,
        "error_rate": round(ledger / decisions, 4),
        "error_rate_bare_2_sigma": round(bare / decisions, 4),
        "error_rate_leave_one_out": round(left_out / len(values), 4),
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
    parser.add_argument("--budget-s", type=float, default=60.0, help="the calibration run's time_budget_s (60)")
    parser.add_argument("--runs", type=int, default=8, help="runs at the matching token budget (default 8)")
    args = parser.parse_args()
    if args.runs <= MIN_RERUNS + 1:
        parser.error(f"--runs must be more than {MIN_RERUNS + 1}: a baseline and {MIN_RERUNS} reruns, and a candidate")

    root = Path(tempfile.mkdtemp(prefix="tradewind-experiments-"))
    try:
        ctx = ToolContext.open(root / "workspace")
        (ctx.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
        tokenize_dataset(ctx, TokenizeDatasetRequest(input=DATASET))  # untimed: the first launch would do it
        print(f"on {os.cpu_count()} CPUs, demo model; calibration: time_budget_s {args.budget_s:g}")
        calibration = run_experiment(ctx, lambda: demo_run(ctx, time_budget_s=args.budget_s))
        print("time   " + describe(calibration), flush=True)
        token_budget = calibration["tokens_seen"]
        print(f"token budget: {token_budget:,} tokens ({calibration['steps']} steps)")
        first = run_experiment(ctx, lambda: demo_run(ctx, token_budget=token_budget))
        runs = [first]
        print("tokens " + describe(first), flush=True)
        rerun = RerunBaselineRequest(run_id=first["run_id"], count=1)
        for _ in range(args.runs - 1):
            runs.append(run_experiment(ctx, lambda: launched(ctx, rerun_baseline(ctx, rerun).run_ids[0])))
            print("rerun  " + describe(runs[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    per_hour = 3600 / statistics.mean(run["wall_s"] for run in runs)
    values = [run["val_bpb"] for run in runs]
    errors = decision_errors(values)
    overhead = calibration["overhead_fraction"]
    met = overhead <= TARGET_OVERHEAD and per_hour >= TARGET_PER_HOUR and errors["error_rate"] <= TARGET_DECISION_ERROR
    print(f"calibration overhead: {overhead:.1%}")
    print(f"experiments per hour at {token_budget:,} tokens: {per_hour:.1f}")
    print(f"val_bpb over {len(values)} seeds: mean {statistics.fmean(values):.4f}, sd {statistics.stdev(values):.4f}")
    print(
        f"decision error: {errors['error_rate']:.1%} of {errors['decisions']} (bare 2 sigma: "
        f"{errors['error_rate_bare_2_sigma']:.1%}; leave one out: {errors['error_rate_leave_one_out']:.1%})"
    )
    print(
        json.dumps(
            {
                "benchmark": "experiments",
                "value": errors["error_rate"],
                "unit": "share of identical-config pairs called different",
                "budget_s": args.budget_s,
                "calibration": calibration,
                "token_budget": token_budget,
                "experiments_per_hour": round(per_hour, 1),
                "val_bpb_sd": round(statistics.stdev(values), 5),
                **errors,
                "targets": {
                    "overhead_fraction": TARGET_OVERHEAD,
                    "experiments_per_hour": TARGET_PER_HOUR,
                    "error_rate": TARGET_DECISION_ERROR,
                },
                "met": met,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
