"""The estimate's probe: a run's measured step time, in a job, beside its parameters, FLOPs per token and memory.

The analytic part is `tradewind.runs.estimate.estimate_training` (no JAX). `probe_training` adds to it what only
the device can tell: it builds the run as `train` does (`setup_training`), takes the device's memory limit from
JAX where the device reports one, and measures the seconds per step the run's loop will take:

- a few warm-up steps go untimed: the first executions pay one-off costs (allocation, thread pools);
- then the training loop (`run_steps`) runs stretches of steps, waiting for the device after each as a run
  waits at each metrics row (every `log_every` steps, shorter when steps are slow), until `probe_s` seconds
  (2 by default) and at least `PROBE_MIN_STEPS` steps are timed, or `PROBE_MAX_S` have passed for a slow model;
  a handful of steps times mostly noise (3 were off by up to 2x);
- the step time is the median stretch's seconds per step, which one stall on a shared machine does not move,
  plus the run's evaluations spread over its steps (one evaluation of `eval_batches`, timed, per `eval_every`
  steps and at the last), since a run's training seconds (`TrainSummary.train_s`) include them.

As a job (what the `estimate_run` tool submits; the keyword arguments are an `EstimateJob`):
    JobSpec(name="estimate", callable="tradewind.trainer.estimate:estimate_job",
            kwargs={"config": {...}, "output_file": "jobs/estimate-ab/estimate.json"})

writes a `TrainEstimate` as JSON to `output_file`. The probe's updates are thrown away.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from tradewind.cluster.placement import Placement
from tradewind.core import atomic_write_json, parse_config
from tradewind.data import open_token_cache
from tradewind.runs.config import TrainConfig
from tradewind.runs.estimate import PROBE_MAX_S, PROBE_MIN_STEPS, PROBE_S, EstimateJob, TrainEstimate, estimate_training

if TYPE_CHECKING:  # the probe's types; JAX is imported only when it runs
    from tradewind.trainer.setup import TrainSetup
    from tradewind.trainer.state import TrainState

PROBE_WARMUP_STEPS = 3  # untimed, after the first step: the earliest executions run slower than the rest
PROBE_STRETCHES = 8  # stretches of steps the probe times at least, when steps are fast enough
PRELOAD = ("tradewind.trainer.setup", "tradewind.trainer.loop")  # what the fork server imports ahead of the jobs


def probe_training(config: TrainConfig, placement: Placement | None = None, probe_s: float = PROBE_S) -> TrainEstimate:
    """`estimate_training` with the step time measured: builds and compiles the run, warms it up, then times its
    steps (loads JAX; see the module docstring).

    Args:
        config: the run (`config.dataset` is a token-cache folder).
        placement: where it runs: its accelerator, and the replicas that share the batch; None: one CPU process.
        probe_s: seconds of steps to time (at least `PROBE_MIN_STEPS` steps, at most `PROBE_MAX_S` seconds).

    Returns:
        The estimate with `step_time_s`, `compile_s` and `probed_steps`, against the device's memory.

    Raises:
        NotFoundError: no token cache at `config.dataset`.
        ConfigError, InvalidInputError: as `estimate_training` and `setup_training`.
    """
    placement = placement or Placement()
    config = config.with_vocabulary(open_token_cache(Path(config.dataset)).manifest.tokenizer.vocab_size)
    step_time_s, probed_steps, compile_s = _probe(config, placement, probe_s)
    estimate = estimate_training(config, placement, device_memory=_device_memory())
    return estimate.model_copy(
        update={"step_time_s": step_time_s, "compile_s": compile_s, "probed_steps": probed_steps}
    )


def _probe(config: TrainConfig, placement: Placement, probe_s: float) -> tuple[float, int, float]:
    """Seconds per step of a run built as `train` builds it, in its loop with its evaluations; the steps timed;
    and the compile time."""
    from tradewind.trainer.distributed import check_devices
    from tradewind.trainer.setup import evaluate, setup_training

    check_devices(placement.accelerator)
    setup = setup_training(config)
    state, _ = _run(setup, setup.state, 1)  # the first step pays one-off costs (allocation, autotuning)
    state, warm_up_s = _run(setup, state, PROBE_WARMUP_STEPS)
    evaluate(setup, state.params)  # the eval step's first execution pays its own one-off costs
    start = time.perf_counter()
    evaluate(setup, state.params)
    eval_s = time.perf_counter() - start
    step_s, steps = _time_steps(setup, state, probe_s, rough_step_s=warm_up_s / PROBE_WARMUP_STEPS)
    return step_s + eval_s * _evaluations_per_step(config), steps, setup.compile_s


def _time_steps(setup: TrainSetup, state: TrainState, probe_s: float, rough_step_s: float) -> tuple[float, int]:
    """The median seconds per step over stretches of steps in the training loop, and the steps timed.

    A run's loop waits for the device at each metrics row, every `log_every` steps: a stretch is as long, unless
    that leaves fewer than `PROBE_STRETCHES` stretches in `probe_s` at `rough_step_s` a step.
    """
    stretch = max(1, min(setup.config.log_every, round(probe_s / PROBE_STRETCHES / rough_step_s)))
    per_step: list[float] = []
    start = time.perf_counter()
    while True:
        state, seconds = _run(setup, state, stretch)
        per_step.append(seconds / stretch)
        spent, timed = time.perf_counter() - start, len(per_step) * stretch
        if spent >= PROBE_MAX_S or (spent >= probe_s and timed >= PROBE_MIN_STEPS):
            return statistics.median(per_step), timed


def _run(setup: TrainSetup, state: TrainState, steps: int) -> tuple[TrainState, float]:
    """`steps` more updates in the training loop, with no hooks, and the seconds until the device finished them."""
    import jax

    from tradewind.trainer.loop import run_steps

    start = time.perf_counter()
    state = run_steps(setup, state, hooks=[], last_step=state.step + steps)
    jax.block_until_ready(state.params)
    return state, time.perf_counter() - start


def _evaluations_per_step(config: TrainConfig) -> float:
    """The evaluations a run of `config` makes in its loop per step: one every `eval_every` steps and one at the
    last (a run's first evaluation, before its first step, is not in its training seconds)."""
    total = config.total_steps
    if total is None:  # a time budget: its steps are not known before it runs
        return 1 / config.eval_every
    return math.ceil(total / config.eval_every) / total


def _device_memory() -> tuple[int, str]:
    """The first device's memory limit where JAX reports one (GPU, TPU), else this machine's available RAM."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{jax.devices()[0].device_kind} bytes_limit"
    return psutil.virtual_memory().available, "available RAM"


def estimate_job(**job: Any) -> None:
    """The entry of an estimating job: validates its keyword arguments as an `EstimateJob`, probes the config
    and writes the `TrainEstimate` to `output_file`."""
    request = parse_config(EstimateJob, job, source="estimate job")
    estimate = probe_training(request.config, request.placement, request.probe_s)
    atomic_write_json(Path(request.output_file), estimate.model_dump())
    print(
        f"{estimate.parameters:,} parameters; compile {estimate.compile_s:.1f}s; "
        f"{(estimate.step_time_s or 0) * 1000:.1f} ms/step over {estimate.probed_steps} steps",
        flush=True,
    )
