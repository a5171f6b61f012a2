"""How long `tradewind --help` takes, against a bare `python -c pass` in the same run.

Command:
    .venv/bin/python benchmarks/startup.py

Prints readable lines, then one JSON line: value = median seconds of `tradewind --help`, baseline = median
seconds of a bare interpreter start, ratio = baseline / value (higher is better; 1.0 would mean the CLI
costs nothing beyond starting Python). Target: `tradewind --help` well under one second.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

REPEATS = 15


def median_seconds(command: list[str]) -> float:
    subprocess.run(command, capture_output=True, check=True)  # warm the file cache
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    baseline = median_seconds([sys.executable, "-c", "pass"])
    value = median_seconds([sys.executable, "-m", "tradewind", "--help"])
    server_import = median_seconds([sys.executable, "-c", "import tradewind.server"])
    print(f"python -c pass:            {baseline * 1000:7.1f} ms")
    print(f"tradewind --help:          {value * 1000:7.1f} ms")
    print(f"import tradewind.server:   {server_import * 1000:7.1f} ms (MCP SDK and pydantic, no JAX)")
    print(
        json.dumps(
            {
                "benchmark": "cli_help_startup",
                "value": round(value, 4),
                "baseline": round(baseline, 4),
                "ratio": round(baseline / value, 3),
                "unit": "s",
            }
        )
    )


if __name__ == "__main__":
    main()
