"""Run (or plan) a pipeline file with the step executor, as a command or as a job.

Command:
    python -m tradewind.cluster.pipeline experiments/pipeline_tiny.py --workspace ~/.tradewind [--force] [--dry-run]

Prints one JSON line per step (`name`, `output_path`, `action`, ...) and exits 1 when a step fails.
The `run_pipeline` tool submits exactly this command as a job on the local backend, so the steps
(training included) run outside the MCP server's process.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tradewind.cluster.executor import Executor, StepBusyError, StepFailedError, load_pipeline
from tradewind.core import ConfigError


def steps_dir(workspace_root: str | Path) -> Path:
    """Where the executor keeps step outputs in a workspace."""
    return Path(workspace_root).expanduser().resolve() / "steps"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tradewind.cluster.pipeline", description=__doc__)
    parser.add_argument("pipeline", help="a Python file defining `steps`")
    parser.add_argument("--workspace", required=True, help="workspace root; outputs go to <workspace>/steps")
    parser.add_argument("--force", action="store_true", help="rerun steps that failed before")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    try:
        steps = load_pipeline(args.pipeline)
        executor = Executor(steps_dir(args.workspace))
        if args.dry_run:
            results = executor.plan(steps, force=args.force)
        else:
            results = executor.run(
                steps,
                force=args.force,
                progress=lambda done, total, message: print(f"[{done}/{total}] {message}", file=sys.stderr, flush=True),
            )
    except (StepFailedError, StepBusyError, ConfigError) as error:
        print(f"pipeline failed: {error}", file=sys.stderr)
        return 1
    for result in results:
        print(result.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
