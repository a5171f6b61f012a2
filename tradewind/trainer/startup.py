"""Where a run's start-up goes: the seconds of each stage, from the process's start to its first update.

Before its first update a run waits on Python and its imports, opening the devices (seconds, on a TPU), reading
the dataset, building the model, compiling its steps (or loading them from the compile cache) and the first
evaluation. `StartupClock` times each stage as it ends; the loop prints them in the run's log after the first
update and keeps them in the summary, so that a slow start says where its time went.

Example:
    clock = StartupClock.since_process_start()
    ...  # open the devices
    clock.mark("devices")
    print(clock.describe())  # "first update 14.2 s after the start (imports 3.1 s, devices 7.6 s, ...)"
"""

from __future__ import annotations

import os
import time

from tradewind.cluster.jobs import JOB_START_ENV
from tradewind.cluster.process import process_age


class StartupClock:
    """Seconds per start-up stage, each measured from the end of the one before."""

    def __init__(self, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.last = self.start
        self.stages: dict[str, float] = {}

    @classmethod
    def since_process_start(cls) -> StartupClock:
        """A clock whose first stage began when the job's process did (a job's Python start-up and imports count):
        this process, or the job's own where it runs in a warm process (`JOB_START_ENV`)."""
        age = time.time() - float(os.environ[JOB_START_ENV]) if JOB_START_ENV in os.environ else process_age()
        return cls(time.perf_counter() - max(age, 0.0))

    def mark(self, stage: str) -> None:
        """End `stage` now: it took the seconds since the previous stage ended."""
        now = time.perf_counter()
        self.stages[stage] = round(now - self.last, 3)
        self.last = now

    @property
    def total_s(self) -> float:
        """Seconds from the start to the end of the last stage."""
        return round(self.last - self.start, 3)

    def describe(self) -> str:
        stages = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.stages.items())
        return f"first update {self.total_s:.1f} s after the start ({stages})"
