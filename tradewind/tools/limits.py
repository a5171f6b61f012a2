"""What one `launch_training` call may start: how many runs at once, how many steps, how much memory.

The limits live under `limits:` in `<workspace>/settings.yaml` (`LaunchLimits`), so the person who owns
the machine sets them and an agent cannot raise them with an argument; each refusal names the limit, the
value asked for and the line of settings.yaml that would allow it.
"""

from __future__ import annotations

import psutil

from tradewind.core import InvalidInputError
from tradewind.tools.context import LaunchLimits, ToolContext
from tradewind.trainer import TrainConfig, training_memory

GIB = 2**30


class LimitReached(InvalidInputError):
    """A refusal that clears by itself as other runs end: `limit` is `max_active_runs` or `memory_fraction`."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


def check_launch_limits(
    ctx: ToolContext, config: TrainConfig, *, vocab_size: int, backend: str, processes: int, active_runs: list[str]
) -> None:
    """Refuse a run that would pass one of the workspace's limits.

    `active_runs` are the ids of the workspace's runs still pending or running. Memory is checked only for a
    CPU run on the local backend, the one case where the machine it will use is this one.

    Raises:
        LimitReached: too many active runs, or not enough free memory now (both clear as runs end).
        InvalidInputError: naming the limit, what was asked for, and how to raise it.
    """
    limits = ctx.settings().limits
    if len(active_runs) >= limits.max_active_runs:
        raise LimitReached(
            f"{len(active_runs)} runs are already pending or running ({', '.join(active_runs)}) and the limit is "
            f"{limits.max_active_runs}; wait for one (wait_for_run), stop one (cancel_run), or raise "
            f"{_setting(ctx, 'max_active_runs', limits)}",
            "max_active_runs",
        )
    if config.steps > limits.max_steps:
        raise InvalidInputError(
            f"argument 'steps': {config.steps} is more than the limit of {limits.max_steps} steps per run; ask for "
            f"fewer, or raise {_setting(ctx, 'max_steps', limits)}"
        )
    if backend == "local" and config.accelerator == "cpu":
        _check_memory(ctx, config, vocab_size, processes, limits)


def _check_memory(ctx: ToolContext, config: TrainConfig, vocab_size: int, processes: int, limits: LaunchLimits) -> None:
    estimate = training_memory(config, vocab_size, processes)
    needed = processes * estimate.total_bytes
    available = psutil.virtual_memory().available
    allowed = limits.memory_fraction * available
    if needed <= allowed:
        return
    raise LimitReached(
        f"the run needs about {needed / GIB:,.1f} GiB of memory ({processes} x ({estimate.params:,} parameters "
        f"with gradients and {config.optimizer.type} state: {estimate.state_bytes / GIB:,.1f} GiB, and "
        f"activations for {estimate.sequences} sequences of {config.seq_len} "
        f"tokens: {estimate.activation_bytes / GIB:,.1f} GiB)), more than {limits.memory_fraction:g} of the "
        f"{available / GIB:,.1f} GiB this machine has available; shrink the model, batch_size or seq_len, raise "
        f"grad_accum, or raise {_setting(ctx, 'memory_fraction', limits)}",
        "memory_fraction",
    )


def _setting(ctx: ToolContext, name: str, limits: LaunchLimits) -> str:
    return f"limits.{name} (now {getattr(limits, name)}) in {ctx.settings_path}"
