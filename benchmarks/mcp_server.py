"""What MCP adds to a tool call: in memory over a direct function call, and read-only calls over HTTP.

Command:
    .venv/bin/python benchmarks/mcp_server.py

Everything runs on a temporary workspace holding 100 finished runs, made without training: each run
folder is written as the trainer leaves it (`config.json`, a valid `TrainConfig` on a real token cache
built once from builtin:tinyshakespeare; `run.json`, a `RunRecord` with backend "process" and status
SUCCEEDED; a few `metrics.jsonl` rows; `summary.json`, a `TrainSummary`), and `get_run` must read each
as a SUCCEEDED run.

- In-memory overhead: 300 calls of `get_run` on one run, each made directly in Python and through
  `mcp.Client(build_server(ctx))` in memory, alternating so both see the same machine; the overhead is
  the median MCP call minus the median direct call (target <= 2 ms).
- HTTP: `tradewind serve --transport http` on a free loopback port with `$TRADEWIND_TOKEN` set, then 16
  concurrent MCP sessions (the SDK's streamable HTTP client, bearer token on every request), each making
  50 read-only calls in turn: `get_run`, `list_runs` (limit 5), `read_metrics`. Sessions open before the
  clock starts; per-call latency is recorded, and calls/s is all calls over the wall time of the batch
  (target p50 <= 25 ms on an idle 2-core machine). Before it, one client alone makes the same 50 calls
  (the latency without queueing), and the server's CPU time per call (/proc) is reported with the
  benchmark process's own (the 16 clients).
- For where the time goes: a direct `list_runs` of all 100 runs.

Prints readable lines, then one JSON line: value = HTTP p50 per call in ms, baseline = the median direct
`get_run` call in ms (the work every call does, with no protocol around it), ratio = baseline / value
(the share of an HTTP call's latency that is the tool itself; 1.0 would mean the transport costs nothing).
Also `overhead_ms_p50`, `http_p50_ms`, `http_p95_ms`, `http_calls_per_s`, `http_1_client_p50_ms`,
`server_cpu_ms_per_call`, `client_cpu_ms_per_call` (the 16 SDK clients share the machine with the server, so
their CPU bounds calls/s too).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tradewind.cluster.jobs import JobStatus, utc_now
from tradewind.core import atomic_write_json
from tradewind.runs.config import TrainConfig
from tradewind.runs.layout import RunLayout
from tradewind.runs.metrics import TrainSummary
from tradewind.runs.record import RunRecord, write_record
from tradewind.server import build_server
from tradewind.tools import (
    ListRunsRequest,
    ReadMetricsRequest,
    RunRequest,
    TokenizeDatasetRequest,
    ToolContext,
    get_run,
    list_runs,
    read_metrics,
    tokenize_dataset,
)

RUNS = 100
OVERHEAD_CALLS = 300
CLIENTS = 16
CALLS_PER_CLIENT = 50
START_DEADLINE_S = 60
HTTP_DEADLINE_S = 300


def make_runs(ctx: ToolContext, dataset: str) -> list[str]:
    """RUNS finished run folders, written as a `train()` call leaves them."""
    config = TrainConfig(dataset=dataset, steps=40, eval_every=20)
    ids = []
    for i in range(RUNS):
        run_id = f"bench-{i:03d}"
        layout = RunLayout(ctx.workspace.run_dir(run_id, must_exist=False))
        layout.root.mkdir(parents=True)
        atomic_write_json(layout.config, config.model_dump(mode="json"))
        now = utc_now()
        record = RunRecord(run_id=run_id, backend="process", status=JobStatus.SUCCEEDED, platform="cpu", devices=1)
        write_record(layout.record, record.model_copy(update={"started_at": now, "ended_at": now}))
        rows = [
            {"step": 0, "eval_loss": 5.5, "elapsed": 1.0},
            {"step": 20, "loss": 3.1, "lr": 1e-3, "grad_norm": 1.2, "tokens_per_s": 9000.0, "elapsed": 4.0},
            {"step": 20, "eval_loss": 3.0, "elapsed": 4.5},
            {"step": 40, "loss": 2.4, "lr": 5e-4, "grad_norm": 0.9, "tokens_per_s": 9100.0, "elapsed": 7.0},
            {"step": 40, "eval_loss": 2.3, "elapsed": 7.5},
        ]
        layout.metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
        summary = TrainSummary(
            parameters=1_300_000,
            steps=40,
            tokens_seen=40 * config.batch_size * config.seq_len,
            final_loss=2.4,
            first_eval_loss=5.5,
            final_eval_loss=2.3,
            best_eval_loss=2.3,
            mean_tokens_per_s=9050.0,
            compile_s=1.0,
            wall_s=7.5,
        )
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))
        ids.append(run_id)
    for run_id in ids:
        info = get_run(ctx, RunRequest(run_id=run_id))
        assert info.status is JobStatus.SUCCEEDED and info.summary is not None and info.step == 40, info
    return ids


async def in_memory_overhead(ctx: ToolContext, run_id: str) -> tuple[float, float]:
    """(median direct get_run ms, median in-memory MCP get_run ms), calls alternating."""
    direct, through_mcp = [], []
    request = RunRequest(run_id=run_id)
    async with Client(build_server(ctx)) as client:
        for _ in range(10):  # warm both paths
            get_run(ctx, request)
            await client.call_tool("get_run", {"run_id": run_id})
        for _ in range(OVERHEAD_CALLS):
            start = time.perf_counter()
            get_run(ctx, request)
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            result = await client.call_tool("get_run", {"run_id": run_id})
            through_mcp.append(time.perf_counter() - start)
            assert not result.is_error, result.content
    return statistics.median(direct) * 1e3, statistics.median(through_mcp) * 1e3


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(workspace: Path, port: int, token: str) -> subprocess.Popen:
    """`tradewind serve --transport http`, returned once uvicorn says it listens (deadline START_DEADLINE_S)."""
    command = [sys.executable, "-m", "tradewind", "serve", "--workspace", str(workspace)]
    command += ["--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRADEWIND_TOKEN": token},
    )
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []

    def drain() -> None:  # keeps the pipe empty for as long as the server lives
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            raise RuntimeError(f"server did not listen within {START_DEADLINE_S} s:\n{''.join(seen)}") from None
        if line is None:
            raise RuntimeError(f"server exited with {process.wait()} before listening:\n{''.join(seen)}")
        seen.append(line)
        if "Uvicorn running on" in line:
            return process


async def http_calls(url: str, token: str, run_ids: list[str], clients: int) -> tuple[list[tuple[str, float]], float]:
    """((tool, seconds) of every call of all clients, wall seconds from the first call to the last answer)."""
    latencies: list[tuple[str, float]] = []
    ready = 0
    go = anyio.Event()
    all_ready = anyio.Event()
    calls = [
        ("get_run", lambda i: {"run_id": run_ids[i % len(run_ids)]}),
        ("list_runs", lambda i: {"limit": 5}),
        ("read_metrics", lambda i: {"run_id": run_ids[i % len(run_ids)]}),
    ]

    async def one_client(index: int) -> None:
        nonlocal ready
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            ready += 1
            if ready == clients:
                all_ready.set()
            await go.wait()
            for i in range(CALLS_PER_CLIENT):
                name, arguments = calls[(index + i) % len(calls)]
                start = time.perf_counter()
                result = await client.call_tool(name, arguments(index * CALLS_PER_CLIENT + i))
                latencies.append((name, time.perf_counter() - start))
                assert not result.is_error, (name, result.content)

    with anyio.fail_after(HTTP_DEADLINE_S):
        async with anyio.create_task_group() as group:
            for index in range(clients):
                group.start_soon(one_client, index)
            await all_ready.wait()
            start = time.perf_counter()
            go.set()
        wall = time.perf_counter() - start
    return latencies, wall


def median_ms(call, repeats: int = 50) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)


def main() -> None:
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # build_server turns on INFO: one line per request
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "workspace"
        ctx = ToolContext.open(workspace)
        start = time.perf_counter()
        dataset = tokenize_dataset(ctx, TokenizeDatasetRequest(input="builtin:tinyshakespeare", workers=1))
        print(f"token cache {dataset.dataset_id}: {time.perf_counter() - start:.1f} s")
        run_ids = make_runs(ctx, dataset.path)
        print(f"{len(run_ids)} runs written, each reads as SUCCEEDED")

        start = time.perf_counter()
        listed = list_runs(ctx, ListRunsRequest(limit=RUNS))
        list_all_ms = (time.perf_counter() - start) * 1e3
        assert len(listed.runs) == RUNS and not listed.unreadable, listed.unreadable
        print(f"direct list_runs of all {RUNS} runs: {list_all_ms:.1f} ms ({list_all_ms / RUNS:.2f} ms per run)")

        mix = [
            ("get_run", lambda: get_run(ctx, RunRequest(run_id=run_ids[0]))),
            ("list_runs limit 5", lambda: list_runs(ctx, ListRunsRequest(limit=5))),
            ("read_metrics", lambda: read_metrics(ctx, ReadMetricsRequest(run_id=run_ids[0]))),
        ]
        print("direct, the HTTP mix: " + ", ".join(f"{name} {median_ms(call):.2f} ms" for name, call in mix))

        direct_ms, mcp_ms = anyio.run(in_memory_overhead, ctx, run_ids[0])
        overhead_ms = mcp_ms - direct_ms
        print(f"get_run direct:        {direct_ms:.3f} ms (median of {OVERHEAD_CALLS})")
        print(f"get_run MCP in memory: {mcp_ms:.3f} ms")
        print(f"in-memory MCP overhead: {overhead_ms:.3f} ms per call (target <= 2)")

        token = secrets.token_urlsafe(32)
        port = free_loopback_port()
        server = start_server(workspace, port, token)
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            alone_cpu = cpu_seconds(server.pid)
            alone, _ = anyio.run(http_calls, url, token, run_ids, 1)
            alone_cpu = cpu_seconds(server.pid) - alone_cpu
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            latencies, wall = anyio.run(http_calls, url, token, run_ids, CLIENTS)
            server_cpu = cpu_seconds(server.pid) - server_cpu
            client_cpu = time.process_time() - client_cpu
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)
    alone_ms = statistics.median(seconds for _, seconds in alone) * 1e3
    alone_cpu_ms = alone_cpu / len(alone) * 1e3
    print(f"HTTP, 1 client x {CALLS_PER_CLIENT} read-only calls: p50 {alone_ms:.1f} ms, ", end="")
    print(f"server CPU {alone_cpu_ms:.2f} ms per call")
    ms = sorted(seconds * 1e3 for _, seconds in latencies)
    p50, p95 = statistics.median(ms), percentile(ms, 95)
    calls_per_s = len(ms) / wall
    print(f"HTTP, {CLIENTS} clients x {CALLS_PER_CLIENT} read-only calls: p50 {p50:.1f} ms, p95 {p95:.1f} ms,")
    print(f"  max {ms[-1]:.1f} ms, {calls_per_s:.0f} calls/s over {wall:.2f} s (target p50 <= 25 ms)")
    by_tool = {name: statistics.median(t * 1e3 for n, t in latencies if n == name) for name, _ in latencies}
    print("  p50 by tool: " + ", ".join(f"{name} {value:.1f} ms" for name, value in sorted(by_tool.items())))
    print(f"  CPU per call: server {server_cpu / len(ms) * 1e3:.2f} ms, clients {client_cpu / len(ms) * 1e3:.2f} ms")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        json.dumps(
            {
                "benchmark": "mcp",
                "value": round(p50, 2),
                "baseline": round(direct_ms, 3),
                "ratio": round(direct_ms / p50, 3),
                "unit": "ms",
                "overhead_ms_p50": round(overhead_ms, 3),
                "http_p50_ms": round(p50, 2),
                "http_p95_ms": round(p95, 2),
                "http_calls_per_s": round(calls_per_s, 1),
                "http_1_client_p50_ms": round(alone_ms, 2),
                "server_cpu_ms_per_call": round(server_cpu / len(ms) * 1e3, 2),
                "client_cpu_ms_per_call": round(client_cpu / len(ms) * 1e3, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
