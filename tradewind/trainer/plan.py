"""How many updates a run makes and the learning rate of each: `StepPlan`, and `TimeBudget`, which ends a run
when its wall-clock seconds are spent (and, for a run the time budget alone sizes, plans its step count from its
measured speed).

A run of `steps` makes exactly that many updates; a run with a `token_budget` or `flop_budget` makes the updates
that work takes (`TrainConfig.total_steps`), so the same config does the same work on any machine. A run with
`time_budget_s` alone trains until the budget is spent: its clock starts at the first update (compilation is over
by then, and is reported on its own) and counts everything the loop does (updates, periodic evaluations, metrics
rows, checkpoints), and stops before the final evaluation on the fixed validation tokens. After a short warm-up
the budget measures the seconds per update and re-plans `total_steps` as the updates that fit, at every step,
so that the schedule decays to its end just as the budget runs out, even when the machine speeds up or slows
down on the way. Beside a token or FLOP budget, `time_budget_s` is a cap instead: the schedule keeps the work's
`total_steps`, and the cap only moves `last_step` sooner when its seconds would run out first. Either way the
step where the time runs out becomes the last step, so the hooks evaluate and checkpoint there as at the end of
any run.

Example:
    plan = StepPlan.of(config)
    budget = TimeBudget(plan, seconds=60.0, first_step=0, cap=config.total_steps is not None)
    ...after dispatching update `step`, with the metrics of the update before it:
    budget.tick(step, previous_metrics)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from tradewind.runs.config import OptimizerConfig, TrainConfig
from tradewind.trainer.optimizer import learning_rate

UNPLANNED = 10**9  # a time-budgeted run's step count until its speed is measured
WARMUP_UPDATES = 3  # updates left out of the speed measurement: the first runs slower than the rest


@dataclass
class StepPlan:
    """The run's schedule over `total_steps` updates (a time budget re-plans it as it goes), and `last_step`, where
    the run ends: `total_steps`, or sooner when a time cap runs out."""

    optimizer: OptimizerConfig
    total_steps: int
    last_step: int = field(init=False)

    def __post_init__(self) -> None:
        self.last_step = self.total_steps

    @classmethod
    def of(cls, config: TrainConfig) -> StepPlan:
        total = config.total_steps
        return cls(config.optimizer, UNPLANNED if total is None else total)

    def learning_rate(self, step: int) -> float:
        """The learning rate of update `step` (0-based)."""
        return learning_rate(self.optimizer, step, self.total_steps)


class TimeBudget:
    """Ends a run when `seconds` of training are spent, re-planning its step count on the way.

    `tick(step, previous)` is called after update `step` is dispatched, with the metrics of update `step - 1`:
    it waits for those (so the loop stays one update ahead of the device and the clock reads finished work),
    measures the seconds per update since the warm-up, and sets `plan.last_step` to the updates that fit in what
    is left, and `plan.total_steps` with it. When no further update fits after the one in flight, that one is the
    last. With `cap`, the plan's `total_steps` is the work's and stays: the budget only ends the run sooner.
    """

    def __init__(self, plan: StepPlan, seconds: float, first_step: int, cap: bool = False):
        self.plan, self.seconds, self.first_step, self.cap = plan, seconds, first_step, cap
        self.started: float | None = None  # when the first update was dispatched
        self.warm: tuple[int, float] | None = None  # (step, time) when the warm-up ended
        self.seconds_per_step: float | None = None

    def tick(self, step: int, previous: Any) -> float:
        """Account for update `step - 1` and re-plan; returns the seconds spent waiting for it."""
        now = time.perf_counter()
        if self.started is None:
            self.started = now
            return 0.0
        jax.block_until_ready(previous)
        done = time.perf_counter()
        finished, elapsed = step - 1, done - self.started  # updates known to be complete; seconds they took
        if self.warm is None:
            if finished - self.first_step >= WARMUP_UPDATES:
                self.warm = (finished, done)
        elif finished > self.warm[0]:
            self.seconds_per_step = (done - self.warm[1]) / (finished - self.warm[0])
        last = self.plan.last_step
        if self.seconds_per_step is None:
            if elapsed >= self.seconds:  # spent before the speed was known
                last = step
        else:
            fitting = int((self.seconds - elapsed) / self.seconds_per_step)  # the update in flight is one
            last = step if fitting <= 1 else finished + fitting
        if self.cap:
            last = min(last, self.plan.total_steps)  # the cap never adds work
        if jax.process_count() > 1:  # every process of a gang must stop at the same step: process 0's
            last = int(multihost_utils.broadcast_one_to_all(np.asarray(last, np.int64)))
        self.plan.last_step = last
        if not self.cap:
            self.plan.total_steps = last
        return done - now

    def spent(self) -> float:
        """Seconds since the first update (0 before it)."""
        return 0.0 if self.started is None else time.perf_counter() - self.started
