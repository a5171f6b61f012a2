"""Train the run in a folder by hand:

    python -m tradewind.trainer RUN_DIR

Reads `RUN_DIR/config.json` (a `TrainConfig` as JSON, its dataset a token-cache folder) and trains as
`train` does, resuming from the folder's checkpoints if it has some; where the folder has a launcher's record
(`run.json`), the devices and processes are checked against its placement. Jobs do not come this way: the
backends call `tradewind.trainer.start:train_job`. The processes of a gang find each other through the
variables the backends set (see `tradewind.trainer.distributed`). Exit status 0 on success; 1 on error,
with a `TradewindError`'s message on stderr, or a traceback for anything unexpected.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tradewind.core import TradewindError
from tradewind.runs.config import read_train_config
from tradewind.runs.layout import RunLayout
from tradewind.runs.record import read_record
from tradewind.trainer.loop import train
from tradewind.trainer.startup import StartupClock


def main(argv: list[str]) -> int:
    """Train the run in `argv[0]`; return the exit status."""
    if len(argv) != 1:
        print("usage: python -m tradewind.trainer RUN_DIR", file=sys.stderr)
        return 2
    layout = RunLayout(Path(argv[0]))
    try:
        placement = read_record(layout.record).placement if layout.record.exists() else None
        clock = StartupClock.since_process_start()
        train(read_train_config(layout.config), layout.root, placement=placement, clock=clock)
    except TradewindError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
