"""The main job: an agent's whole loop over MCP, from raw text to a training report.

Starts `tradewind serve` as a stdio subprocess, connects to it with the MCP client, and calls the tools
in order on the bundled Tiny Shakespeare corpus: tokenize, launch training, wait (with progress), read
metrics, profile, summarize. Prints each call and its key result; the last line is the report's path.

Command:
    tradewind demo [--workspace DIR] [--steps N]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# About 1.3M parameters: small enough that the whole demo takes about a minute (63 s on an idle 2-core CPU),
# large enough that the held-out loss falls well below its starting value.
DEMO_MODEL = {"d_model": 160, "n_layers": 4, "n_heads": 4, "max_seq_len": 128}
DEMO_TRAINING = {"batch_size": 16, "seq_len": 128, "eval_every": 50, "eval_batches": 8, "log_every": 10}


class DemoFailed(RuntimeError):
    """A tool call of the demo returned an error."""


class DemoSession:
    """Calls tools on a connected client, printing each call and what it returned."""

    def __init__(self, client: Client, console: Console):
        self.client = client
        self.console = console

    async def call(self, name: str, arguments: dict[str, Any], progress_callback=None) -> dict[str, Any]:
        shown = json.dumps(arguments, separators=(", ", ": "))
        self.console.print(f"[bold cyan]→ {name}[/] {shown}", highlight=False)
        result = await self.client.call_tool(name, arguments, progress_callback=progress_callback)
        if result.is_error:
            message = " ".join(block.text for block in result.content if hasattr(block, "text"))
            raise DemoFailed(f"{name} failed: {message}")
        return result.structured_content

    def say(self, text: str) -> None:
        self.console.print(f"  [green]←[/] {text}", highlight=False)


async def run_demo(workspace: Path, steps: int, console: Console) -> str:
    """Run the loop against a `tradewind serve` subprocess; returns the report's path."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tradewind", "serve", "--workspace", str(workspace), "--log-level", "WARNING"],
        env=dict(os.environ),
    )
    async with Client(server) as client:
        session = DemoSession(client, console)
        tools = await client.list_tools()
        session.say(f"connected to tradewind serve over stdio; {len(tools.tools)} tools")

        dataset = await session.call("tokenize_dataset", {"input": "builtin:tinyshakespeare"})
        session.say(
            f"dataset {dataset['dataset_id']}: {dataset['tokens']['train']:,} train / {dataset['tokens']['val']:,} "
            f"val tokens, vocab {dataset['vocab_size']}" + (" (reused)" if dataset["reused"] else "")
        )

        run = await session.call(
            "launch_training", {"dataset": dataset["dataset_id"], "model": DEMO_MODEL, "steps": steps, **DEMO_TRAINING}
        )
        run_id = run["run_id"]
        session.say(f"run {run_id} is {run['status']} (pid {run['pid'] or 'starting'})")

        with Progress(
            TextColumn("  training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("", total=steps)

            async def show(progress: float, total: float | None, message: str | None) -> None:
                bar.update(task, completed=progress, total=total, description=message or "")

            while True:
                run = await session.call("wait_for_run", {"run_id": run_id, "timeout_s": 600}, progress_callback=show)
                if not run["timed_out"]:
                    break
        if run["status"] != "SUCCEEDED":
            tail = "\n".join(run["log_tail"])
            raise DemoFailed(f"run {run_id} ended {run['status']}: {run['reason']}\n{tail}")
        summary = run["summary"]
        session.say(
            f"{run['status']} after {summary['wall_s']:.0f} s: {summary['parameters']:,} parameters, "
            f"eval loss {summary['first_eval_loss']:.3f} → {summary['final_eval_loss']:.3f}"
        )

        metrics = await session.call("read_metrics", {"run_id": run_id, "series": ["eval_loss"]})
        evals = metrics["series"]["eval_loss"]
        session.say(
            f"{metrics['summary']['rows']} metric rows; eval loss by step: "
            + ", ".join(f"{step}: {loss:.3f}" for step, loss in zip(evals["steps"], evals["values"], strict=True))
        )

        profile = await session.call("profile_run", {"run_id": run_id, "steps": 5})
        session.say(
            f"compile {profile['compile_s']:.2f} s, step {profile['mean_step_s'] * 1000:.0f} ms, "
            f"{profile['tokens_per_s']:,.0f} tokens/s; trace in {profile['trace_dir']}"
        )

        report = await session.call("summarize_report", {"run_id": run_id})
        session.say(f"report with {len(report['plot_paths'])} plot(s) beside it")
        return report["report_path"]
