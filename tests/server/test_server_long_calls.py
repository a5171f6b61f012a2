"""Long calls through the real MCP client: cancelling them, and progress that only increases."""

import itertools
import sys
import time

import anyio
import pytest
from mcp import Client
from mcp_helpers import call
from polling import wait_until

from tradewind.data import builtin_corpus_path, read_documents

pytestmark = pytest.mark.anyio


async def wait_in_thread(condition, timeout_s: float, what: str) -> None:
    """`wait_until` in a worker thread, so the event loop (and the in-memory server on it) keeps running."""
    await anyio.to_thread.run_sync(lambda: wait_until(condition, timeout_s, what))


def threads_inside(function_name: str) -> bool:
    """Whether any thread is running a frame of a function called `function_name`."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == function_name:
                return True
            frame = frame.f_back
    return False


async def call_then_cancel_after_first_report(client, name, arguments) -> tuple[list, float]:
    """Call `name`, cancel the call (the client sends notifications/cancelled) once its first progress report
    arrives; return the reports and the seconds the client waited after cancelling."""
    seen, first = [], anyio.Event()

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))
        first.set()

    async with anyio.create_task_group() as group:

        async def run_call():
            result = await client.call_tool(name, arguments, progress_callback=on_progress)
            # In-memory, the SDK (this version) may hand back the server's answer to the cancelled call instead
            # of raising: accept it only if it is the cancellation itself.
            assert result.is_error and "cancelled" in result.content[0].text, result

        group.start_soon(run_call)
        with anyio.fail_after(120):
            await first.wait()
        cancelled_at = time.monotonic()
        group.cancel_scope.cancel()
    return seen, time.monotonic() - cancelled_at


@pytest.fixture(scope="module")
def big_text(ctx):
    """builtin:tinyshakespeare's text four times over (about 4.5 MB), so tokenizing it takes several reports."""
    text = "\n\n".join(document.text for document in read_documents(builtin_corpus_path("tinyshakespeare")))
    return (text + "\n\n") * 4


@pytest.mark.slow
async def test_a_cancelled_wait_for_run_returns_at_once_and_stops_waiting_but_not_the_run(
    server, dataset_id, tiny_run_settings
):
    async with Client(server) as client:
        run = await call(client, "launch_training", {"dataset": dataset_id, "steps": 100_000, **tiny_run_settings})
        try:
            seen, waited = await call_then_cancel_after_first_report(
                client, "wait_for_run", {"run_id": run["run_id"], "timeout_s": 120}
            )
            assert seen and waited < 1.0
            # The server stops waiting soon after (at its next look, within half a second)...
            await wait_in_thread(lambda: not threads_inside("wait_for_run"), 10, "the server to stop wait_for_run")
            # ...but the run goes on, and the connection still answers.
            info = await call(client, "get_run", {"run_id": run["run_id"]})
            assert info["status"] in ("PENDING", "RUNNING"), info
        finally:
            cancelled = await call(client, "cancel_run", {"run_id": run["run_id"]})
    assert cancelled["status"] in ("CANCELLED", "CANCELLING", "RUNNING"), cancelled


@pytest.mark.slow
async def test_wait_for_run_progress_strictly_increases(server, dataset_id, tiny_run_settings):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    async with Client(server) as client:
        run = await call(client, "launch_training", {"dataset": dataset_id, "steps": 20, **tiny_run_settings})
        done = await call(
            client, "wait_for_run", {"run_id": run["run_id"], "timeout_s": 240}, progress_callback=on_progress
        )
    assert done["status"] == "SUCCEEDED", done["log_tail"]
    assert seen and seen[-1] == 20
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


async def test_tokenize_dataset_reports_bytes_within_a_file_strictly_increasing(server, ctx, big_text):
    path = ctx.workspace.root / "big-progress.txt"
    # Four copies tokenize with the byte tokenizer in about one 0.25 s poll here; sixteen take several.
    path.write_text(big_text * 4, encoding="utf-8")
    size = path.stat().st_size
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with Client(server) as client:
        info = await call(
            client, "tokenize_dataset", {"input": path.name, "val_fraction": 0.05}, progress_callback=on_progress
        )
    assert info["reused"] is False
    assert len(seen) > 2, seen  # more than one report before the last: progress within the one file
    assert seen[-1] == (size, size, "input bytes tokenized")
    assert all(a[0] < b[0] for a, b in itertools.pairwise(seen)), seen
    assert all(0 <= p <= size for p, _, _ in seen), seen


async def test_a_cancelled_tokenize_dataset_leaves_no_partial_cache_and_can_run_again(server, ctx, big_text):
    path = ctx.workspace.root / "big-cancel.txt"
    path.write_text(big_text, encoding="utf-8")
    datasets = ctx.workspace.datasets_dir
    datasets.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in datasets.iterdir()}
    arguments = {"input": path.name, "val_fraction": 0.07}

    def partials() -> list:
        return [p for p in datasets.rglob("*") if p.name.endswith(".partial")]

    async with Client(server) as client:
        seen, waited = await call_then_cancel_after_first_report(client, "tokenize_dataset", arguments)
        assert seen and waited < 1.0
        await wait_in_thread(lambda: not threads_inside("tokenize_dataset"), 30, "the server to stop tokenize_dataset")
        assert partials() == []
        assert {p.name for p in datasets.iterdir()} == before
        info = await call(client, "tokenize_dataset", arguments)
    assert info["reused"] is False
    assert info["dataset_id"] not in before and (datasets / info["dataset_id"] / "manifest.json").exists()
    assert partials() == []
