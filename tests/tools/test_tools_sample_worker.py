"""The warm sampling worker behind sample_text: reused while alive, replaced when dead, gone when idle, one per
workspace even when two first calls race. Real processes, real JAX."""

import os
import signal
import threading

import pytest
from polling import wait_until

from tradewind.cluster import JobStatus
from tradewind.core import TradewindError
from tradewind.runs.sample_client import IDLE_ENV, exchange, socket_path
from tradewind.tools.sampling import SampleTextRequest, sample_text

REQUEST = SampleTextRequest(run_id="r1", prompt="ROMEO:", max_tokens=6, temperature=0.8, seed=1)


def worker_jobs(ctx):
    return [record for record in ctx.backend.list() if record.spec.name == "sample worker"]


def worker_pid(ctx) -> int | None:
    try:
        reply = exchange(socket_path(ctx.workspace.jobs_dir), {"op": "ping"}, timeout_s=30)
    except TradewindError:  # it took the connection and died
        return None
    return None if reply is None else reply["pid"]


def stop_workers(ctx):
    """Remove the socket (a worker exits when it is gone) and wait until every worker job has ended."""
    socket_path(ctx.workspace.jobs_dir).unlink(missing_ok=True)
    wait_until(lambda: all(r.status.finished for r in worker_jobs(ctx)), timeout=30, what="the workers' exit")


@pytest.fixture
def ctx(trained_ctx):
    stop_workers(trained_ctx)
    yield trained_ctx
    stop_workers(trained_ctx)


@pytest.mark.slow
def test_a_second_call_reuses_the_worker_the_first_started_and_gives_the_same_text(ctx):
    jobs_before = len(worker_jobs(ctx))
    first = sample_text(ctx, REQUEST)
    pid = worker_pid(ctx)
    second = sample_text(ctx, REQUEST)
    assert (second.text, second.step) == (first.text, first.step) and second.output_file != first.output_file
    assert worker_pid(ctx) == pid and len(worker_jobs(ctx)) == jobs_before + 1
    [running] = [record for record in worker_jobs(ctx) if not record.status.finished]
    assert running.pid == pid and running.spec.resources.cpus == 0
    # A request names files to write, so only this user may connect.
    assert socket_path(ctx.workspace.jobs_dir).stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
def test_a_killed_worker_is_replaced_by_the_next_call(ctx):
    first = sample_text(ctx, REQUEST)
    pid = worker_pid(ctx)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker_pid(ctx) is None, timeout=30, what="the killed worker's socket to refuse")
    assert socket_path(ctx.workspace.jobs_dir).exists()  # the stale socket file is still there
    again = sample_text(ctx, REQUEST)
    assert again.text == first.text and worker_pid(ctx) not in (None, pid)


@pytest.mark.slow
def test_an_idle_worker_exits_and_removes_its_socket(ctx, monkeypatch):
    monkeypatch.setenv(IDLE_ENV, "1")
    sample_text(ctx, REQUEST)
    pid = worker_pid(ctx)
    [record] = [r for r in worker_jobs(ctx) if r.pid == pid]
    ended = wait_until(lambda: ctx.backend.status(record.id).status.finished and ctx.backend.status(record.id), 60)
    assert ended.status is JobStatus.SUCCEEDED and not socket_path(ctx.workspace.jobs_dir).exists()
    assert sample_text(ctx, REQUEST).tokens == 6  # and the next call starts a new one


@pytest.mark.slow
def test_two_concurrent_first_calls_start_one_worker(ctx):
    jobs_before = len(worker_jobs(ctx))
    results, errors = [], []

    def call(seed):
        try:
            results.append(sample_text(ctx, REQUEST.model_copy(update={"seed": seed})))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and len(results) == 2
    assert len(worker_jobs(ctx)) == jobs_before + 1
