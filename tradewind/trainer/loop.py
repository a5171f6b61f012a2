"""The training loop: `train(config, run_dir)` runs the updates and writes the run's files.

What lands in the run folder (see `RunLayout`): `metrics.jsonl` rows as described in
`tradewind.trainer.metrics`, the same scalars as TensorBoard event files under `tensorboard/` (and in
W&B when `wandb_project` is set and `wandb` is installed), one log line per row on stdout, orbax
checkpoints as `checkpoints` says, `run.json` (the run record, see `tradewind.trainer.record`) and
`summary.json` last, so a summary means the run finished. A step's metrics row is written before its
checkpoint, so every checkpoint has the rows up to its step on disk.

A run folder that holds checkpoints but no summary (a run killed mid-way, or killed after its last
checkpoint) is resumed from its newest readable checkpoint: parameters, optimizer state, step, data
position and RNG come back, metrics rows past that step are dropped, and the run ends with the same
parameters as one that was never stopped. The summary is computed from the metrics rows, so a run that
resumes at its last step (nothing left to train) writes the same summary as one that was never stopped.
With `resume_from`, a new run starts from another run's newest checkpoint and copies its rows up to it.

The loop waits for the device only when it writes a row; in between, it reads the next batch from the
token cache while the device runs the step it has just dispatched.

As a job, the backends run `train_job(run_dir=..., config=...)` (a `TrainJob`); by hand,
`python -m tradewind.trainer RUN_DIR` trains the config.json in RUN_DIR.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tradewind.cluster.jobs import JobStatus, distributed_env
from tradewind.core import (
    ConfigError,
    InvalidInputError,
    TradewindError,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    parse_config,
)
from tradewind.trainer.checkpoint import Checkpointer, read_checkpoint
from tradewind.trainer.config import TrainConfig
from tradewind.trainer.distributed import check_devices, initialize_distributed, is_main_process
from tradewind.trainer.jobs import TrainJob
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.metrics import MetricRow, TrainSummary, read_metrics
from tradewind.trainer.record import read_record, record_end, record_start
from tradewind.trainer.step import TrainSetup, evaluate, setup_training
from tradewind.trainer.tensorboard import EventWriter

# progress(step, total_steps, row or None): called after every update and with each metrics row.
TrainProgress = Callable[[int, int, MetricRow | None], None]


class RunWriters:
    """Where a metrics row goes: metrics.jsonl, stdout, TensorBoard and W&B (process 0 only).

    Keeps every row of the run (`rows`, starting with those restored), from which the summary is made.
    """

    def __init__(self, layout: RunLayout, config: TrainConfig, progress: TrainProgress | None, rows: list[MetricRow]):
        self.layout, self.config, self.progress = layout, config, progress
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
        _print_row(row, self.config)
        if self.progress is not None:
            self.progress(row.step, self.config.steps, row)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self.wandb is not None:
            self.wandb.finish()


def train(config: TrainConfig, run_dir: Path, progress: TrainProgress | None = None) -> TrainSummary:
    """Train a model as `config` says, writing metrics, checkpoints, the run record and the summary into `run_dir`.

    Args:
        config: the run's settings (`config.dataset` and `config.resume_from` are folders by now).
        run_dir: the run folder; created if missing. If it has no `config.json`, `config` is written there,
            and if it has no `run.json`, one is made (backend "process"). If it holds checkpoints of an
            unfinished run (and `config.resume`), training resumes from them.
        progress: optional callback, see `TrainProgress`.

    Returns:
        The summary, also written to `summary.json`.

    Raises:
        TradewindError: the training loss became NaN or infinite (the message names the step).
        InvalidInputError: the run folder holds a finished run, or (with `resume` off) an earlier one.
        ConfigError: JAX could not start the devices asked for, or could not reach the other processes.
        NotFoundError, ConfigError: as `setup_training`.
    """
    start = time.perf_counter()
    layout = RunLayout(Path(run_dir))
    try:
        initialize_distributed(config.distributed)
        platform = check_devices(config.accelerator)
        _check_gang(config)
    except TradewindError as error:
        gang = distributed_env()
        if layout.record.exists() and (gang is None or gang.process_id == 0):
            record_end(layout.record, JobStatus.FAILED, str(error))  # the launcher's record says why
        raise
    _claim_run_dir(layout, config)
    if is_main_process():
        record_start(
            layout.record, layout.root.name, config.accelerator, jax.process_count(), platform, jax.device_count()
        )
    try:
        summary = _train(config, layout, progress, start)
    except BaseException as error:
        if is_main_process():
            reason = str(error) if isinstance(error, TradewindError) else f"{type(error).__name__}: {error}"
            record_end(layout.record, JobStatus.FAILED, reason)
        raise
    if is_main_process():
        atomic_write_json(layout.summary, summary.model_dump())
        record_end(layout.record, JobStatus.SUCCEEDED)
    return summary


def train_job(**job: Any) -> None:
    """The entry of a training job: validates its keyword arguments as a `TrainJob` and trains."""
    request = parse_config(TrainJob, job, source="train job")
    train(request.config, Path(request.run_dir))


def _train(config: TrainConfig, layout: RunLayout, progress: TrainProgress | None, start: float) -> TrainSummary:
    initial = None
    if config.init_from:
        from tradewind.trainer.hf import check_matches_hf, load_hf_params

        check_matches_hf(config.model, Path(config.init_from))  # never train silently with other values
        _, initial = load_hf_params(Path(config.init_from))
    setup = setup_training(config, initial_params=initial)
    print(
        f"model {setup.model_config.type}: {setup.parameters:,} parameters, vocab {setup.model_config.vocab_size}, "
        f"{setup.flops_per_token / 1e6:,.2f} MFLOP/token; mesh {dict(setup.mesh.shape)} over "
        f"{jax.process_count()} process(es); compiled in {setup.compile_s:.1f}s; peak FLOP/s "
        f"{setup.peak_flops:.3g}/device ({setup.peak_flops_source})",
        flush=True,
    )

    checkpointer = Checkpointer(layout.checkpoints, config.checkpoints) if config.checkpoint else None
    params, opt_state, first_step, rows = _initial_state(setup, checkpointer, layout)
    writers = RunWriters(layout, config, progress, rows)
    if first_step == 0:
        writers.write(_eval_row(setup, 0, evaluate(setup, params), time.perf_counter() - start))
    else:
        print(f"resumed from checkpoint {first_step}", flush=True)

    total_devices = len(jax.devices())
    losses: list[jax.Array] = []  # per-step metrics since the last log row, still on the device
    interval_s = 0.0
    batch = setup.put_batch(setup.train_loader.batch(first_step))
    timer = time.perf_counter()
    try:
        for step in range(first_step + 1, config.steps + 1):
            params, opt_state, metrics = setup.train_step(params, opt_state, batch)
            losses.append(metrics)
            if step < config.steps:
                batch = setup.put_batch(setup.train_loader.batch(step))  # read while the device computes
            if progress is not None:
                progress(step, config.steps, None)
            is_log = step % config.log_every == 0 or step == config.steps
            is_eval = step % config.eval_every == 0 or step == config.steps
            is_save = checkpointer is not None and checkpointer.should_save(step, final=step == config.steps)
            if checkpointer is not None and config.checkpoints.every_minutes:
                is_save = _agree(is_save)
            if not (is_log or is_eval or is_save):
                continue

            jax.block_until_ready(metrics)
            interval_s += time.perf_counter() - timer
            fields: dict[str, Any] = {}
            if is_log or is_eval:
                host = [{k: _to_host(v) for k, v in m.items()} for m in losses]
                step_losses = np.asarray([m["loss"] for m in host], dtype=np.float64)
                if config.on_nonfinite == "stop":
                    _check_finite(step_losses, first_step=step - len(losses) + 1)
                if is_log:
                    finite = step_losses[np.isfinite(step_losses)]
                    tokens_per_s = len(losses) * config.tokens_per_step / interval_s
                    fields.update(
                        loss=float(finite.mean()) if finite.size else None,
                        lr=float(setup.schedule(step - 1)),
                        grad_norm=float(host[-1]["grad_norm"]),
                        param_norm=float(host[-1]["param_norm"]),
                        tokens_per_s=tokens_per_s,
                        step_time_s=interval_s / len(losses),
                        mfu=tokens_per_s * setup.flops_per_token / (setup.peak_flops * total_devices),
                        skipped_steps=int(sum(float(m["skipped"]) for m in host)) or None,
                    )
                    losses, interval_s = [], 0.0
            if is_eval:
                writers.write(_eval_row(setup, step, evaluate(setup, params), time.perf_counter() - start, **fields))
            elif is_log:
                writers.write(MetricRow(step=step, elapsed=time.perf_counter() - start, **fields))
            if is_save:
                # After the row, so that a checkpoint never exists without the rows up to its step. The save
                # copies the arrays before the next step donates them; writing goes on behind.
                rng = np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(config.seed), step)))
                checkpointer.save(
                    step, {"params": params, "opt_state": opt_state, "step": step, "data_step": step, "rng": rng}
                )
            timer = time.perf_counter()  # evaluation, saving and writing stay out of the step timing
        # Rows are written before checkpoints, so this happens only when metrics.jsonl lost rows (or was
        # removed) after the last checkpoint. Process 0 decides: evaluating is a collective on every process.
        if _agree(not any(row.step == config.steps and row.eval_loss is not None for row in writers.rows)):
            writers.write(_eval_row(setup, config.steps, evaluate(setup, params), time.perf_counter() - start))
    finally:
        if checkpointer is not None:
            checkpointer.close()
        writers.close()

    summary = _summarise(setup, writers.rows, time.perf_counter() - start, first_step)
    print(
        f"done: {summary.steps} steps, final loss {_figure(summary.final_loss)}, eval loss "
        f"{_figure(summary.first_eval_loss)} -> {_figure(summary.final_eval_loss)}, "
        f"{summary.mean_tokens_per_s or 0:,.0f} tok/s, MFU {summary.mfu or 0:.2%}, {summary.wall_s:.1f}s",
        flush=True,
    )
    return summary


def _initial_state(
    setup: TrainSetup, checkpointer: Checkpointer | None, layout: RunLayout
) -> tuple[Any, Any, int, list[MetricRow]]:
    """The state to start from: this run's newest readable checkpoint, else its parent's (`resume_from`),
    else a fresh one. Returns `(params, opt_state, step, metrics rows up to that step)`.

    The rows on disk are cut (or, from a parent, copied) to those up to the step, so that the file holds
    exactly the history of the state training continues from.
    """
    config = setup.config
    rng = np.asarray(jax.random.key_data(jax.random.key(config.seed)))
    like = {"params": setup.params, "opt_state": setup.opt_state, "step": 0, "data_step": 0, "rng": rng}
    if checkpointer is not None and config.resume and checkpointer.steps():
        state, step = checkpointer.restore(like)
        history = layout.metrics
    elif config.resume_from is not None:
        # The launcher chose the parent's checkpoint; a parent still training may have saved newer ones since.
        chosen = read_record(layout.record).parent_step if layout.record.exists() else None
        parent = RunLayout(Path(config.resume_from))
        state, step = read_checkpoint(parent.checkpoints, like, chosen)
        if step >= config.steps:
            raise InvalidInputError(
                f"steps: {config.steps} is the run's total and must exceed the step of the checkpoint of "
                f"{parent.root.name} it continues from ({step})"
            )
        history = parent.metrics
    else:
        if layout.metrics.exists() and is_main_process():
            layout.metrics.unlink()  # rows of an attempt that never reached a checkpoint
        return setup.params, setup.opt_state, 0, []
    rows = [row for row in read_metrics(history) if row.step <= step]
    if is_main_process():  # atomically: the other processes of a gang may be reading it
        atomic_write_text(layout.metrics, "".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    return state["params"], state["opt_state"], int(state["data_step"]), rows


def _check_gang(config: TrainConfig) -> None:
    """Refuse a cpu or gpu run of `replicas` processes that finds itself alone (trained without a launcher)."""
    if config.replicas > 1 and jax.process_count() != config.replicas:
        raise ConfigError(
            f"replicas: the run asks for {config.replicas} processes but {jax.process_count()} joined; start it "
            "with launch_training or `tradewind train`, whose backend starts the gang, or set replicas to 1"
        )


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _finite(row: MetricRow) -> MetricRow:
    """`row` without NaN or infinite figures (JSON has no such numbers; `skipped_steps` tells of them)."""
    values = row.model_dump()
    return MetricRow(**{k: v for k, v in values.items() if not (isinstance(v, float) and not math.isfinite(v))})


def _agree(decision: bool) -> bool:
    """Process 0's decision on every process (a wall-clock save policy could differ between hosts)."""
    if jax.process_count() == 1:
        return decision
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(decision)))


def _to_host(x: jax.Array) -> np.ndarray:
    """A replicated array's value, also when other processes hold parts of the mesh."""
    return np.asarray(x if x.is_fully_addressable else x.addressable_data(0))


def _eval_row(setup: TrainSetup, step: int, eval_loss: float, elapsed: float, **fields: Any) -> MetricRow:
    return MetricRow(
        step=step,
        eval_loss=eval_loss,
        eval_perplexity=math.exp(min(eval_loss, 700.0)),
        eval_bits_per_byte=_bits_per_byte(setup, eval_loss),
        elapsed=elapsed,
        **fields,
    )


def _bits_per_byte(setup: TrainSetup, loss: float) -> float | None:
    """Nats per token -> bits per UTF-8 byte, using the val split's bytes-per-token ratio."""
    if setup.val_bytes_per_token is None:
        return None
    return loss / math.log(2) / setup.val_bytes_per_token


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


def _check_finite(step_losses: np.ndarray, first_step: int) -> None:
    """Raise if a loss is NaN or infinite, naming the first step where it happened."""
    bad = np.flatnonzero(~np.isfinite(step_losses))
    if bad.size:
        step = first_step + int(bad[0])
        raise TradewindError(
            f"training loss became {step_losses[bad[0]]} at step {step}; lower optimizer.learning_rate, "
            "add warmup, check the data, or set on_nonfinite: skip"
        )


def _print_row(row: MetricRow, config: TrainConfig) -> None:
    """One log line per row, of the figures it has (a skipped step has no grad norm, say)."""
    shown = (
        ("loss", row.loss, "{:.4f}"),
        ("lr", row.lr, "{:.2e}"),
        ("grad_norm", row.grad_norm, "{:.3f}"),
        ("tok/s", row.tokens_per_s, "{:,.0f}"),
        ("MFU", row.mfu, "{:.1%}"),
        ("eval_loss", row.eval_loss, "{:.4f}"),
    )
    parts = [f"step {row.step}/{config.steps}"]
    parts += [f"{name} {form.format(value)}" for name, value, form in shown if value is not None]
    print(" | ".join([*parts, f"{row.elapsed:.1f}s"]), flush=True)


def _start_wandb(config: TrainConfig, layout: RunLayout) -> Any:
    try:
        import wandb
    except ImportError:
        print("wandb_project is set but wandb is not installed (pip install 'tradewind[wandb]'); skipping W&B")
        return None
    return wandb.init(project=config.wandb_project, name=layout.root.name, config=config.model_dump(mode="json"))


def _summarise(setup: TrainSetup, rows: list[MetricRow], wall_s: float, first_step: int) -> TrainSummary:
    """The run's summary, from its metrics rows: the same rows give the same figures, however often the
    run was stopped and resumed on the way."""
    config = setup.config
    evals = [row.eval_loss for row in rows if row.eval_loss is not None]
    logged = [row for row in rows if row.step_time_s is not None]
    covered = [row.step - previous.step for previous, row in zip([rows[0], *logged], logged, strict=False)]
    train_s = sum(updates * row.step_time_s for updates, row in zip(covered, logged, strict=True))
    tokens_per_s = sum(covered) * config.tokens_per_step / train_s if train_s > 0 else None
    losses = [row.loss for row in logged if row.loss is not None]
    skipped = sum(row.skipped_steps or 0 for row in rows)
    peak = setup.peak_flops * len(jax.devices())
    final_eval = evals[-1] if evals else None
    return TrainSummary(
        parameters=setup.parameters,
        steps=config.steps,
        tokens_seen=config.steps * config.tokens_per_step,
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
        final_eval_bits_per_byte=_bits_per_byte(setup, final_eval) if final_eval is not None else None,
        resumed_from_step=first_step or None,
        skipped_steps=skipped or None,
    )
