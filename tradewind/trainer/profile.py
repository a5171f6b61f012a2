"""Profile a run's train step: compile time, mean step time, tokens per second and a JAX profiler trace.

As a job (what the `profile_run` tool submits; the keyword arguments are a `ProfileJob`):
    JobSpec(name="profile r1", callable="tradewind.trainer.profile:profile_job",
            kwargs={"run_dir": "RUN_DIR", "steps": 5})

reads `RUN_DIR/config.json` and writes `RUN_DIR/profile/summary.json` (a `ProfileSummary`) and the trace
under `RUN_DIR/profile/trace/`, which TensorBoard's profile plugin or Perfetto opens. It builds the run
exactly as `train` does (`setup_training`), trains a few steps in the training loop (`run_steps`, with a
`ProfileHook`) and throws them away: the run's own files are left alone. From Python,
`profile_training(config, out_dir, steps)` does the same for any config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from tradewind.core import InvalidInputError, atomic_write_json, parse_config
from tradewind.trainer.config import TrainConfig, read_train_config
from tradewind.trainer.hooks import ProfileHook
from tradewind.trainer.jobs import ProfileJob
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.loop import run_steps
from tradewind.trainer.metrics import ProfileSummary
from tradewind.trainer.setup import setup_training


def profile_training(config: TrainConfig, out_dir: Path, steps: int = 5) -> ProfileSummary:
    """Compile the run's train step, then time `steps` steps under the JAX profiler.

    One untimed step runs first, so that one-off costs of the first execution stay out of the mean.

    Args:
        config: the run to profile; its `steps` only shapes the learning-rate schedule.
        out_dir: where `summary.json` and the `trace/` folder go; created if missing.
        steps: train steps to time.

    Returns:
        The summary, also written to `out_dir/summary.json`.

    Raises:
        InvalidInputError: `steps` is below 1.
        NotFoundError, ConfigError: as `setup_training`.
    """
    if steps < 1:
        raise InvalidInputError(f"argument 'steps': must be at least 1 (got {steps})")
    out_dir = Path(out_dir)
    trace_dir = out_dir / "trace"
    setup = setup_training(config)
    profiler = ProfileHook(trace_dir, first=2, last=steps + 1)  # step 1 runs first, untimed and untraced
    run_steps(setup, setup.state, [profiler], last_step=steps + 1)
    step_s = profiler.step_s
    mean_step_s = sum(step_s) / len(step_s)
    summary = ProfileSummary(
        steps=steps,
        compile_s=setup.compile_s,
        mean_step_s=mean_step_s,
        tokens_per_s=config.tokens_per_step / mean_step_s,
        parameters=setup.parameters,
        trace_dir=str(trace_dir),
        backend=jax.default_backend(),
    )
    atomic_write_json(out_dir / "summary.json", summary.model_dump())
    return summary


def profile_job(**job: Any) -> None:
    """The entry of a profiling job: validates its keyword arguments as a `ProfileJob` and profiles the run.

    Raises:
        ConfigError: an argument is missing or out of range (the message names it), or the run's config is bad.
        NotFoundError: as `read_train_config` and `setup_training`.
    """
    request = parse_config(ProfileJob, job, source="profile job")
    layout = RunLayout(Path(request.run_dir))
    summary = profile_training(read_train_config(layout.config), layout.profile, steps=request.steps)
    print(
        f"{summary.mean_step_s * 1000:.1f} ms/step, {summary.tokens_per_s:,.0f} tok/s on {summary.backend} "
        f"(compile {summary.compile_s:.1f}s); trace in {summary.trace_dir}"
    )
