"""The training loop: `train(config, run_dir)` runs the updates and writes the run's files.

What lands in the run folder (see `RunLayout`): `metrics.jsonl` rows as described in
`tradewind.trainer.metrics`, the same scalars as TensorBoard event files under `tensorboard/` (and in
W&B when `wandb_project` is set and `wandb` is installed), one log line per row on stdout, orbax
checkpoints as `checkpoints` says, and `summary.json` last, so a summary means the run finished.

A run folder that holds checkpoints but no summary (a run killed mid-way) is resumed from its newest
readable checkpoint: parameters, optimizer state, step, data position and RNG come back, metrics rows
past that step are dropped, and the run ends with the same parameters as one that was never stopped.

The loop waits for the device only when it writes a row; in between, it reads the next batch from the
token cache while the device runs the step it has just dispatched.

Run it as a process with `python -m tradewind.trainer RUN_DIR`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tradewind.core import InvalidInputError, TradewindError, append_jsonl, atomic_write_json, read_jsonl
from tradewind.trainer.checkpoint import Checkpointer
from tradewind.trainer.config import TrainConfig
from tradewind.trainer.distributed import initialize_distributed, is_main_process
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.metrics import MetricRow, TrainSummary
from tradewind.trainer.step import TrainSetup, evaluate, setup_training
from tradewind.trainer.tensorboard import EventWriter

# progress(step, total_steps, row or None): called after every update and with each metrics row.
TrainProgress = Callable[[int, int, MetricRow | None], None]


class RunWriters:
    """Where a metrics row goes: metrics.jsonl, stdout, TensorBoard and W&B (process 0 only)."""

    def __init__(self, layout: RunLayout, config: TrainConfig, progress: TrainProgress | None):
        self.layout, self.config, self.progress = layout, config, progress
        self.main = is_main_process()
        self.events = EventWriter(layout.tensorboard) if self.main and config.tensorboard else None
        self.wandb = _start_wandb(config, layout) if self.main and config.wandb_project else None

    def write(self, row: MetricRow) -> None:
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
    """Train a model as `config` says, writing metrics, checkpoints and the summary into `run_dir`.

    Args:
        config: the run's settings.
        run_dir: the run folder; created if missing. If it has no `config.json`, `config` is written there.
            If it holds checkpoints of an unfinished run (and `config.resume`), training resumes from them.
        progress: optional callback, see `TrainProgress`.

    Returns:
        The summary, also written to `summary.json`.

    Raises:
        TradewindError: the training loss became NaN or infinite (the message names the step).
        InvalidInputError: the run folder holds a finished run, or (with `resume` off) an earlier one.
        NotFoundError, ConfigError: as `setup_training`.
    """
    start = time.perf_counter()
    initialize_distributed(config.distributed)
    layout = RunLayout(Path(run_dir))
    _claim_run_dir(layout, config)
    initial = None
    if config.init_from:
        from tradewind.trainer.hf import load_hf_params

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
    params, opt_state, first_step, eval_losses = _initial_state(setup, checkpointer, layout)
    resumed_from = first_step if first_step > 0 else None
    writers = RunWriters(layout, config, progress)
    if first_step == 0:
        eval_losses.append(evaluate(setup, params))
        writers.write(_eval_row(setup, 0, eval_losses[0], time.perf_counter() - start))
    else:
        print(f"resumed from checkpoint {first_step}", flush=True)

    total_devices = len(jax.devices())
    losses: list[jax.Array] = []  # per-step metrics since the last log row, still on the device
    skipped_total = 0
    final_loss = math.nan
    train_s = 0.0  # seconds spent in train steps over this process's part of the run
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
            stepping_s = time.perf_counter() - timer
            train_s += stepping_s
            interval_s += stepping_s
            fields: dict[str, Any] = {}
            if is_log or is_eval:
                host = [{k: _to_host(v) for k, v in m.items()} for m in losses]
                step_losses = np.asarray([m["loss"] for m in host], dtype=np.float64)
                skipped = int(sum(float(m["skipped"]) for m in host))
                skipped_total += skipped
                if config.on_nonfinite == "stop":
                    _check_finite(step_losses, first_step=step - len(losses) + 1)
                if is_log:
                    finite = step_losses[np.isfinite(step_losses)]
                    final_loss = float(finite.mean()) if finite.size else math.nan
                    tokens_per_s = len(losses) * config.tokens_per_step / interval_s
                    fields.update(
                        loss=final_loss,
                        lr=float(setup.schedule(step - 1)),
                        grad_norm=float(host[-1]["grad_norm"]),
                        param_norm=float(host[-1]["param_norm"]),
                        tokens_per_s=tokens_per_s,
                        step_time_s=interval_s / len(losses),
                        mfu=tokens_per_s * setup.flops_per_token / (setup.peak_flops * total_devices),
                    )
                    if skipped:
                        fields["skipped_steps"] = skipped
                    losses, interval_s = [], 0.0
            if is_save:
                # The save copies the arrays before the next step donates them; writing goes on behind.
                rng = np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(config.seed), step)))
                checkpointer.save(
                    step, {"params": params, "opt_state": opt_state, "step": step, "data_step": step, "rng": rng}
                )
            if is_eval:
                eval_losses.append(evaluate(setup, params))
                row = _eval_row(setup, step, eval_losses[-1], time.perf_counter() - start, **fields)
                writers.write(row)
            elif is_log:
                writers.write(MetricRow(step=step, elapsed=time.perf_counter() - start, **fields))
            timer = time.perf_counter()  # evaluation, saving and writing stay out of the step timing
    finally:
        if checkpointer is not None:
            checkpointer.close()
        writers.close()

    summary = _summarise(
        setup, final_loss, eval_losses, train_s, time.perf_counter() - start, first_step, skipped_total, resumed_from
    )
    if is_main_process():
        atomic_write_json(layout.summary, summary.model_dump())
    print(
        f"done: {summary.steps} steps, final loss {summary.final_loss:.4f}, eval loss "
        f"{_figure(summary.first_eval_loss)} -> {_figure(summary.final_eval_loss)}, "
        f"{summary.mean_tokens_per_s:,.0f} tok/s, "
        f"MFU {summary.mfu:.2%}, {summary.wall_s:.1f}s",
        flush=True,
    )
    return summary


def _initial_state(
    setup: TrainSetup, checkpointer: Checkpointer | None, layout: RunLayout
) -> tuple[Any, Any, int, list[float]]:
    """Fresh state, or the newest readable checkpoint's when the folder has one and resuming is on.

    Returns `(params, opt_state, step, eval losses logged so far)`.
    """
    config = setup.config
    if checkpointer is None or not config.resume or not checkpointer.steps():
        if layout.metrics.exists() and is_main_process():
            layout.metrics.unlink()  # rows of an attempt that never reached a checkpoint
        return setup.params, setup.opt_state, 0, []
    rng = np.asarray(jax.random.key_data(jax.random.key(config.seed)))
    like = {"params": setup.params, "opt_state": setup.opt_state, "step": 0, "data_step": 0, "rng": rng}
    state, step = checkpointer.restore(like)
    rows = [row for row in read_jsonl(layout.metrics) if row["step"] <= step]
    if is_main_process():
        layout.metrics.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    eval_losses = [row["eval_loss"] for row in rows if row.get("eval_loss") is not None]
    return state["params"], state["opt_state"], int(state["data_step"]), eval_losses


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


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
    parts = [f"step {row.step}/{config.steps}"]
    if row.loss is not None:
        parts += [
            f"loss {row.loss:.4f}",
            f"lr {row.lr:.2e}",
            f"grad_norm {row.grad_norm:.3f}",
            f"{row.tokens_per_s:,.0f} tok/s",
            f"MFU {row.mfu:.1%}",
        ]
    if row.eval_loss is not None:
        parts.append(f"eval_loss {row.eval_loss:.4f}")
    parts.append(f"{row.elapsed:.1f}s")
    print(" | ".join(parts), flush=True)


def _start_wandb(config: TrainConfig, layout: RunLayout) -> Any:
    try:
        import wandb
    except ImportError:
        print("wandb_project is set but wandb is not installed (pip install 'tradewind[wandb]'); skipping W&B")
        return None
    return wandb.init(project=config.wandb_project, name=layout.root.name, config=config.model_dump(mode="json"))


def _summarise(
    setup: TrainSetup,
    final_loss: float,
    eval_losses: list[float],
    train_s: float,
    wall_s: float,
    first_step: int,
    skipped: int,
    resumed_from: int | None,
) -> TrainSummary:
    config = setup.config
    tokens_trained = (config.steps - first_step) * config.tokens_per_step
    tokens_per_s = tokens_trained / train_s if train_s > 0 else 0.0
    peak = setup.peak_flops * len(jax.devices())
    final_eval = eval_losses[-1] if eval_losses else None
    return TrainSummary(
        parameters=setup.parameters,
        steps=config.steps,
        tokens_seen=config.steps * config.tokens_per_step,
        final_loss=final_loss,
        first_eval_loss=eval_losses[0] if eval_losses else None,
        final_eval_loss=final_eval,
        best_eval_loss=min(eval_losses) if eval_losses else None,
        mean_tokens_per_s=tokens_per_s,
        compile_s=setup.compile_s,
        wall_s=wall_s,
        model_flops_per_token=setup.flops_per_token,
        mfu=tokens_per_s * setup.flops_per_token / peak,
        peak_flops=peak,
        peak_flops_source=setup.peak_flops_source,
        final_eval_perplexity=math.exp(min(final_eval, 700.0)) if final_eval is not None else None,
        final_eval_bits_per_byte=_bits_per_byte(setup, final_eval) if final_eval is not None else None,
        resumed_from_step=resumed_from,
        skipped_steps=skipped or None,
    )
