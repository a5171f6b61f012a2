"""The process that runs a sweep: launches its trials, gates them on a canary, and halves the losers.

`launch_sweep` (`tradewind.tools.sweeps`) plans the trials, writes `sweeps/<id>/sweep.json` and submits this
module's `run_sweep_job` as a long-lived job on the local backend (the trials go to the backend the sweep
names). The controller polls its trials every `POLL_S` seconds and rewrites `sweep.json` (atomically) after
each look; what it does goes to its log, `sweeps/<id>/controller.log`.

Successive halving (asynchronous, as ASHA and Optuna's `SuccessiveHalvingPruner` do it): a rung is a token
count. A trial's loss at a rung is the eval loss of its first metrics row with an eval loss at
`step * tokens_per_step >= rung`. When the controller first sees it, the loss joins the losses recorded at
that rung so far (every trial's, in the order the controller saw them, crashed trials' included), and the
decision is made once, then: with at least `halving_eta` losses recorded there, a trial whose rank (1 =
lowest; ties share the better rank) is worse than `count // halving_eta` is discarded (its record says why)
and cancelled if it still runs. With fewer, it goes on. Baseline reruns are never halved.

Entry (built by `launch_sweep`, not typed by hand): a callable job,
`tradewind.tools.sweep_controller:run_sweep_job` with `SweepJob` keyword arguments.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from tradewind.cluster.jobs import utc_now
from tradewind.core import TradewindError, atomic_write_json, configure_logging, get_logger, read_json
from tradewind.runs import RunLayout, read_metrics
from tradewind.runs.record import update_record
from tradewind.tools.bounds import cut
from tradewind.tools.context import ToolContext
from tradewind.tools.experiments import experiment
from tradewind.tools.launching import LaunchTrainingRequest, launch_training
from tradewind.tools.limits import LimitReached

CONTROLLER_CALLABLE = "tradewind.tools.sweep_controller:run_sweep_job"
STATE_FILE = "sweep.json"
LOG_FILE = "controller.log"
POLL_S = 0.5  # how often the controller looks at its trials

TrialStatus = Literal["pending", "running", "finished", "kept", "discarded", "crashed"]
SweepStatus = Literal["running", "succeeded", "failed", "cancelled"]
ENDED = ("finished", "kept", "discarded", "crashed")

log = get_logger(__name__)


class TrialState(BaseModel):
    """One launch of a sweep: a trial (its overrides of the base) or a baseline rerun of the parent."""

    index: int
    overrides: dict[str, Any]
    baseline: bool = False
    arguments: dict[str, Any] = Field(description="launch_training's arguments, validated when the sweep launched.")
    tokens_per_step: int
    run_id: str | None = None
    launched_at: str | None = None
    status: TrialStatus = "pending"
    metric: float | None = None
    reason: str | None = None
    rung_losses: list[float] = Field(default_factory=list, description="Eval loss at each rung reached, in order.")


class SweepState(BaseModel):
    """`sweeps/<id>/sweep.json`: the plan and how far it got; written by the controller, then by cancel_sweep."""

    model_config = ConfigDict(extra="forbid")

    sweep_id: str
    status: SweepStatus = "running"
    reason: str | None = None
    created_at: str = Field(default_factory=utc_now)
    ended_at: str | None = None
    job_id: str
    method: str
    backend: str
    note: str | None = None
    parent_run: str | None = None
    max_concurrent: int
    canary_steps: int
    canary_passed_at: str | None = None
    halving_tokens: list[int]
    halving_eta: int
    trials: list[TrialState]


class SweepJob(BaseModel):
    """The controller's arguments: how to reopen the workspace, and which sweep to run."""

    model_config = ConfigDict(extra="forbid")

    root: str
    allowed_paths: list[str] = Field(default_factory=list)
    code_paths: list[str] = Field(default_factory=list)
    sweep_id: str


class Outcome(NamedTuple):
    status: TrialStatus
    metric: float | None
    reason: str | None


def state_path(ctx: ToolContext, sweep_id: str) -> Path:
    return ctx.workspace.sweep_dir(sweep_id) / STATE_FILE


def read_state(ctx: ToolContext, sweep_id: str) -> SweepState:
    return SweepState.model_validate(read_json(state_path(ctx, sweep_id)))


def write_state(ctx: ToolContext, state: SweepState) -> None:
    atomic_write_json(state_path(ctx, state.sweep_id), state.model_dump(mode="json"))


def trial_outcome(ctx: ToolContext, run_id: str) -> Outcome:
    """Where a launched trial's run stands, as the experiment ledger says: its status, val_bpb and reason."""
    entry = experiment(ctx, run_id)
    return Outcome(entry.status, entry.val_bpb, entry.reason)


def rung_loss(rows: list[Any], tokens_per_step: int, rung: int) -> float | None:
    """The eval loss of the first row with one at or past `rung` tokens; None before the run gets there."""
    return next(
        (row.eval_loss for row in rows if row.eval_loss is not None and row.step * tokens_per_step >= rung), None
    )


def halving_rank(loss: float, recorded: list[float]) -> int:
    """The rank of `loss` among `recorded` (which holds it): 1 + how many are strictly lower."""
    return 1 + sum(other < loss for other in recorded)


def halving_verdict(loss: float, recorded: list[float], eta: int) -> str | None:
    """Why a trial whose `loss` just joined `recorded` at a rung is discarded, or None when it goes on."""
    if len(recorded) < eta:
        return None
    rank = halving_rank(loss, recorded)
    if rank <= len(recorded) // eta:
        return None
    return f"rank {rank} of {len(recorded)}"


class Controller:
    """One sweep's loop: look at the trials, halve, pass the canary, launch more, write the state."""

    def __init__(self, ctx: ToolContext, state: SweepState):
        self.ctx, self.state = ctx, state
        self.stop_requested = False

    def run(self) -> None:
        state = self.state
        log.info("sweep %s: %d launches, at most %d at once", state.sweep_id, len(state.trials), state.max_concurrent)
        while not self.stop_requested:
            self.look()
            if state.status == "running":
                self.launch_more()
            if state.status == "running" and all(trial.status in ENDED for trial in state.trials):
                self.finish()
            write_state(self.ctx, state)
            if state.status != "running":
                return
            time.sleep(POLL_S)
        log.info("sweep %s: stopped on request", state.sweep_id)

    def look(self) -> None:
        """Bring every active trial up to date: its rung losses (halving it if it lost), its status, the canary."""
        for trial in self.state.trials:
            if trial.run_id is None or trial.status in ENDED:
                continue
            outcome = trial_outcome(self.ctx, trial.run_id)
            rungs_left = not trial.baseline and len(trial.rung_losses) < len(self.state.halving_tokens)
            # A crashed run's losses still count at the rungs it reached, but it keeps its cause.
            if rungs_left and self.check_rungs(trial, halve=outcome.status != "crashed"):
                outcome = trial_outcome(self.ctx, trial.run_id)
            trial.status, trial.metric, trial.reason = outcome
            if trial.status in ENDED:
                log.info("trial %d (%s): %s %s", trial.index, trial.run_id, trial.status, trial.reason or "")
        self.check_canary()

    def check_rungs(self, trial: TrialState, halve: bool) -> bool:
        """Record the trial's losses at the rungs it newly reached; True when halving discarded it."""
        assert trial.run_id is not None
        rows = read_metrics(RunLayout(self.ctx.workspace.run_dir(trial.run_id)).metrics)
        for rung in self.state.halving_tokens[len(trial.rung_losses) :]:
            loss = rung_loss(rows, trial.tokens_per_step, rung)
            if loss is None:
                return False
            trial.rung_losses.append(loss)
            position = len(trial.rung_losses) - 1
            recorded = [t.rung_losses[position] for t in self.state.trials if len(t.rung_losses) > position]
            verdict = halving_verdict(loss, recorded, self.state.halving_eta)
            log.info(
                "trial %d: eval loss %.4f at %d tokens (%d recorded there)", trial.index, loss, rung, len(recorded)
            )
            if verdict is not None and halve:
                self.discard(trial, f"successive halving: eval loss {loss:.4g} at {rung:,} tokens, {verdict}")
                return True
        return False

    def discard(self, trial: TrialState, reason: str) -> None:
        """Record the decision first (so no reader sees a cancelled run without it), then stop the run."""
        assert trial.run_id is not None
        layout = RunLayout(self.ctx.workspace.run_dir(trial.run_id))
        record = update_record(layout.record, decision="discarded", decision_reason=reason)
        if record.job_id is not None and not record.status.finished:
            self.ctx.job_backend(record.backend, record.address).cancel(record.job_id)

    def check_canary(self) -> None:
        state = self.state
        if state.canary_steps == 0 or state.canary_passed_at is not None or not state.trials:
            return
        canary = state.trials[0]
        if canary.run_id is None:
            return
        if canary.status in ("finished", "kept"):
            passed = True
        elif canary.status == "running":
            rows = read_metrics(RunLayout(self.ctx.workspace.run_dir(canary.run_id)).metrics)
            passed = any(row.step >= state.canary_steps for row in rows)
        else:
            state.status, state.ended_at = "failed", utc_now()
            state.reason = cut(
                f"canary trial 0 ({canary.run_id}) {canary.status} before step {state.canary_steps}: "
                f"{canary.reason}; launched nothing more"
            )
            log.error("sweep %s: %s", state.sweep_id, state.reason)
            return
        if passed:
            state.canary_passed_at = utc_now()
            log.info("canary %s passed step %d: launching the rest", canary.run_id, state.canary_steps)

    def launch_more(self) -> None:
        state = self.state
        gate_open = state.canary_steps == 0 or state.canary_passed_at is not None
        for trial in state.trials:
            active = sum(t.status == "running" for t in state.trials)
            if active >= state.max_concurrent or self.stop_requested:
                return
            if trial.status != "pending":
                continue
            if trial.index > 0 and not gate_open:
                return
            if not self.launch(trial, active):
                return

    def launch(self, trial: TrialState, active: int) -> bool:
        """Launch one trial; False when a workspace limit says to wait (it stays pending)."""
        request = LaunchTrainingRequest.model_validate({**trial.arguments, "sweep_id": self.state.sweep_id})
        try:
            run = launch_training(self.ctx, request)
        except (TradewindError, ValueError) as error:
            # Other runs hold the slots, the memory or the machine (one on a time budget): wait for them to end;
            # but memory that this sweep's own runs do not hold, none of its runs ending frees.
            if isinstance(error, LimitReached) and (active or error.limit in ("max_active_runs", "shared_devices")):
                log.info("trial %d waits: %s", trial.index, error)
                return False
            trial.status, trial.reason = "crashed", cut(f"launch refused: {error}")
            log.warning("trial %d: %s", trial.index, trial.reason)
            return True
        trial.run_id, trial.launched_at, trial.status = run.run_id, utc_now(), "running"
        log.info("trial %d: launched %s (%s)", trial.index, run.run_id, request.note)
        return True

    def finish(self) -> None:
        state = self.state
        state.ended_at = utc_now()
        if any(t.status in ("finished", "kept") for t in state.trials if not t.baseline):
            state.status = "succeeded"
        else:
            state.status, state.reason = "failed", "no trial finished: every one crashed or was discarded"
        log.info("sweep %s: %s", state.sweep_id, state.status)


def run_sweep_job(**kwargs: Any) -> None:
    """The controller job's entry: run the sweep in `sweeps/<sweep_id>/sweep.json` to its end.

    SIGTERM (cancel_sweep) stops it between two looks, so it never leaves a launch half done.
    """
    job = SweepJob.model_validate(kwargs)
    configure_logging()
    ctx = ToolContext.open(job.root, tuple(job.allowed_paths), tuple(job.code_paths))
    controller = Controller(ctx, read_state(ctx, job.sweep_id))

    def request_stop(signum: int, frame: object) -> None:
        controller.stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    controller.run()
