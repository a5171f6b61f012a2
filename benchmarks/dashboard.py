"""The dashboard's front page with 1,000 runs: how soon a browser shows the runs table.

Command:
    .venv/bin/python benchmarks/dashboard.py [--runs 1000]

A temporary workspace holds `--runs` finished runs made without training, each folder as the trainer leaves it
(`run.json`, `config.json`, 300 `metrics.jsonl` rows, `summary.json`; a tenth of them in sweeps of 10). Then
`tradewind serve --transport http` starts on a free loopback port, and Debian's chromium (through Playwright)
opens `/dashboard` and waits until its script has drawn the table (`body[data-ready]`):

- first: the first page, opened as soon as the server answers (every run's small files read first);
- rested: the first page of a new server that had 3 s to read them (it does at its start);
- again: the page opened again (finished runs' rows from the server's memory);
- empty: the same page of an empty workspace, served by another server, measured first (it warms the browser
  up): the baseline, what a page costs with no run at all.

Each is the median of 5 loads (first: 1, as only the first is). Also the `/dashboard/table` answer's size and
time (what the page fetches while runs go on). Target (issue 40): the page ready in <= 1 s with 1,000 runs.
Prints readable lines, then one JSON line: value = the first page's seconds, baseline = the empty workspace's,
ratio = value / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from tradewind.cluster.jobs import JobStatus
from tradewind.core import atomic_write_json
from tradewind.runs import MetricRow, RunLayout, RunRecord, TrainConfig, TrainSummary, write_record

LOADS = 5


def make_runs(workspace: Path, count: int) -> None:
    rows = "".join(
        MetricRow(step=step, loss=5 / (1 + step / 50), elapsed=step * 0.1, mfu=0.2).model_dump_json() + "\n"
        for step in range(1, 301)
    )
    config = TrainConfig(dataset="datasets/gone").model_dump(mode="json")
    for index in range(count):
        run_id = f"20261206-{index // 3600:02d}{index // 60 % 60:02d}{index % 60:02d}-run{index:04d}"
        layout = RunLayout(workspace / "runs" / run_id)
        layout.root.mkdir(parents=True)
        sweep = f"sweep-{index // 10}" if index % 10 == 0 or index < count // 10 else None
        write_record(
            layout.record,
            RunRecord(
                run_id=run_id,
                backend="process",
                status=JobStatus.SUCCEEDED,
                note=f"learning rate {index}e-5",
                sweep_id=sweep,
                started_at="2026-12-06T10:00:00.000+00:00",
                ended_at="2026-12-06T10:05:00.000+00:00",
            ),
        )
        atomic_write_json(layout.config, config)
        layout.metrics.write_text(rows)
        summary = TrainSummary(
            parameters=1_000_000,
            steps=300,
            tokens_seen=300 * 2048,
            final_loss=2.0,
            first_eval_loss=5.0,
            final_eval_loss=2.0 + index / count,
            best_eval_loss=1.9,
            mean_tokens_per_s=4e4,
            compile_s=2.0,
            wall_s=300.0,
            mfu=0.2,
        )
        atomic_write_json(layout.summary, summary.model_dump(mode="json"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(workspace: Path, token: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    command = [sys.executable, "-m", "tradewind", "serve", "--workspace", str(workspace), "--transport", "http"]
    server = subprocess.Popen(
        [*command, "--port", str(port)],
        env={**os.environ, "TRADEWIND_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx2.get(f"http://127.0.0.1:{port}/dashboard", timeout=1)
            return server, port
        except httpx2.TransportError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not answer within 60 s")


def page_ready_s(browser, port: int, token: str) -> float:
    page = browser.new_page()
    start = time.perf_counter()
    page.goto(f"http://127.0.0.1:{port}/dashboard?token={token}")
    page.wait_for_selector("body[data-ready]", timeout=60_000)
    seconds = time.perf_counter() - start
    page.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    runs = parser.parse_args().runs
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        full, empty = Path(folder) / "full", Path(folder) / "empty"
        make_runs(full, runs)
        (empty / "runs").mkdir(parents=True)
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        servers = []
        try:
            server, port = serve(empty, token)  # first: it warms the browser up, too
            servers.append(server)
            baseline = statistics.median(page_ready_s(browser, port, token) for _ in range(LOADS))
            server, port = serve(full, token)
            servers.append(server)
            first = page_ready_s(browser, port, token)
            again = statistics.median(page_ready_s(browser, port, token) for _ in range(LOADS))
            server, port = serve(full, token)  # a new server, given 3 s to read the runs before the page comes
            servers.append(server)
            time.sleep(3)
            rested = page_ready_s(browser, port, token)
            start = time.perf_counter()
            answer = httpx2.get(
                f"http://127.0.0.1:{port}/dashboard/table", headers={"Authorization": f"Bearer {token}"}
            )
            table_s = time.perf_counter() - start
            assert len(answer.json()["rows"]) == runs, "the table lost runs"
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=30)
            browser.close()
    print(f"{runs} runs: first page ready in {first:.3f} s (after 3 s of rest: {rested:.3f} s), again {again:.3f} s;")
    print(f"empty workspace: {baseline:.3f} s")
    print(f"/dashboard/table: {len(answer.content) / 1e3:.0f} kB in {table_s * 1000:.0f} ms")
    result = {
        "benchmark": "dashboard_front_page",
        "runs": runs,
        "value": round(first, 3),
        "baseline": round(baseline, 3),
        "ratio": round(first / baseline, 2),
        "again_s": round(again, 3),
        "rested_s": round(rested, 3),
        "table_kb": round(len(answer.content) / 1e3),
        "table_ms": round(table_s * 1000),
        "target_s": 1.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
