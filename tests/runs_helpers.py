"""Helpers the run tests share: finish a run, read its losses, write a run folder with made-up metrics, hold a
run PENDING."""

import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polling import wait_until

from tradewind.cluster import JobSpec, JobStatus, Resources
from tradewind.cluster.process import process_start_time
from tradewind.core import atomic_write_json
from tradewind.runs import MetricRow, RunLayout, RunRecord, TrainConfig, TrainSummary, read_metrics, write_record
from tradewind.tools import (
    LaunchTrainingRequest,
    RunInfo,
    RunRequest,
    ToolContext,
    WaitForRunRequest,
    WaitForRunResult,
    cancel_run,
    launch_training,
    wait_for_run,
)
from tradewind.tools.context import Cancelled
from tradewind.tools.sweep_controller import SweepState, TrialState, write_state
from tradewind.tools.sweeps import SweepRequest, get_sweep


def cpu_devices_env(devices: int) -> dict[str, str]:
    """This process's environment for a Python whose JAX has `devices` CPU devices (the suite's XLA flags kept)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def finish(ctx: ToolContext, run_id: str, timeout_s: float = 300) -> WaitForRunResult:
    """Wait for the run to end; fail if it has not ended within `timeout_s`."""
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run_id, timeout_s=timeout_s))
    assert not done.timed_out, f"run {run_id} still {done.status} after {timeout_s} s"
    return done


def losses(ctx: ToolContext, run_id: str) -> list[tuple[int, float]]:
    """`(step, training loss)` of every logged row of the run."""
    rows = read_metrics(RunLayout(ctx.workspace.run_dir(run_id)).metrics)
    return [(row.step, row.loss) for row in rows if row.loss is not None]


STEPS = 2_500
TOKENS_PER_STEP = 4_096


def metric_rows(steps: int = STEPS, eval_every: int = 50, every_field: bool = False) -> list[MetricRow]:
    """A run's rows: a loss that falls with a dip at step 1234, an eval row every `eval_every` steps; with
    `every_field`, every field of every row set to a long-printing number."""
    rows = []
    for step in range(steps + 1):
        step_time_s = 0.1 + (step % 7) * 0.01
        loss = 5.0 / (1 + step / 300) + (step % 11) * 1e-3 - (1.0 if step == 1234 else 0.0)
        fields = {"step": step, "elapsed": step * 0.123456789}
        if step > 0:
            fields.update(
                loss=loss,
                lr=3e-4 * (1 - step / (steps + 1)) + 1.234567e-11,
                grad_norm=1.23456789 + step % 5,
                tokens_per_s=TOKENS_PER_STEP / step_time_s,
                step_time_s=step_time_s,
                mfu=0.1234567891 * (1 + step % 3),
            )
        if step % eval_every == 0 or step == steps or every_field:
            eval_loss = loss + 0.1 - (1.5 if step == 2000 else 0.0)
            fields.update(eval_loss=eval_loss, eval_perplexity=math.exp(eval_loss), eval_bits_per_byte=eval_loss / 5.5)
        if every_field:
            fields.update(param_norm=-1.2345678901e-05 * step, skipped_steps=step, loss=-loss * 1.234567e-7)
        rows.append(MetricRow(**fields))
    return rows


def write_run(ctx: ToolContext, run_id: str, rows: list[MetricRow], record: RunRecord | None = None) -> RunLayout:
    """A run folder with these metrics rows and, given a record, that record and a config: a run as a Python
    call of `train` leaves it (backend 'process', no job)."""
    layout = RunLayout(ctx.workspace.runs_dir / run_id)
    layout.root.mkdir(parents=True)
    layout.metrics.write_text("".join(row.model_dump_json(exclude_none=True) + "\n" for row in rows))
    if record is not None:
        write_record(layout.record, record)
        atomic_write_json(layout.config, TrainConfig(dataset="datasets/ds-gone").model_dump(mode="json"))
    return layout


def table_run(
    ctx: ToolContext,
    run_id: str,
    final_eval_loss: float,
    *,
    running: bool = False,
    steps: int = 300,
    **record: Any,
) -> RunLayout:
    """A run folder as the trainer leaves it (`write_run`'s rows, shifted so that the last eval loss is
    `final_eval_loss`, a log, and, once finished, its summary); `running`: RUNNING, trained by this process (its
    pid and start time in the record, as a Python call of `train` writes them), so that get_run says RUNNING."""
    rows = metric_rows(steps, eval_every=50)
    shift = final_eval_loss - rows[-1].eval_loss
    rows = [row.model_copy(update={"eval_loss": row.eval_loss + shift}) if row.eval_loss else row for row in rows]
    fields = {"run_id": run_id, "backend": "process", "host": socket.gethostname(), "devices": 1, **record}
    fields["started_at"] = fields.get("started_at", "2026-12-06T10:00:00.000+00:00")
    if running:
        fields.update(status=JobStatus.RUNNING, pid=os.getpid(), pid_start=process_start_time(os.getpid()))
    else:
        fields.update(status=JobStatus.SUCCEEDED, ended_at="2026-12-06T10:05:00.000+00:00")
    layout = write_run(ctx, run_id, rows, RunRecord(**fields))
    layout.log.write_text(f"training {run_id}\n", encoding="utf-8")
    if not running:
        summary = TrainSummary(
            parameters=123_456,
            steps=steps,
            tokens_seen=steps * TrainConfig(dataset="-").batch_size * TrainConfig(dataset="-").seq_len,
            final_loss=rows[-1].loss,
            first_eval_loss=rows[0].eval_loss,
            final_eval_loss=final_eval_loss,
            best_eval_loss=min(row.eval_loss for row in rows if row.eval_loss is not None),
            mean_tokens_per_s=40_000.0,
            compile_s=2.0,
            wall_s=300.0,
            mfu=0.25,
            val_bpb=final_eval_loss / 5.5,
        )
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))
    return layout


@contextmanager
def pending_run(ctx: ToolContext, dataset: str, settings: dict) -> Iterator[RunInfo]:
    """A run that stays PENDING and never trains: a job holding every CPU of the local backend is admitted first,
    so the run queues behind it. On exit the run is cancelled and the hold released."""
    release = Path(tempfile.mkdtemp(prefix="tradewind-hold-")) / "release"
    hold = ctx.backend.submit(
        JobSpec(
            name="hold",
            command=["bash", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"],
            resources=Resources(cpus=ctx.backend.capacity.cpus),
        )
    )
    try:
        wait_until(lambda: ctx.backend.status(hold.id).status is JobStatus.RUNNING, what="the hold job to start")
        run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=10, **settings))
        try:
            assert run.status is JobStatus.PENDING, run
            yield run
        finally:
            cancel_run(ctx, RunRequest(run_id=run.run_id))
    finally:
        release.touch()
        ctx.backend.wait(hold.id, timeout=30)


HAND_MADE_CONFIG = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64},
    "batch_size": 8,
    "seq_len": 32,
}


def hand_made_run(ctx: ToolContext, dataset: str, run_id: str = "r1") -> RunLayout:
    """A run folder as a run leaves it (a tiny config on `dataset`, a `checkpoints/10/` folder) that nothing
    trained: for the tools' refusals that must come before any job starts."""
    layout = RunLayout(ctx.workspace.run_dir(run_id, must_exist=False))
    (layout.checkpoints / "10").mkdir(parents=True)
    layout.config.write_text(TrainConfig(dataset=dataset, **HAND_MADE_CONFIG).model_dump_json(), encoding="utf-8")
    return layout


class CancelAtFirstReport:
    """A tool's progress callback that cancels the call at its first report, as a client's cancel does, and
    notes when, so that a test can measure how soon the tool stopped after it."""

    def __init__(self):
        self.cancelled_at: float | None = None

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.cancelled_at = self.cancelled_at or time.monotonic()
        raise Cancelled("the client cancelled")

    def seconds_since(self) -> float:
        assert self.cancelled_at is not None, "the tool never reported progress, so it was never cancelled"
        return time.monotonic() - self.cancelled_at


def finish_sweep(ctx: ToolContext, sweep_id: str, timeout: float = 300):
    """Wait for the sweep to end (its status no longer running); fail if it has not within `timeout`."""
    return wait_until(
        lambda: (info := get_sweep(ctx, SweepRequest(sweep_id=sweep_id))).status != "running" and info,
        timeout,
        f"sweep {sweep_id} to end",
        interval=0.5,
    )


def workspace_with_dataset(ctx: ToolContext, dataset_id: str, root: Path) -> ToolContext:
    """A workspace of its own at `root` holding `ctx`'s dataset under the same id, its runs on the local backend:
    its ledger holds only the runs a test makes there."""
    fresh = ToolContext.open(root)
    shutil.copytree(ctx.workspace.dataset_dir(dataset_id), fresh.workspace.datasets_dir / dataset_id)
    (fresh.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    return fresh


def write_sweep(ctx: ToolContext, sweep_id: str, trials: list[TrialState], **fields) -> SweepState:
    """A sweep's state file as its controller would have left it (no controller runs)."""
    state = SweepState(
        sweep_id=sweep_id,
        job_id=sweep_id,
        method="grid",
        backend="local",
        max_concurrent=2,
        canary_steps=0,
        halving_tokens=[],
        halving_eta=2,
        trials=trials,
        **fields,
    )
    ctx.workspace.sweep_dir(sweep_id, must_exist=False).mkdir(parents=True)
    write_state(ctx, state)
    return state
