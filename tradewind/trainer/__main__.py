"""Run one training run as a process:

    python -m tradewind.trainer RUN_DIR [--coordinator HOST:PORT --num-processes N --process-id I]

Reads `RUN_DIR/config.json` (a `TrainConfig` as JSON), trains, and writes `metrics.jsonl`,
`checkpoints/` and `summary.json` into RUN_DIR, printing one line per metrics row to stdout. Exit
status 0 on success; 1 on error, with a `TradewindError`'s message on stderr, or a traceback for
anything unexpected. If RUN_DIR holds checkpoints of an unfinished run, training resumes from them.
The distributed options override the config's `distributed` section, so every process of a multi-host
job can share one config file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tradewind.core import TradewindError
from tradewind.trainer.config import read_train_config
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.loop import train


def main(argv: list[str] | None = None) -> int:
    """Train the run in RUN_DIR; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tradewind.trainer", description="Train the run in RUN_DIR.")
    parser.add_argument("run_dir", type=Path, help="the run folder; its config.json says what to train")
    parser.add_argument("--coordinator", help="host:port of process 0 (turns on jax.distributed)")
    parser.add_argument("--num-processes", type=int, help="processes in the job")
    parser.add_argument("--process-id", type=int, help="this process's index")
    args = parser.parse_args(argv)
    layout = RunLayout(args.run_dir)
    try:
        config = read_train_config(layout.config)
        if args.coordinator:
            distributed = config.distributed.model_copy(
                update={
                    "enabled": True,
                    "coordinator_address": args.coordinator,
                    "num_processes": args.num_processes,
                    "process_id": args.process_id,
                }
            )
            config = config.model_copy(update={"distributed": distributed})
        train(config, layout.root)
    except TradewindError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
