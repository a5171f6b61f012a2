"""Tradewind on this host's TPU, as an agent drives it: one MCP stdio session (`tradewind serve`) that launches a
model on the local chip and launches it again at once (in the workspace's warm process, which kept the chip and
the compiled steps), then once more in a new process (the warm process released: the steps come from the compile
cache); reads its metrics, profiles, samples, exports it and writes its report; kills a small run and resumes it,
and runs a two-trial sweep whose trials take the chip in turn; then a 1B config that does not fit the chip as
given, which the launch trains with the least costly memory change that fits (it says which) for a few steps.

Command (on a TPU VM; `scripts/tpu-check` runs it):
    python benchmarks/tpu_host.py --workspace DIR [--model 125m] [--steps 30] [--json-out FILE]

Prints readable lines, then one JSON line: the session's figures, `first_step_s` cold, warm and from the compile
cache (their ratios, measured in one run, are the warm process's and the cache's effects) with the runs' own
start-up stages (`startup_s`), and the 1B run with the change the launch made. Target: the second launch reaches
its first step within 15 s; the 1B config trains on the chip.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

MODELS = {  # the shapes: Llama at sequence 2048, vocabulary 32768
    "125m": {"model": {"preset": "llama-125m", "max_seq_len": 2048, "vocab_size": 32768}, "batch_size": 16},
    "tiny": {"model": {"d_model": 128, "n_layers": 2, "n_heads": 4, "max_seq_len": 256}, "batch_size": 8},
}
SEQ_LEN = {"125m": 2048, "tiny": 256}
ONE_B = {"model": {"preset": "llama-1b", "vocab_size": 128256}, "batch_size": 4, "seq_len": 2048}


class Figures(dict):
    """The session's figures, each printed (to stderr) as it is measured: a session cut short still shows them."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        print(json.dumps({key: value}, default=str), file=sys.stderr, flush=True)


async def call(client: Client, name: str, arguments: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    with anyio.fail_after(timeout_s):
        result = await client.call_tool(name, arguments)
    if result.is_error:
        raise RuntimeError(f"{name}: {' '.join(getattr(block, 'text', '') for block in result.content)}")
    return result.structured_content


async def reach_step(client: Client, run_id: str, step: int, timeout_s: float = 600) -> None:
    """Wait until the run has logged `step` (it logs every step)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        info = await call(client, "get_run", {"run_id": run_id})
        if info["step"] >= step:
            return
        if info["status"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"run {run_id} {info['status']}: {info.get('reason')}")
        await anyio.sleep(0.25)
    raise TimeoutError(f"run {run_id} did not log step {step} within {timeout_s} s")


async def launch_and_wait(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    launched = time.perf_counter()
    run = await call(client, "launch_training", arguments)
    await reach_step(client, run["run_id"], 1)
    first = time.perf_counter() - launched
    done = await call(client, "wait_for_run", {"run_id": run["run_id"], "timeout_s": 900}, timeout_s=960)
    if done["status"] != "SUCCEEDED":
        raise RuntimeError(f"run {run['run_id']} {done['status']}: {done.get('reason')} {done.get('log_tail')}")
    summary = done["summary"]
    startup = {"first_update_s": summary["first_update_s"], "startup_s": summary["startup_s"]}
    return {"run": done, "first_step_s": first, "wall_s": time.perf_counter() - launched, **startup}


def run_figures(done: dict[str, Any]) -> dict[str, Any]:
    """What a finished run says of its speed on the chip."""
    summary = done["summary"]
    return {
        "run_id": done["run_id"],
        "accelerator": done["accelerator"],
        "platform": done["platform"],
        "tokens_per_s": summary["mean_tokens_per_s"],
        "mfu": summary["mfu"],
        "peak_flops_source": summary["peak_flops_source"],
        "compile_s": summary["compile_s"],
    }


async def killed_and_resumed(client: Client, arguments: dict[str, Any], timeout_s: float = 300) -> dict[str, Any]:
    """A long run cancelled once its checkpoint at step 10 is complete on disk, then continued from its last
    complete checkpoint for 10 more steps, as a new run. (A tiny model's steps take milliseconds: it would end, or
    be cancelled before its first checkpoint is written, if the cancel came at a step count.)"""
    killed = await call(client, "launch_training", {**arguments, "steps": 5000, "checkpoints": {"every_steps": 10}})
    checkpoints = Path(killed["run_dir"]) / "checkpoints"
    with anyio.fail_after(timeout_s):
        while not (checkpoints / "10").is_dir():  # orbax renames a checkpoint to its step once it is complete
            await anyio.sleep(0.1)
    await call(client, "cancel_run", {"run_id": killed["run_id"]})
    last = max(int(folder.name) for folder in checkpoints.iterdir() if folder.name.isdigit())
    resumed = (await launch_and_wait(client, {"resume_from": killed["run_id"], "steps": last + 10}))["run"]
    summary = resumed["summary"]
    return {"killed": killed["run_id"], "resumed": resumed["run_id"], "platform": resumed["platform"]} | {
        "resumed_from_step": summary["resumed_from_step"],
        "steps": summary["steps"],
    }


async def sweep_in_turn(client: Client, arguments: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """A two-trial sweep on the chip: its trials take the chip in turn (no two train at once)."""
    base = {**arguments, "steps": 10, "checkpoint": False}
    sweep = await call(client, "launch_sweep", {"base": base, "space": {"optimizer.learning_rate": [1e-3, 3e-3]}})
    deadline = time.perf_counter() + timeout_s
    while (state := await call(client, "get_sweep", {"sweep_id": sweep["sweep_id"]}))["status"] == "running":
        if time.perf_counter() > deadline:
            raise TimeoutError(f"sweep {sweep['sweep_id']} still running after {timeout_s} s")
        await anyio.sleep(1)
    runs = [await call(client, "get_run", {"run_id": trial["run_id"]}) for trial in state["trials"]]
    spans = sorted((run["started_at"], run["ended_at"]) for run in runs)
    return {
        "status": state["status"],
        "counts": state["counts"],
        "platforms": [run["platform"] for run in runs],
        "in_turn": all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)),
    }


async def agent_session(workspace: Path, model: str, steps: int, train_1b: bool = True) -> dict[str, Any]:
    """Everything an agent does with a run on this host's chip, over MCP stdio, with the seconds each took; with
    `train_1b`, the 1B config is trained for a few steps, fitted to the chip by the launch."""
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "tradewind", "serve", "--workspace", str(workspace)], env=dict(os.environ)
    )
    arguments = {"dataset": "builtin:tinyshakespeare", "steps": steps, "log_every": 1, "eval_every": steps}
    arguments |= {**MODELS[model], "seq_len": SEQ_LEN[model], "checkpoints": {"every_steps": steps}}
    figures = Figures()
    async with Client(server) as client:
        cold = await launch_and_wait(client, arguments)  # accelerator: the host's TPU by default
        run_id = cold["run"]["run_id"]
        figures["run"] = run_figures(cold["run"])
        figures["cold"] = {key: value for key, value in cold.items() if key != "run"}
        warm = await launch_and_wait(client, arguments)  # the same config again: in the warm process
        figures["warm"] = {key: value for key, value in warm.items() if key != "run"}
        release(workspace)
        from_cache = await launch_and_wait(client, arguments)  # again, in a new process: from the compile cache
        figures["from_cache"] = {key: value for key, value in from_cache.items() if key != "run"}
        started = time.perf_counter()
        metrics = await call(client, "read_metrics", {"run_id": run_id})
        figures["read_metrics"] = {"s": time.perf_counter() - started, "mean_mfu": metrics["summary"]["mean_mfu"]}
        started = time.perf_counter()
        profile = await call(client, "profile_run", {"run_id": run_id, "steps": 3})
        figures["profile"] = {
            "s": time.perf_counter() - started,
            "backend": profile["backend"],
            "verdict": profile["diagnosis"]["verdict"],
            "top_ops": [op["name"] for op in profile["top_ops"][:5]],
            "trace": profile["trace_dir"],
        }
        started = time.perf_counter()
        sample = await call(client, "sample_text", {"run_id": run_id, "prompt": "ROMEO:", "max_tokens": 32})
        figures["sample"] = {"s": time.perf_counter() - started, "device": sample["device"], "text": sample["text"]}
        started = time.perf_counter()
        export = await call(client, "export_model", {"run_id": run_id})
        figures["export"] = {"s": time.perf_counter() - started, "device": export["device"], "files": export["files"]}
        started = time.perf_counter()
        report = await call(client, "summarize_report", {"run_id": run_id})
        figures["report"] = {"s": time.perf_counter() - started, "report": report["report_path"]}
        small = {**arguments, **MODELS["tiny"], "seq_len": SEQ_LEN["tiny"]}  # quick runs, for what is not speed
        figures["killed_and_resumed"] = await killed_and_resumed(client, small)
        figures["sweep"] = await sweep_in_turn(client, small)
        if train_1b:  # the launch fits it to the chip with a memory change, says which, and it trains
            few = {"steps": 3, "log_every": 1, "eval_every": 3, "eval_batches": 1, "checkpoint": False}
            fitted = await launch_and_wait(client, {**arguments, **ONE_B, **few})
            note = fitted["run"]["accelerator_note"]
            figures["fitted_1b"] = {**run_figures(fitted["run"]), "first_step_s": fitted["first_step_s"], "note": note}
        status = await call(client, "cluster_status", {})
        figures["compile_cache"] = status["compile_cache"]
    release(workspace)  # the chip is free again for what comes after
    return figures


def release(workspace: Path) -> None:
    """End the workspace's warm process (`tradewind cluster release`): the next run starts a new process."""
    command = [sys.executable, "-m", "tradewind", "cluster", "release", "--workspace", str(workspace)]
    subprocess.run(command, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="125m")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    figures = anyio.run(agent_session, args.workspace, args.model, args.steps)
    run, cold, warm = figures["run"], figures["cold"], figures["warm"]
    print(
        f"{args.model} on {run['accelerator']} ({run['platform']}): {run['tokens_per_s'] or 0:,.0f} tokens/s, "
        f"MFU {run['mfu'] or 0:.1%} ({run['peak_flops_source']})"
    )
    from_cache = figures["from_cache"]
    print(
        f"first step: cold {cold['first_step_s']:.1f} s, warm {warm['first_step_s']:.1f} s (target <= 15 s), "
        f"new process from the compile cache {from_cache['first_step_s']:.1f} s"
    )
    print(f"warm start-up in the run: {warm['startup_s']}; from the cache: {from_cache['startup_s']}")
    print(
        f"profile {figures['profile']['s']:.1f} s ({figures['profile']['verdict']}), sample "
        f"{figures['sample']['s']:.1f} s on {figures['sample']['device']}, export {figures['export']['s']:.1f} s"
    )
    if "fitted_1b" in figures:
        fitted = figures["fitted_1b"]
        print(f"1B: {fitted['note']}; {fitted['tokens_per_s'] or 0:,.0f} tokens/s, MFU {fitted['mfu'] or 0:.1%}")
    result = {
        "benchmark": "tpu_host",
        "model": args.model,
        "value": warm["first_step_s"],
        "baseline": cold["first_step_s"],
        "ratio": cold["first_step_s"] / warm["first_step_s"],
        **figures,
    }
    line = json.dumps(result, default=str)
    print(line)
    if args.json_out:
        args.json_out.write_text(line + "\n")


if __name__ == "__main__":
    main()
