"""The training loop: `train(config, run_dir)` runs the updates and writes the run's files.

What lands in the run folder (see `RunLayout`): `metrics.jsonl` rows as described in
`tradewind.trainer.metrics`, one log line per row on stdout, an orbax checkpoint of the final state, and
`summary.json` last, so a summary means the run finished.

The loop waits for the device only when it writes a row; in between, it reads the next batch from the
token cache while the device runs the step it has just dispatched.

Run it as a process with `python -m tradewind.trainer RUN_DIR`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax
import numpy as np

from tradewind.core import InvalidInputError, TradewindError, append_jsonl, atomic_write_json
from tradewind.trainer.checkpoint import save_checkpoint
from tradewind.trainer.config import TrainConfig
from tradewind.trainer.layout import RunLayout
from tradewind.trainer.metrics import MetricRow, TrainSummary
from tradewind.trainer.step import TrainSetup, evaluate, setup_training


def train(config: TrainConfig, run_dir: Path) -> TrainSummary:
    """Train a model as `config` says, writing metrics, a checkpoint and the summary into `run_dir`.

    Args:
        config: the run's settings.
        run_dir: the run folder; created if missing. If it has no `config.json`, `config` is written there.

    Returns:
        The summary, also written to `summary.json`.

    Raises:
        TradewindError: the training loss became NaN or infinite (the message names the step).
        InvalidInputError: the run folder already holds metrics or checkpoints of an earlier run.
        NotFoundError, ConfigError: as `setup_training`.
    """
    start = time.perf_counter()
    layout = RunLayout(Path(run_dir))
    _claim_run_dir(layout, config)
    setup = setup_training(config)
    print(
        f"model {setup.model_config.type}: {setup.parameters:,} parameters, vocab {setup.model_config.vocab_size}; "
        f"compiled in {setup.compile_s:.1f}s",
        flush=True,
    )

    params, opt_state = setup.params, setup.opt_state
    eval_losses = [evaluate(setup, params)]
    _write_row(layout, MetricRow(step=0, eval_loss=eval_losses[0], elapsed=time.perf_counter() - start), config)

    losses: list[jax.Array] = []  # per-step losses since the last log row, still on the device
    final_loss = math.nan
    train_s = 0.0  # seconds spent in train steps over the whole run
    interval_s = 0.0  # ... and since the last log row
    batch = setup.train_loader.batch(0)
    timer = time.perf_counter()
    for step in range(1, config.steps + 1):
        params, opt_state, metrics = setup.train_step(params, opt_state, batch)
        losses.append(metrics["loss"])
        if step < config.steps:
            batch = setup.train_loader.batch(step)  # read while the device computes
        is_log = step % config.log_every == 0 or step == config.steps
        is_eval = step % config.eval_every == 0 or step == config.steps
        if not (is_log or is_eval):
            continue

        jax.block_until_ready(metrics)
        stepping_s = time.perf_counter() - timer
        train_s += stepping_s
        interval_s += stepping_s
        step_losses = np.asarray(jax.device_get(losses), dtype=np.float64)
        _check_finite(step_losses, first_step=step - len(losses) + 1)
        fields: dict[str, float] = {}
        if is_log:
            final_loss = float(step_losses.mean())
            fields.update(
                loss=final_loss,
                lr=float(setup.schedule(step - 1)),
                grad_norm=float(metrics["grad_norm"]),
                tokens_per_s=len(losses) * config.tokens_per_step / interval_s,
            )
            losses, interval_s = [], 0.0
        if is_eval:
            fields["eval_loss"] = evaluate(setup, params)
            eval_losses.append(fields["eval_loss"])
        _write_row(layout, MetricRow(step=step, elapsed=time.perf_counter() - start, **fields), config)
        timer = time.perf_counter()  # evaluation and writing stay out of the step timing

    if config.checkpoint:
        folder = save_checkpoint(layout.checkpoints, config.steps, params, opt_state)
        print(f"checkpoint saved to {folder}", flush=True)
    summary = _summarise(setup, final_loss, eval_losses, train_s, time.perf_counter() - start)
    atomic_write_json(layout.summary, summary.model_dump())
    print(
        f"done: {summary.steps} steps, final loss {summary.final_loss:.4f}, eval loss "
        f"{summary.first_eval_loss:.4f} -> {summary.final_eval_loss:.4f}, {summary.mean_tokens_per_s:,.0f} tok/s, "
        f"{summary.wall_s:.1f}s",
        flush=True,
    )
    return summary


def _claim_run_dir(layout: RunLayout, config: TrainConfig) -> None:
    """Create the run folder, refusing one that an earlier run already wrote into."""
    leftovers = [p for p in (layout.metrics, layout.summary, layout.checkpoints) if p.exists()]
    if leftovers:
        names = ", ".join(p.name for p in leftovers)
        raise InvalidInputError(f"run folder {layout.root} already holds {names} from an earlier run; use a new folder")
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
            "add warmup or check the data"
        )


def _write_row(layout: RunLayout, row: MetricRow, config: TrainConfig) -> None:
    """Append `row` to metrics.jsonl and print it as one line."""
    append_jsonl(layout.metrics, row.model_dump(exclude_none=True))
    parts = [f"step {row.step}/{config.steps}"]
    if row.loss is not None:
        parts += [
            f"loss {row.loss:.4f}",
            f"lr {row.lr:.2e}",
            f"grad_norm {row.grad_norm:.3f}",
            f"{row.tokens_per_s:,.0f} tok/s",
        ]
    if row.eval_loss is not None:
        parts.append(f"eval_loss {row.eval_loss:.4f}")
    parts.append(f"{row.elapsed:.1f}s")
    print(" | ".join(parts), flush=True)


def _summarise(
    setup: TrainSetup, final_loss: float, eval_losses: list[float], train_s: float, wall_s: float
) -> TrainSummary:
    config = setup.config
    tokens_seen = config.steps * config.tokens_per_step
    return TrainSummary(
        parameters=setup.parameters,
        steps=config.steps,
        tokens_seen=tokens_seen,
        final_loss=final_loss,
        first_eval_loss=eval_losses[0],
        final_eval_loss=eval_losses[-1],
        best_eval_loss=min(eval_losses),
        mean_tokens_per_s=tokens_seen / train_s,
        compile_s=setup.compile_s,
        wall_s=wall_s,
    )
