"""What the tools may start: how many runs at once, how many steps, how much memory.

The limits live under `limits:` in `<workspace>/settings.yaml` (`LaunchLimits`), so the person who owns
the machine sets them and an agent cannot raise them with an argument; each refusal names the limit, the
value asked for and the line of settings.yaml that would allow it.

They bind every job a tool starts, not only runs: `launch_training` (and so every sweep trial) goes through
`check_launch_limits`; the jobs that train a config's steps on this machine for a tool (estimate_run's probe,
profile_run) go through `admit_job` (they count as one more active run, and their memory is checked as a
run's); a sampling request goes through `check_sampling_memory` before the worker loads the model. Each check
runs before anything is submitted.
"""

from __future__ import annotations

import psutil

from tradewind.cluster import Placement
from tradewind.cluster.backends import BACKEND_TYPES
from tradewind.core import InvalidInputError, TradewindError
from tradewind.runs import RunLayout, TrainConfig, read_train_config, training_memory
from tradewind.runs.config import Budget
from tradewind.tools.context import LaunchLimits, ToolContext
from tradewind.tools.runs import RunRequest, get_run, run_record

GIB = 2**30


class LimitReached(InvalidInputError):
    """A refusal that clears by itself as other runs end: `limit` is `max_active_runs`, `memory_fraction` or
    `shared_devices`."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


def active_runs(ctx: ToolContext) -> list[str]:
    """The workspace's runs still pending or running (a record that says so is checked against its job)."""
    active = []
    for folder in sorted(ctx.workspace.runs_dir.iterdir()):
        try:
            recorded = run_record(ctx, folder.name).status
            if not recorded.finished and not get_run(ctx, RunRequest(run_id=folder.name)).status.finished:
                active.append(folder.name)
        except (TradewindError, ValueError, OSError):  # not a readable run: list_runs reports those
            continue
    return active


def check_launch_limits(
    ctx: ToolContext,
    config: TrainConfig,
    placement: Placement,
    *,
    vocab_size: int,
    on_this_machine: bool,
    active_runs: list[str],
) -> None:
    """Refuse a run that would pass one of the workspace's limits.

    `active_runs` are the ids of the workspace's runs still pending or running. Memory is checked only for a
    CPU run whose backend runs it `on_this_machine` (local), the one case where the memory it will use is
    this one's.

    Raises:
        LimitReached: too many active runs, or not enough free memory now (both clear as runs end).
        InvalidInputError: naming the limit, what was asked for, and how to raise it.
    """
    limits = ctx.settings().limits
    check_step_limit(ctx, config)
    if on_this_machine and limits.shared_devices == "refuse":
        _check_devices_free(ctx, config, placement, active_runs, limits)
    on_this_cpu = on_this_machine and placement.accelerator.kind == "cpu"
    _admit(
        ctx, config, vocab_size, placement.processes, active_runs, what="the run", on_this_cpu=on_this_cpu, instead=""
    )


def check_step_limit(ctx: ToolContext, config: TrainConfig, where: str = "") -> None:
    """Refuse a config whose steps (or the steps its token or FLOP budget takes) pass `limits.max_steps`; a time
    budget's steps are what fits, so there is nothing to check before it runs. `where` starts the message.

    Raises:
        InvalidInputError: naming the field, the steps and the setting.
    """
    limits = ctx.settings().limits
    steps = config.total_steps or config.steps
    if steps <= limits.max_steps or config.budget.kind == "time":
        return
    asked = f"{config.budget.describe()} is {steps:,} steps" if config.budget.fixes_work else f"{steps:,} is"
    raise InvalidInputError(
        f"{where}argument {config.budget.field!r}: {asked} more than the limit of {limits.max_steps:,} steps per "
        f"run; ask for fewer, or raise {_setting(ctx, 'max_steps', limits)}"
    )


def holds_devices_alone(config: TrainConfig, on_this_machine: bool) -> bool:
    """Whether a run must have this machine's devices to itself: one on a time budget, whose result is what it
    trains in its seconds, so that a run beside it would change. Its job asks the backend for every CPU, so no
    other job starts beside it, and it starts only once none runs (`limits.shared_devices: wait` queues it)."""
    return on_this_machine and config.budget.kind == "time"


def _check_devices_free(
    ctx: ToolContext, config: TrainConfig, placement: Placement, active: list[str], limits: LaunchLimits
) -> None:
    """Refuse a run on a time budget while another run holds this machine's devices of its kind, and any run
    while one on a time budget does: two runs beside each other would each train at a speed the other sets."""
    beside = [run_id for run_id in active if _devices_of(ctx, run_id) == placement.accelerator.kind]
    timed = config.budget.kind == "time"
    clashing = beside if timed else [run_id for run_id in beside if _budget_of(ctx, run_id).kind == "time"]
    if not clashing:
        return
    whose = "it is on a time budget, and" if timed else "they are on a time budget, and"
    raise LimitReached(
        f"run(s) {', '.join(clashing)} use this machine's {placement.accelerator.kind} devices; {whose} runs side "
        f"by side would each train at a speed the other sets; wait for them (wait_for_run), give this run a "
        f"token_budget instead of time_budget_s, or set {_setting(ctx, 'shared_devices', limits)} to 'wait' to "
        "queue it until they end",
        "shared_devices",
    )


def _devices_of(ctx: ToolContext, run_id: str) -> str | None:
    """The kind of device run `run_id` trains on, if it runs on this machine (None on a cluster)."""
    record = run_record(ctx, run_id)
    here = record.backend == "process" or BACKEND_TYPES[record.backend].on_this_machine  # a Python train() call
    return record.placement.accelerator.kind if here else None


def _budget_of(ctx: ToolContext, run_id: str) -> Budget:
    layout = RunLayout(ctx.workspace.run_dir(run_id))
    return read_train_config(layout.config, ctx.workspace.reader("run_id")).budget


def admit_job(
    ctx: ToolContext, config: TrainConfig, placement: Placement, *, vocab_size: int, what: str, instead: str
) -> None:
    """Refuse a job that trains `config`'s steps on this machine for a tool (estimate_run's probe, profile_run)
    where a run of it would be refused: it counts as one more active run, and a CPU one's memory is checked.

    `what` names the job in the message ("estimate_run's probe"); `instead` says what to do short of waiting.

    Raises:
        LimitReached: as `check_launch_limits`.
    """
    on_this_cpu = placement.accelerator.kind == "cpu"
    _admit(ctx, config, vocab_size, 1, active_runs(ctx), what=what, on_this_cpu=on_this_cpu, instead=instead)


def check_sampling_memory(ctx: ToolContext, config: TrainConfig, vocab_size: int) -> None:
    """Refuse to load run `config`'s model for sampling on this machine if its weights and key/value cache
    would take more than the workspace's share of the available memory.

    Raises:
        LimitReached: naming the need, what is available and the setting.
    """
    model = config.model.model_copy(update={"vocab_size": config.model.vocab_size or vocab_size})
    weights = 4 * model.count_params()  # float32
    cache = 2 * 4 * model.n_layers * model.max_seq_len * model.d_model  # keys and values of one sequence
    _check_memory(
        ctx,
        weights + cache,
        f"{model.count_params():,} float32 parameters and a key/value cache of {model.max_seq_len} tokens",
        what="sampling this run",
        instead=" wait for other runs to end,",
        limits=ctx.settings().limits,
    )


def _admit(
    ctx: ToolContext,
    config: TrainConfig,
    vocab_size: int,
    processes: int,
    active: list[str],
    *,
    what: str,
    on_this_cpu: bool,
    instead: str,
) -> None:
    limits = ctx.settings().limits
    if len(active) >= limits.max_active_runs:
        beside = "" if what == "the run" else f" and {what} would train beside them"
        raise LimitReached(
            f"{len(active)} runs are already pending or running ({', '.join(active)}){beside}, and the limit is "
            f"{limits.max_active_runs}; wait for one (wait_for_run), stop one (cancel_run),{instead} or raise "
            f"{_setting(ctx, 'max_active_runs', limits)}",
            "max_active_runs",
        )
    if on_this_cpu:
        estimate = training_memory(config, vocab_size, processes)
        frozen = f" and {estimate.frozen:,} frozen bfloat16 ones" if estimate.frozen else ""
        _check_memory(
            ctx,
            processes * estimate.total_bytes,
            f"{processes} x ({estimate.params:,} parameters with gradients and {config.optimizer.type} state"
            f"{frozen}: {estimate.state_bytes / GIB:,.1f} GiB, and activations for {estimate.sequences} sequences of "
            f"{config.seq_len} tokens: {estimate.activation_bytes / GIB:,.1f} GiB)",
            what=what,
            instead=f"{instead} shrink the model, batch_size or seq_len, raise grad_accum,",
            limits=limits,
        )


def _check_memory(
    ctx: ToolContext, needed: int, breakdown: str, *, what: str, instead: str, limits: LaunchLimits
) -> None:
    available = psutil.virtual_memory().available
    allowed = limits.memory_fraction * available
    if needed <= allowed:
        return
    raise LimitReached(
        f"{what} needs about {needed / GIB:,.1f} GiB of memory ({breakdown}), more than {limits.memory_fraction:g} "
        f"of the {available / GIB:,.1f} GiB this machine has available;{instead} or raise "
        f"{_setting(ctx, 'memory_fraction', limits)}",
        "memory_fraction",
    )


def _setting(ctx: ToolContext, name: str, limits: LaunchLimits) -> str:
    return f"limits.{name} (now {getattr(limits, name)}) in {ctx.settings_path}"
