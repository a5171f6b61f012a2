"""`tail_logs`: paging a run's log, and hints for known failures."""

import pytest

from tradewind.core import TradewindError
from tradewind.runs import RunLayout
from tradewind.tools import (
    LaunchTrainingRequest,
    TailLogsRequest,
    WaitForRunRequest,
    launch_training,
    tail_logs,
    wait_for_run,
)


@pytest.mark.slow
def test_tail_logs_pages_a_finished_runs_log_to_the_end(ctx, finished_run):
    log = RunLayout(ctx.workspace.run_dir(finished_run.run_id)).log.read_bytes()
    assert len(log) > 300
    pages, cursor = [], 0
    for _ in range(len(log)):
        page = tail_logs(ctx, TailLogsRequest(run_id=finished_run.run_id, cursor=cursor, limit_bytes=100))
        assert page.cursor == cursor and page.size == len(log)
        assert len(page.text.encode("utf-8")) <= 100
        pages.append(page.text)
        cursor = page.next_cursor
        if page.finished:
            break
    assert cursor == len(log)
    assert "".join(pages).encode("utf-8") == log
    assert len(pages) >= 3
    end = tail_logs(ctx, TailLogsRequest(run_id=finished_run.run_id, cursor=cursor))
    assert end.text == "" and end.next_cursor == len(log) and end.finished
    assert page.status == "SUCCEEDED" and page.hints == []


def test_tail_logs_refuses_a_page_over_32000_bytes():
    TailLogsRequest(run_id="run-x", limit_bytes=32_000)
    with pytest.raises(ValueError, match="limit_bytes"):
        TailLogsRequest(run_id="run-x", limit_bytes=32_001)


def test_tail_logs_of_an_unknown_run_names_it(ctx):
    with pytest.raises(TradewindError, match="run-nope"):
        tail_logs(ctx, TailLogsRequest(run_id="run-nope"))


@pytest.mark.slow
def test_tail_logs_hints_at_a_non_finite_loss_with_a_next_step(ctx, dataset_id, tiny_run_settings):
    settings = {**tiny_run_settings, "log_every": 1, "optimizer": {"learning_rate": 1e10, "warmup_steps": 0}}
    run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset_id, steps=6, checkpoint=False, **settings))
    done = wait_for_run(ctx, WaitForRunRequest(run_id=run.run_id, timeout_s=240))
    assert done.status == "FAILED", done.log_tail
    page = tail_logs(ctx, TailLogsRequest(run_id=run.run_id, limit_bytes=32_000))
    assert page.finished
    hints = [hint for hint in page.hints if "NaN or infinite" in hint.meaning]
    assert hints, page.hints
    assert "learning_rate" in hints[0].next_step
    assert any(word in hints[0].matched.lower() for word in ("nan", "inf", "non-finite")), hints[0].matched
