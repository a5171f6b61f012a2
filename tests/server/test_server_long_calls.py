"""Long calls through the real MCP client: cancelling them, and progress that only increases.

Over HTTP, a cancelled call's answer (-32800) ends its response stream within a second of the
`notifications/cancelled`, whether or not the tool can stop that soon: a tool that reports progress stops at its
next report and the answer waits for it; one that cannot stop is left to finish in its thread, unanswered.
"""

import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import httpx2
import pytest
import uvicorn
from http_helpers import free_loopback_port
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_helpers import call
from polling import threads_inside, wait_until
from pydantic import BaseModel, ConfigDict, Field

from tradewind.data import builtin_corpus_path, read_documents, shard_runs
from tradewind.server.adapter import as_mcp_tool
from tradewind.tools import ToolContext
from tradewind.tools.context import Progress

pytestmark = pytest.mark.anyio
CANCELLED_WITHIN_S = 1.0  # from the client's notifications/cancelled to the end of the call's response stream


async def wait_in_thread(condition, timeout_s: float, what: str) -> None:
    """`wait_until` in a worker thread, so the event loop (and the in-memory server on it) keeps running."""
    await anyio.to_thread.run_sync(lambda: wait_until(condition, timeout_s, what))


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


async def test_tokenize_dataset_reports_bytes_within_a_file_strictly_increasing(server, ctx, big_text, monkeypatch):
    path = ctx.workspace.root / "big-progress.txt"
    # Four copies take a few tenths of a second on a fast CPU, one or two of the build's 0.25 s progress polls:
    # poll every 20 ms instead, so that reports within the file do not hang on this machine's speed.
    monkeypatch.setattr(shard_runs, "_PROGRESS_INTERVAL_S", 0.02)
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


async def test_a_cancelled_tokenize_dataset_leaves_no_partial_cache_and_can_run_again(
    server, ctx, big_text, monkeypatch
):
    path = ctx.workspace.root / "big-cancel.txt"
    # The cancel follows the first progress report: on a fast CPU one copy is tokenized (~0.2 s) before the
    # build's first 0.25 s poll. Poll every 20 ms and give it four copies, so that the cancel lands mid-build.
    monkeypatch.setattr(shard_runs, "_PROGRESS_INTERVAL_S", 0.02)
    path.write_text(big_text * 4, encoding="utf-8")
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


# Cancelling over HTTP: tools of the test's own that stop at once, or never, when cancelled.


class HoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(gt=0, le=30)


class HoldResult(BaseModel):
    held_s: float


class Holds:
    """What the two holding tools did: started, and (for the one that listens) stopped."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.release = threading.Event()


@pytest.fixture
def holds() -> Iterator[Holds]:
    held = Holds()
    yield held
    held.release.set()  # a tool that did not stop when cancelled ends with the test


@pytest.fixture
def holding_server(tmp_path, holds) -> MCPServer:
    def deaf_hold(ctx: ToolContext, request: HoldRequest) -> HoldResult:
        """Hold for `seconds` without reporting progress: nothing tells it the call was cancelled."""
        holds.started.set()
        holds.release.wait(request.seconds)
        return HoldResult(held_s=request.seconds)

    def polite_hold(ctx: ToolContext, request: HoldRequest, progress: Progress) -> HoldResult:
        """Hold for `seconds`, reporting progress every 0.1 s, and stop at a report once the call is cancelled."""
        start = time.monotonic()
        try:
            while (held := time.monotonic() - start) < request.seconds:
                progress(held, request.seconds, "holding")
                holds.started.set()
                holds.release.wait(0.1)
            return HoldResult(held_s=held)
        finally:
            holds.stopped.set()

    server = MCPServer(name="holds")
    context = ToolContext.open(tmp_path / "ws")
    for tool in (deaf_hold, polite_hold):
        server.add_tool(as_mcp_tool(tool, context), name=tool.__name__, structured_output=True)
    return server


@contextmanager
def over_http(server: MCPServer) -> Iterator[str]:
    """`server`'s streamable-HTTP app under uvicorn on a free loopback port, in a thread; yields its URL."""
    port = free_loopback_port()
    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    running = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: running.started, 30, "uvicorn to start")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        running.should_exit = True
        thread.join(30)


def cancel_over_http(url: str, tool: str, started: threading.Event) -> tuple[list[dict], float]:
    """Call `tool` (holding 10 s) over HTTP, send notifications/cancelled once it has started, and read its response
    stream to the end; return the JSON-RPC messages the stream carried and the seconds from the cancel to its end."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with httpx2.Client(timeout=60) as client:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
        opened = client.post(
            url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        )
        headers |= {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        client.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        params = {"name": tool, "arguments": {"seconds": 10}, "_meta": {"progressToken": "hold"}}
        request = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        messages = []
        with client.stream("POST", url, headers=headers, json=request) as stream:
            wait_until(started.is_set, 30, f"{tool} to start")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
            client.post(url, headers=headers, json=cancel)
            cancelled_at = time.monotonic()
            messages += [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
            ended = time.monotonic() - cancelled_at
    return messages, ended


def test_a_cancelled_call_whose_tool_cannot_stop_ends_its_http_stream_within_a_second(holding_server, holds):
    with over_http(holding_server) as url:
        messages, ended = cancel_over_http(url, "deaf_hold", holds.started)
    assert messages[-1]["error"]["code"] == -32800, messages
    assert ended < CANCELLED_WITHIN_S, f"the stream ended {ended:.2f} s after the cancel"
    assert not holds.release.is_set()  # the tool was still holding: the answer did not wait for it


def test_a_cancelled_call_whose_tool_stops_is_answered_once_it_has_stopped(holding_server, holds):
    with over_http(holding_server) as url:
        messages, ended = cancel_over_http(url, "polite_hold", holds.started)
        stopped_when_answered = holds.stopped.is_set()
    assert messages[-1]["error"]["code"] == -32800, messages
    assert ended < CANCELLED_WITHIN_S, f"the stream ended {ended:.2f} s after the cancel"
    assert stopped_when_answered  # nothing of the call runs on after its answer
