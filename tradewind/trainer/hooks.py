"""What the training loop does besides updating: metrics rows and evaluation, checkpoints, profiler traces.

The loop (`tradewind.trainer.loop.run_steps`) dispatches updates without waiting for the device. After each
update it asks every hook whether it `wants` that step; if one does, the loop waits for the device, adds the
time since it last waited to the `Interval`, and calls the hooks that want the step, in their order (metrics
before checkpoints, so a checkpoint never exists without the rows up to its step). Time spent in hooks stays
out of the step timing.

Example:
    hooks = [MetricsHook(setup, writers, start), CheckpointHook(checkpointer, setup.plan)]
    state = run_steps(setup, state, hooks)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import numpy as np

from tradewind.core import TradewindError, append_jsonl
from tradewind.runs.config import TrainConfig
from tradewind.runs.layout import RunLayout
from tradewind.runs.metrics import MetricRow
from tradewind.trainer.distributed import is_main_process
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.plan import UNPLANNED, StepPlan
from tradewind.trainer.setup import TrainSetup, evaluate
from tradewind.trainer.startup import StartupClock
from tradewind.trainer.state import TrainState
from tradewind.trainer.tensorboard import EventWriter

# progress(step, total_steps, row or None): called after every update and with each metrics row.
TrainProgress = Callable[[int, int, MetricRow | None], None]


@dataclass
class Interval:
    """The updates since the loop last waited for the device: their metrics (on the device) and the seconds
    they took, of which `data_s` reading and placing the next batches and `device_s` blocked on the device's
    result. The hook that reports them (`MetricsHook`) clears it."""

    metrics: list[dict[str, jax.Array]] = field(default_factory=list)
    seconds: float = 0.0
    data_s: float = 0.0
    device_s: float = 0.0

    def clear(self) -> None:
        self.metrics, self.seconds, self.data_s, self.device_s = [], 0.0, 0.0, 0.0


class Hook(Protocol):
    def wants(self, step: int) -> bool:
        """Whether to run after update `step` (the loop then waits for the device)."""

    def __call__(self, state: TrainState, interval: Interval) -> None:
        """Act on the state after update `state.step`."""


FIRST_UPDATE = "first update"


class FirstUpdateHook:
    """Ends the start-up's last stage when the attempt's first update is done, and prints where the start-up
    went (first in the hooks: the metrics row is not part of it)."""

    def __init__(self, clock: StartupClock, first_step: int):
        self.clock, self.first_step = clock, first_step

    def wants(self, step: int) -> bool:
        return step == self.first_step + 1

    def __call__(self, state: TrainState, interval: Interval) -> None:
        self.clock.mark(FIRST_UPDATE)
        print(self.clock.describe(), flush=True)


class RunWriters:
    """Where a metrics row goes: metrics.jsonl, stdout, TensorBoard and W&B (process 0 only).

    Keeps every row of the run (`rows`, starting with those restored), from which the summary is made.
    `progress(step, total_steps, row)` is called with each row, the total being the plan's last step then.
    """

    def __init__(
        self,
        layout: RunLayout,
        config: TrainConfig,
        plan: StepPlan,
        progress: TrainProgress | None,
        rows: list[MetricRow],
    ):
        self.layout, self.config, self.plan, self.progress = layout, config, plan, progress
        self.rows = list(rows)
        self.main = is_main_process()
        self.events = EventWriter(layout.tensorboard) if self.main and config.tensorboard else None
        self.wandb = _start_wandb(config, layout) if self.main and config.wandb_project else None

    def write(self, row: MetricRow) -> None:
        row = _finite(row)
        self.rows.append(row)
        if self.main:
            append_jsonl(self.layout.metrics, row.model_dump(exclude_none=True))
            scalars = {k: float(v) for k, v in row.model_dump(exclude_none=True).items() if k != "step"}
            if self.events is not None:
                self.events.scalars(row.step, scalars)
            if self.wandb is not None:
                self.wandb.log(scalars, step=row.step)
        _print_row(row, self.plan.last_step)
        if self.progress is not None:
            self.progress(row.step, self.plan.last_step, row)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self.wandb is not None:
            self.wandb.finish()


class MetricsHook:
    """A metrics row every `log_every` steps and an evaluation every `eval_every` (both at the last step).

    The row's loss is the mean of the interval's finite losses; with `on_nonfinite: stop`, a non-finite loss
    raises, naming its step.
    """

    def __init__(self, setup: TrainSetup, writers: RunWriters, start: float):
        self.setup, self.config, self.plan, self.writers, self.start = setup, setup.config, setup.plan, writers, start

    def wants(self, step: int) -> bool:
        return self._logs(step) or self._evaluates(step)

    def __call__(self, state: TrainState, interval: Interval) -> None:
        step, fields = state.step, {}
        host = [{k: _to_host(v) for k, v in m.items()} for m in interval.metrics]
        step_losses = np.asarray([m["loss"] for m in host], dtype=np.float64)
        if self.config.on_nonfinite == "stop":
            _check_finite(step_losses, first_step=step - len(host) + 1)
        if self._logs(step):
            finite = step_losses[np.isfinite(step_losses)]
            tokens_per_s = sum(float(m["tokens"]) for m in host) / interval.seconds
            fields = dict(
                loss=float(finite.mean()) if finite.size else None,
                lr=self.plan.learning_rate(step - 1),
                grad_norm=float(host[-1]["grad_norm"]),
                param_norm=float(host[-1]["param_norm"]),
                tokens_per_s=tokens_per_s,
                step_time_s=interval.seconds / len(host),
                mfu=tokens_per_s * self.setup.flops_per_token / (self.setup.peak_flops * len(jax.devices())),
                skipped_steps=int(sum(float(m["skipped"]) for m in host)) or None,
            )
            interval.clear()
        if self._evaluates(step):
            self.evaluate(state, **fields)
        else:
            self.writers.write(MetricRow(step=step, elapsed=time.perf_counter() - self.start, **fields))

    def evaluate(self, state: TrainState, **fields: Any) -> None:
        """Write the row of `state.step` with its eval loss (and `fields`)."""
        loss = evaluate(self.setup, state.params)
        self.writers.write(
            MetricRow(
                step=state.step,
                eval_loss=loss,
                eval_perplexity=math.exp(min(loss, 700.0)),
                eval_bits_per_byte=bits_per_byte(self.setup, loss),
                elapsed=time.perf_counter() - self.start,
                **fields,
            )
        )

    def _logs(self, step: int) -> bool:
        return step % self.config.log_every == 0 or step == self.plan.last_step

    def _evaluates(self, step: int) -> bool:
        return step % self.config.eval_every == 0 or step == self.plan.last_step


class CheckpointHook:
    """A checkpoint whenever the policy says (always at the plan's last step). Saving copies the arrays before
    the next update donates them; writing goes on behind."""

    def __init__(self, checkpointer: Checkpointer, plan: StepPlan):
        self.checkpointer, self.plan = checkpointer, plan
        self.decided: tuple[int, bool] | None = None

    def wants(self, step: int) -> bool:
        # Decided once per step: a hook that acts before each save (a run in a bucket sends its rows) asks too,
        # and a wall-clock policy could answer the second time otherwise.
        if self.decided is not None and self.decided[0] == step:
            return self.decided[1]
        decision = self.checkpointer.should_save(step, final=step == self.plan.last_step)
        if self.checkpointer.policy.every_minutes:
            decision = agree(decision)  # a wall-clock policy could decide differently on each host
        self.decided = (step, decision)
        return decision

    def __call__(self, state: TrainState, interval: Interval) -> None:
        self.checkpointer.save(state)


@dataclass(frozen=True)
class StepTiming:
    """One update's wall time as the loop measured it: reading the next batch (`data_s`), blocked on the
    device (`device_s`), and the rest (`host_s`: dispatch and Python)."""

    seconds: float
    data_s: float
    device_s: float

    @property
    def host_s(self) -> float:
        return max(0.0, self.seconds - self.data_s - self.device_s)

    def since(self, earlier: StepTiming) -> StepTiming:
        """The timing between two readings of the loop's running totals."""
        return StepTiming(
            self.seconds - earlier.seconds, self.data_s - earlier.data_s, self.device_s - earlier.device_s
        )


class ProfileHook:
    """A JAX profiler trace of updates `first` to `last` (none when `trace_dir` is None), each one's `StepTiming`
    (`steps`) and the tokens it trained on (`tokens`), and the XLA compilations during them (`compiles`).

    Wanting every step of the window makes the loop wait for each, so a step's time is its own. The timings
    are differences of the loop's `Interval`, which nothing else may clear meanwhile (no `MetricsHook`).
    The trace is written for TensorBoard/XProf (`*.xplane.pb`) and Perfetto (`*.trace.json.gz`).
    """

    def __init__(self, trace_dir: Any, first: int, last: int):
        self.trace_dir, self.first, self.last = trace_dir, first, last
        self.steps: list[StepTiming] = []
        self.tokens: list[float] = []
        self.compiles = 0
        self._totals = StepTiming(0.0, 0.0, 0.0)  # the interval's running totals at the last call

    def wants(self, step: int) -> bool:
        return self.first - 1 <= step <= self.last

    def __call__(self, state: TrainState, interval: Interval) -> None:
        totals = StepTiming(interval.seconds, interval.data_s, interval.device_s)
        if state.step == self.first - 1:
            if self.trace_dir is not None:
                jax.profiler.start_trace(str(self.trace_dir), create_perfetto_trace=True)
            jax.monitoring.register_event_duration_secs_listener(self._count_compile)
        else:
            self.steps.append(totals.since(self._totals))
            self.tokens.append(float(interval.metrics[-1]["tokens"]))
        if state.step == self.last:
            jax.monitoring.unregister_event_duration_listener(self._count_compile)
            if self.trace_dir is not None:
                jax.profiler.stop_trace()
        self._totals = totals

    def _count_compile(self, event: str, duration_s: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.compiles += 1


def bits_per_byte(setup: TrainSetup, loss: float) -> float | None:
    """Nats per token -> bits per UTF-8 byte, using the val split's bytes-per-token ratio."""
    if setup.val_bytes_per_token is None:
        return None
    return loss / math.log(2) / setup.val_bytes_per_token


def agree(decision: bool) -> bool:
    """Process 0's decision on every process."""
    if jax.process_count() == 1:
        return decision
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(decision)))


def _to_host(x: jax.Array) -> np.ndarray:
    """A replicated array's value, also when other processes hold parts of the mesh."""
    return np.asarray(x if x.is_fully_addressable else x.addressable_data(0))


def _finite(row: MetricRow) -> MetricRow:
    """`row` without NaN or infinite figures (JSON has no such numbers; `skipped_steps` tells of them)."""
    values = row.model_dump()
    return MetricRow(**{k: v for k, v in values.items() if not (isinstance(v, float) and not math.isfinite(v))})


def _check_finite(step_losses: np.ndarray, first_step: int) -> None:
    """Raise if a loss is NaN or infinite, naming the first step where it happened."""
    bad = np.flatnonzero(~np.isfinite(step_losses))
    if bad.size:
        step = first_step + int(bad[0])
        raise TradewindError(
            f"training loss became {step_losses[bad[0]]} at step {step}; lower optimizer.learning_rate, "
            "add warmup, check the data, or set on_nonfinite: skip"
        )


def _print_row(row: MetricRow, last_step: int) -> None:
    """One log line per row, of the figures it has (a skipped step has no grad norm, say)."""
    shown = (
        ("loss", row.loss, "{:.4f}"),
        ("lr", row.lr, "{:.2e}"),
        ("grad_norm", row.grad_norm, "{:.3f}"),
        ("tok/s", row.tokens_per_s, "{:,.0f}"),
        ("MFU", row.mfu, "{:.1%}"),
        ("eval_loss", row.eval_loss, "{:.4f}"),
    )
    parts = [f"step {row.step}" if last_step == UNPLANNED else f"step {row.step}/{last_step}"]
    parts += [f"{name} {form.format(value)}" for name, value, form in shown if value is not None]
    print(" | ".join([*parts, f"{row.elapsed:.1f}s"]), flush=True)


def _start_wandb(config: TrainConfig, layout: RunLayout) -> Any:
    try:
        import wandb
    except ImportError:
        print("wandb_project is set but wandb is not installed (pip install 'tradewind[wandb]'); skipping W&B")
        return None
    return wandb.init(project=config.wandb_project, name=layout.root.name, config=config.model_dump(mode="json"))
