"""The training loop: `train(config, run_dir)` runs the updates and writes the run's files.

What lands in the run folder (see `RunLayout`): `metrics.jsonl` rows as described in
`tradewind.runs.metrics`, the same scalars as TensorBoard event files under `tensorboard/` (and in
W&B when `wandb_project` is set and `wandb` is installed), one log line per row on stdout, orbax
checkpoints as `checkpoints` says, `run.json` (the run record, see `tradewind.runs.record`) and
`summary.json` last, so a summary means the run finished. A step's metrics row is written before its
checkpoint, so every checkpoint has the rows up to its step on disk.

A run folder that holds checkpoints but no summary (a run killed mid-way, or killed after its last
checkpoint) is resumed from its newest readable checkpoint: parameters, optimizer state, step, data
position and RNG come back (a `TrainState`), metrics rows past that step are dropped, and the run ends with the same
parameters as one that was never stopped. The summary is computed from the metrics rows, so a run that
resumes at its last step (nothing left to train) writes the same summary as one that was never stopped.
With `resume_from`, a new run starts from another run's newest checkpoint and copies its rows up to it.

The loop (`run_steps`) waits for the device only when a hook (`tradewind.trainer.hooks`: metrics rows and
evaluation, checkpoints, profiler traces) wants the step; in between, it reads the next batch from the token
cache while the device runs the step it has just dispatched.

As a job, the backends run `tradewind.trainer.start:train_job(run_dir=..., config=...)` (a `TrainJob`); by
hand, `python -m tradewind.trainer RUN_DIR` trains the config.json in RUN_DIR.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from tradewind.cluster.jobs import JobStatus, distributed_env
from tradewind.cluster.placement import Placement
from tradewind.core import (
    ConfigError,
    InvalidInputError,
    TradewindError,
    atomic_write_json,
    atomic_write_text,
)
from tradewind.core.buckets import is_remote
from tradewind.data import open_token_cache
from tradewind.runs.batches import with_dataset_vocabulary
from tradewind.runs.config import TrainConfig
from tradewind.runs.hf import check_base_weights
from tradewind.runs.layout import RunLayout
from tradewind.runs.metrics import MetricRow, TrainSummary, logged_updates, read_metrics, train_seconds
from tradewind.runs.record import read_record, record_end, record_start, update_record
from tradewind.trainer.checkpoint import open_checkpointer, read_checkpoint
from tradewind.trainer.distributed import (
    check_devices,
    describe_out_of_memory,
    initialize_distributed,
    is_main_process,
)
from tradewind.trainer.hooks import (
    FIRST_UPDATE,
    CheckpointHook,
    FirstUpdateHook,
    Hook,
    Interval,
    MetricsHook,
    RunWriters,
    TrainProgress,
    agree,
    bits_per_byte,
)
from tradewind.trainer.orbax_checkpoint import Checkpointer
from tradewind.trainer.plan import TimeBudget
from tradewind.trainer.remote import PushHook, RemoteRun, parent_files
from tradewind.trainer.setup import TrainSetup, evaluate, init_from_params, setup_training
from tradewind.trainer.startup import StartupClock
from tradewind.trainer.state import TrainState
from tradewind.trainer.tpu_compile import hbm_needed
from tradewind.trainer.validation import ValScore, fixed_val_tokens, score_val_tokens


def train(
    config: TrainConfig,
    run_dir: str | Path,
    progress: TrainProgress | None = None,
    placement: Placement | None = None,
    clock: StartupClock | None = None,
) -> TrainSummary:
    """Train a model as `config` says, writing metrics, checkpoints, the run record and the summary into `run_dir`.

    Args:
        config: the run's settings (`config.dataset` and `config.resume_from` are folders by now, or bucket
            prefixes for a run in a bucket).
        run_dir: the run folder; created if missing. If it has no `config.json`, `config` is written there,
            and if it has no `run.json`, one is made (backend "process"). If it holds checkpoints of an
            unfinished run (and `config.resume`), training resumes from them. A bucket URL (`gs://`, `s3://`):
            the run lives there, and this process trains in a private copy (see `tradewind.trainer.remote`).
        progress: optional callback, see `TrainProgress`.
        placement: what the launch asked for (the job's): its accelerator and gang size are checked against
            the devices and processes JAX finds. None (a Python call): train on whatever JAX has.
        clock: times the start-up's stages (default: from this call on); its stages are printed after the
            first update and kept in the summary's `startup_s`.

    Returns:
        The summary, also written to `summary.json`.

    Raises:
        TradewindError: the training loss became NaN or infinite (the message names the step).
        InvalidInputError: the run folder holds a finished run, or (with `resume` off) an earlier one.
        ConfigError: JAX could not start the devices asked for, or could not reach the other processes.
        NotFoundError, ConfigError: as `setup_training`.
    """
    start = time.perf_counter()
    clock = clock or StartupClock(start)
    remote = RemoteRun.open(str(run_dir)) if is_remote(run_dir) else None
    layout = remote.layout if remote else RunLayout(Path(run_dir))
    clock.mark("python and imports")
    try:
        initialize_distributed(config.distributed)
        platform = check_devices(placement and placement.accelerator)
        _check_gang(placement)
        clock.mark("devices")
    except TradewindError as error:
        gang = distributed_env()
        if layout.record.exists() and (gang is None or gang.process_id == 0):
            record_end(layout.record, JobStatus.FAILED, str(error))  # the launcher's record says why
            if remote is not None:
                remote.push()
        raise
    if remote is None:
        config = with_dataset_vocabulary(config)  # before config.json: every reader counts the same steps
    _claim_run_dir(layout, config)
    if is_main_process():
        record_start(layout.record, layout.root.name, jax.process_count(), platform, jax.device_count())
    try:
        if remote is not None:  # the bucket's copies, copied again to this host
            fetched = {"dataset": str(remote.fetch(config.dataset, "datasets"))}
            if config.init_from:
                fetched["init_from"] = str(remote.fetch(config.init_from, "models"))
            config = config.model_copy(update=fetched)
        summary = _train(config, layout, progress, start, remote, clock)
    except BaseException as error:
        if is_main_process():
            reason = str(error) if isinstance(error, TradewindError) else f"{type(error).__name__}: {error}"
            reason = describe_out_of_memory(error) or reason
            record_end(layout.record, JobStatus.FAILED, reason)
            if remote is not None:
                remote.push()
        raise
    if is_main_process():
        atomic_write_json(layout.summary, summary.model_dump())
        record_end(layout.record, JobStatus.SUCCEEDED)
        if remote is not None:
            remote.push()
    return summary


def _check_lora_base(config: TrainConfig, layout: RunLayout) -> None:
    """A LoRA run's adapters fit only the base weights they were trained on: record the digest of its base
    (`init_from`) when it first trains, and refuse a restart of it, or a run that continues it (`resume_from`),
    on a base whose weights are not those.

    Raises:
        ConfigError: the base's weights differ from the ones recorded, naming both digests and what to do.
    """
    recorded = {"this run": layout.record}
    if config.resume_from is not None and not is_remote(config.resume_from):
        recorded[f"the run it continues ({config.resume_from})"] = RunLayout(Path(config.resume_from)).record
    digest = check_base_weights(Path(config.init_from), recorded)
    if is_main_process() and layout.record.exists():
        update_record(layout.record, base_digest=digest)


def run_steps(
    setup: TrainSetup,
    state: TrainState,
    hooks: Sequence[Hook],
    progress: TrainProgress | None = None,
    last_step: int | None = None,
    budget: TimeBudget | None = None,
) -> TrainState:
    """Update from `state` to step `last_step` (default: the plan's last), calling `hooks` at the steps they want.

    Each update gets its learning rate from `setup.plan`. The next batch is read while the device computes the
    update just dispatched; the loop waits for the device only at a step some hook wants (and, with a `budget`,
    for the update before the one in flight, so that the budget's clock reads finished work), and hook time is
    left out of the interval it hands them (which also counts the time spent reading batches and blocked on the
    device: the profiler's step split). A budget may move the plan's last step as it measures the run's speed.
    """
    plan = setup.plan

    def last() -> int:
        return plan.last_step if last_step is None else last_step

    interval = Interval()
    batch = setup.put_batch(setup.train_loader.batch(state.data_step))
    timer, previous = time.perf_counter(), None
    while state.step < last():
        rate = np.float32(plan.learning_rate(state.step))
        params, opt_state, metrics = setup.train_step(state.params, state.opt_state, batch, rate, setup.frozen)
        state = state.advanced(params, opt_state)
        interval.metrics.append(metrics)
        if budget is not None:
            interval.device_s += budget.tick(state.step, previous)
            previous = metrics
        if state.step < last():
            fetch = time.perf_counter()
            batch = setup.put_batch(setup.train_loader.batch(state.data_step))
            interval.data_s += time.perf_counter() - fetch
        if progress is not None:
            progress(state.step, plan.last_step, None)
        due = [hook for hook in hooks if hook.wants(state.step)]
        if not due:
            continue
        wait = time.perf_counter()
        jax.block_until_ready(metrics)
        interval.device_s += time.perf_counter() - wait
        interval.seconds += time.perf_counter() - timer
        for hook in due:
            hook(state, interval)
        timer = time.perf_counter()
    return state


def _train(
    config: TrainConfig,
    layout: RunLayout,
    progress: TrainProgress | None,
    start: float,
    remote: RemoteRun | None,
    clock: StartupClock,
) -> TrainSummary:
    if config.lora is not None and config.init_from:
        _check_lora_base(config, layout)
    setup = setup_training(config, initial_params=init_from_params(config), clock=clock)
    config = setup.config  # with the vocabulary a FLOP budget needs
    print(
        f"model {setup.model_config.type}: {setup.parameters:,} parameters ({setup.trainable_parameters:,} trained), "
        f"vocab {setup.model_config.vocab_size}, "
        f"{setup.flops_per_token / 1e6:,.2f} MFLOP/token; mesh {dict(setup.mesh.shape)} over "
        f"{jax.process_count()} process(es); compiled in {setup.compile_s:.1f}s; peak FLOP/s "
        f"{setup.peak_flops:.3g}/device ({setup.peak_flops_source})",
        flush=True,
    )

    checkpointer = None
    if config.checkpoint:
        policy = config.checkpoints
        checkpointer = open_checkpointer(remote.checkpoints if remote else layout.checkpoints, policy)
    state, rows = _initial_state(setup, checkpointer, layout)
    first_step = state.step
    writers = RunWriters(layout, config, setup.plan, progress, rows)
    metrics = MetricsHook(setup, writers, start)
    saves = CheckpointHook(checkpointer, setup.plan) if checkpointer is not None else None
    hooks: list[Hook] = [FirstUpdateHook(clock, first_step), metrics]
    if remote is not None:
        hooks.append(PushHook(remote, saves))  # before the save: the bucket holds the rows up to each checkpoint
    if saves is not None:
        hooks.append(saves)
    evaluation = time.perf_counter()
    if first_step == 0:
        metrics.evaluate(state)
    else:
        print(f"resumed from checkpoint {state.step}", flush=True)
        if config.time_budget_s:
            evaluate(setup, state.params)  # timed, as the budget's reserve
    clock.mark("first eval")
    budget = None
    if config.time_budget_s:
        # The budget ends with the last step's evaluation, and what earlier attempts trained counts. Beside a
        # token or FLOP budget it is a cap: the work fixes the schedule, and the cap may only end the run sooner.
        reserve = time.perf_counter() - evaluation
        seconds = config.time_budget_s - reserve - train_seconds(writers.rows)
        budget = TimeBudget(setup.plan, seconds, first_step, cap=config.total_steps is not None)
    try:
        loop_start = time.perf_counter()
        state = run_steps(setup, state, hooks, progress, budget=budget)
        train_s = time.perf_counter() - loop_start
        # Rows are written before checkpoints, so this happens only when metrics.jsonl lost rows (or was
        # removed) after the last checkpoint. Process 0 decides: evaluating is a collective on every process.
        if agree(not any(row.step == state.step and row.eval_loss is not None for row in writers.rows)):
            metrics.evaluate(state)
        val_tokens = fixed_val_tokens(open_token_cache(Path(config.dataset)), config.seq_len, _mesh_rows(setup))
        val = score_val_tokens(setup, state.params, val_tokens) if val_tokens is not None else None
    finally:
        if checkpointer is not None:
            checkpointer.close()
        writers.close()

    wall_s = time.perf_counter() - start
    summary = _summarise(setup, writers.rows, wall_s, first_step, state.step, train_s, val, clock)
    if val is not None:
        print(
            f"trained {train_s:.1f}s; val_loss {_figure(val.loss)}, val_bpb {_figure(val.bits_per_byte)} "
            f"on {val.tokens:,} fixed val tokens ({val.seconds:.1f}s)",
            flush=True,
        )
    print(
        f"done: {summary.steps} steps{_budget_note(config, summary)}, final loss {_figure(summary.final_loss)}, "
        f"eval loss {_figure(summary.first_eval_loss)} -> {_figure(summary.final_eval_loss)}, "
        f"{summary.mean_tokens_per_s or 0:,.0f} tok/s, MFU {summary.mfu or 0:.2%}, {summary.wall_s:.1f}s",
        flush=True,
    )
    return summary


def _initial_state(
    setup: TrainSetup, checkpointer: Checkpointer | None, layout: RunLayout
) -> tuple[TrainState, list[MetricRow]]:
    """The state to start from: this run's newest readable checkpoint, else its parent's (`resume_from`),
    else a fresh one; and the metrics rows up to its step.

    The rows on disk are cut (or, from a parent, copied) to those up to the step, so that the file holds
    exactly the history of the state training continues from.
    """
    config = setup.config
    if checkpointer is not None and config.resume and checkpointer.steps():
        state = checkpointer.restore(setup.state)
        history = layout.metrics
    elif config.resume_from is not None:
        # The launcher chose the parent's checkpoint; a parent still training may have saved newer ones since.
        chosen = read_record(layout.record).parent_step if layout.record.exists() else None
        checkpoints, history = parent_files(config.resume_from)
        state = read_checkpoint(checkpoints, setup.state, chosen)
        total, budget = config.total_steps, config.budget
        if total is not None and state.step >= total:
            raise InvalidInputError(
                f"{budget.field}: {budget.describe()} ({total:,} updates) is the run's total and must exceed the step "
                f"of the checkpoint of {config.resume_from} it continues from ({state.step})"
            )
    else:
        if layout.metrics.exists() and is_main_process():
            layout.metrics.unlink()  # rows of an attempt that never reached a checkpoint
        return setup.state, []
    rows = [row for row in read_metrics(history) if row.step <= state.step]
    if is_main_process():  # atomically: the other processes of a gang may be reading it
        atomic_write_text(layout.metrics, "".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    return state, rows


def _check_gang(placement: Placement | None) -> None:
    """Refuse a cpu or gpu run of `replicas` processes that finds itself alone (trained without a launcher)."""
    if placement is not None and placement.replicas > 1 and jax.process_count() != placement.replicas:
        raise ConfigError(
            f"replicas: the run asks for {placement.replicas} processes but {jax.process_count()} joined; start it "
            "with launch_training or `tradewind train`, whose backend starts the gang, or set replicas to 1"
        )


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _budget_note(config: TrainConfig, summary: TrainSummary) -> str:
    """The budget for the run's last log line: what it was, and whether a time cap cut the work short."""
    budget = config.budget
    if budget.kind == "steps":
        return ""  # the step count says it
    if summary.budget_met is False:
        return (
            f" of the {config.total_steps:,} that {budget.describe()} take (not met: the {config.time_budget_s:g} s "
            "cap ran out first)"
        )
    return f" ({budget.describe()} budget)"


def _claim_run_dir(layout: RunLayout, config: TrainConfig) -> None:
    """Create the run folder, refusing one that holds a finished run (or any earlier run, without resume)."""
    if layout.summary.exists():
        raise InvalidInputError(
            f"run folder {layout.root} already holds summary.json: an earlier run finished there; use a new folder"
        )
    leftovers = [p for p in (layout.metrics, layout.checkpoints) if p.exists()]
    if leftovers and not config.resume:
        names = ", ".join(p.name for p in leftovers)
        raise InvalidInputError(f"run folder {layout.root} already holds {names} from an earlier run; use a new folder")
    if is_main_process():
        layout.root.mkdir(parents=True, exist_ok=True)
        if not layout.config.exists():
            atomic_write_json(layout.config, config.model_dump(mode="json"))


def _mesh_rows(setup: TrainSetup) -> int:
    return setup.mesh.shape["data"] * setup.mesh.shape["fsdp"]


def _summarise(
    setup: TrainSetup,
    rows: list[MetricRow],
    wall_s: float,
    first_step: int,
    steps: int,
    train_s: float,
    val: ValScore | None,
    clock: StartupClock,
) -> TrainSummary:
    """The run's summary, from its metrics rows: the same rows give the same figures, however often the
    run was stopped and resumed on the way. `steps` is the run's last step; `train_s` this attempt's training
    time, `val` its score on the fixed val tokens and `clock` its start-up."""
    config = setup.config
    evals = [row.eval_loss for row in rows if row.eval_loss is not None]
    logged = logged_updates(rows)
    update_s = train_seconds(rows)
    trained = sum(n * row.step_time_s * (row.tokens_per_s or 0.0) for n, row in logged)  # padding left out
    tokens_per_s = trained / update_s if update_s > 0 else None
    losses = [row.loss for _, row in logged if row.loss is not None]
    skipped = sum(row.skipped_steps or 0 for row in rows)
    peak = setup.peak_flops * len(jax.devices())
    final_eval = evals[-1] if evals else None
    budget = config.budget
    return TrainSummary(
        parameters=setup.parameters,
        steps=steps,
        tokens_seen=steps * config.tokens_per_step,
        final_loss=losses[-1] if losses else None,
        first_eval_loss=evals[0] if evals else None,
        final_eval_loss=final_eval,
        best_eval_loss=min(evals) if evals else None,
        mean_tokens_per_s=tokens_per_s,
        compile_s=setup.compile_s,
        wall_s=wall_s,
        model_flops_per_token=setup.flops_per_token,
        mfu=tokens_per_s * setup.flops_per_token / peak if tokens_per_s else None,
        peak_flops=peak,
        peak_flops_source=setup.peak_flops_source,
        final_eval_perplexity=math.exp(min(final_eval, 700.0)) if final_eval is not None else None,
        final_eval_bits_per_byte=bits_per_byte(setup, final_eval) if final_eval is not None else None,
        resumed_from_step=first_step or None,
        skipped_steps=skipped or None,
        train_s=train_s,
        time_budget_s=config.time_budget_s,
        budget_kind=budget.kind,
        budget=budget.size,
        budget_met=steps >= config.total_steps if budget.fixes_work else None,
        val_loss=val.loss if val else None,
        val_bpb=val.bits_per_byte if val else None,
        val_tokens=val.tokens if val else None,
        val_s=val.seconds if val else None,
        startup_s=clock.stages,
        first_update_s=clock.total_s if FIRST_UPDATE in clock.stages else None,
        step_memory_bytes=hbm_needed(setup.train_step.memory_analysis()),
        device_memory_bytes=(jax.local_devices()[0].memory_stats() or {}).get("bytes_limit"),
    )
