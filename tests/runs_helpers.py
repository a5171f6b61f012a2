"""Helpers the run tests share: wait on a condition with a deadline, finish a run, read its losses."""

import time

from tradewind.tools import ToolContext, WaitForRunRequest, WaitForRunResult, wait_for_run
from tradewind.trainer import RunLayout, read_metrics


def wait_until(condition, timeout: float, what: str):
    """Poll `condition` until it is true (returning its value); fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.02)
    return value


def finish(ctx: ToolContext, run_id: str, timeout_s: float = 300) -> WaitForRunResult:
    """Wait for the run to end; fail if it has not ended within `timeout_s`."""
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run_id, timeout_s=timeout_s))
    assert not done.timed_out, f"run {run_id} still {done.status} after {timeout_s} s"
    return done


def losses(ctx: ToolContext, run_id: str) -> list[tuple[int, float]]:
    """`(step, training loss)` of every logged row of the run."""
    rows = read_metrics(RunLayout(ctx.workspace.run_dir(run_id)).metrics)
    return [(row.step, row.loss) for row in rows if row.loss is not None]
