"""The live run dashboard: served over HTTP beside /mcp, and as an MCP Apps `ui://` resource.

The event stream tests read `/dashboard/events` with a real HTTP client while they change a run's files. The
browser test opens the page in headless Chromium (Debian's `chromium`, driven by Playwright) while a real run
trains, and checks that the charts show the metrics file's numbers and move on as new rows arrive, fetched
when the server's events say so.
"""

import json
import math
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx2
import pytest
from http_helpers import running_server
from mcp import Client
from polling import wait_until
from runs_helpers import finish, metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.runs import RunLayout, RunRecord, read_metrics, write_record
from tradewind.server import build_server
from tradewind.server.dashboard import DASHBOARD_URI, MAX_RUNS, MAX_STREAMS, parse_run_ids, render_page
from tradewind.tools import (
    LaunchTrainingRequest,
    TokenizeDatasetRequest,
    ToolContext,
    launch_training,
    tokenize_dataset,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_run_ids_come_from_a_comma_separated_list_once_each_and_bounded():
    assert parse_run_ids(" a, b,a ,,c") == ["a", "b", "c"]
    with pytest.raises(ValueError, match="at least one run id"):
        parse_run_ids(" , ")
    with pytest.raises(ValueError, match=f"at most {MAX_RUNS} runs"):
        parse_run_ids(",".join(f"r{i}" for i in range(MAX_RUNS + 1)))


def test_data_cannot_close_the_pages_script_element():
    page = render_page(
        ["r1"], {"runs": {"r1": {"run": {"reason": "</script><script>alert(1)</script>"}}}}, over_http=True
    )
    assert "</script><script>alert(1)" not in page
    assert page.count("</script>") == 3  # the charting library's, the config element's and the code's own


@pytest.mark.anyio
async def test_mcp_apps_hosts_get_the_page_as_a_ui_resource_attached_to_get_run_and_read_metrics(ctx):
    async with Client(build_server(ctx)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        attached = {name for name, tool in tools.items() if (tool.meta or {}).get("ui", {}).get("resourceUri")}
        assert attached == {"get_run", "read_metrics"}
        assert tools["get_run"].meta["ui"]["resourceUri"] == DASHBOARD_URI
        contents = (await client.read_resource(DASHBOARD_URI)).contents
    assert contents[0].mime_type == "text/html;profile=mcp-app"
    assert "ui/notifications/tool-result" in contents[0].text and '"dataUrl": null' in contents[0].text


def test_dashboard_routes_need_the_token_in_the_header_or_the_query(tmp_path):
    with running_server(tmp_path / "ws") as server:
        base = f"http://127.0.0.1:{server.port}"
        assert httpx2.get(f"{base}/dashboard", timeout=10).status_code == 401
        assert httpx2.get(f"{base}/dashboard?token=wrong", timeout=10).status_code == 401
        assert httpx2.get(f"{base}/dashboard?token={server.token()}", timeout=10).status_code == 200
        assert httpx2.get(f"{base}/dashboard/table", timeout=10).status_code == 401
        table = httpx2.get(f"{base}/dashboard/table", headers={"Authorization": f"Bearer {server.token()}"}, timeout=10)
        assert table.status_code == 200 and table.json() == {"rows": [], "unreadable": []}
        headers = {"Authorization": f"Bearer {server.token()}"}
        missing = httpx2.get(f"{base}/dashboard/data?runs=nope", headers=headers, timeout=10)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        # The event stream too, with the token in the query, as a page's EventSource (which sends no headers) asks.
        assert httpx2.get(f"{base}/dashboard/events?runs=nope", timeout=10).status_code == 401
        missing = httpx2.get(f"{base}/dashboard/events?runs=nope&token={server.token()}", timeout=10)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        nothing = httpx2.get(f"{base}/dashboard/events?runs=,", headers=headers, timeout=10)
        assert nothing.status_code == 400 and "at least one run id" in nothing.json()["error"]
        # The query token opens dashboard pages only, never the MCP endpoint.
        assert httpx2.post(f"{base}/mcp?token={server.token()}", content=b"{}", timeout=10).status_code == 401
        assert "dashboard at http://127.0.0.1" in server.stderr


def test_a_401_answers_within_50_ms_while_a_slow_dashboard_request_is_in_flight(tmp_path):
    # A run with 20,000 metrics rows: reading it for the page takes about a second of CPU in the server.
    ctx = ToolContext.open(tmp_path / "ws")
    write_run(ctx, "big", metric_rows(20_000), RunRecord(run_id="big", backend="process", status=JobStatus.SUCCEEDED))
    with running_server(ctx.workspace.root) as server:
        base = f"http://127.0.0.1:{server.port}"
        polls: list[tuple[float, float, int]] = []  # (sent, answered, status) of each slow dashboard request

        def poll_the_big_run() -> None:  # three slow dashboard requests one after another, as an open page polls
            with httpx2.Client(base_url=base, headers={"Authorization": f"Bearer {server.token()}"}) as client:
                for _ in range(3):
                    sent = time.perf_counter()
                    status = client.get("/dashboard/data?runs=big", timeout=60).status_code
                    polls.append((sent, time.perf_counter(), status))

        poller = threading.Thread(target=poll_the_big_run)
        poller.start()
        replies: list[tuple[float, float]] = []  # (sent, seconds to the 401) of each request without the token
        with httpx2.Client(base_url=base, timeout=60) as client:
            while poller.is_alive():  # ends: the poller stops after its three polls
                sent = time.perf_counter()
                assert client.get("/dashboard/data?runs=big").status_code == 401
                replies.append((sent, time.perf_counter() - sent))
        poller.join(timeout=120)
    assert polls and {status for *_, status in polls} == {200}, polls
    latencies_ms = [seconds * 1000 for seconds in during(replies, polls)]
    median = statistics.median(latencies_ms or [math.inf])
    assert median < 50, f"401 took {median:.0f} ms (median) while a dashboard request ran: {sorted(latencies_ms)}"
    assert len(latencies_ms) >= 10, f"too few 401s sent while a dashboard request was in flight: {latencies_ms}"


def during(replies: list[tuple[float, float]], polls: list[tuple[float, float, int]]) -> list[float]:
    """The latencies of the replies in flight while a poll was in the server: from 0.1 s after it was sent (it has
    arrived) until its answer came back."""
    return [took for sent, took in replies if any(sent < end and sent + took > start + 0.1 for start, end, _ in polls)]


HEARD_WITHIN_S = 10  # a look a second, and a loaded machine: each read of an event stream waits this long at most


def next_event(lines: Iterator[str]) -> tuple[str, list[str]] | None:
    """The next server-sent event on a stream's lines, as (type, the run ids it names); None once the stream has
    ended. A read that waits longer than the client's timeout raises."""
    kind, run_ids = "message", None
    for line in lines:
        if not line:  # an event ends at a blank line
            return kind, run_ids
        field, _, value = line.partition(": ")
        if field == "event":
            kind = value
        elif field == "data":
            run_ids = json.loads(value)
    return None


def running_run(ctx: ToolContext, run_id: str) -> RunRecord:
    """A run folder with a few metrics rows and a RUNNING record (a Python call of `train`, no process to check)."""
    record = RunRecord(run_id=run_id, backend="process", status=JobStatus.RUNNING)
    write_run(ctx, run_id, metric_rows(3), record)
    return record


def test_the_event_stream_says_when_a_runs_files_change_and_ends_once_it_has_finished(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    record = running_run(ctx, "r1")
    layout = RunLayout(ctx.workspace.run_dir("r1"))
    with (
        running_server(ctx.workspace.root) as server,
        httpx2.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=HEARD_WITHIN_S) as client,
        client.stream("GET", f"/dashboard/events?runs=r1&token={server.token()}") as stream,
    ):
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        # The first event comes at once: the stream's first look is taken, so any change from here on is heard.
        assert next_event(lines) == ("message", ["r1"])
        with layout.metrics.open("a", encoding="utf-8") as rows:
            rows.write('{"step": 4, "loss": 4.2}\n')
        assert next_event(lines) == ("message", ["r1"])
        write_record(layout.record, record.model_copy(update={"status": JobStatus.SUCCEEDED}))
        assert next_event(lines) == ("end", ["r1"])
        assert next_event(lines) is None  # the server closed the stream


def test_the_event_stream_of_finished_runs_ends_at_once_and_streams_are_bounded(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    running_run(ctx, "r1")
    write_run(ctx, "done", metric_rows(3), RunRecord(run_id="done", backend="process", status=JobStatus.SUCCEEDED))
    with (
        running_server(ctx.workspace.root) as server,
        httpx2.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=HEARD_WITHIN_S) as client,
    ):
        follow = f"/dashboard/events?runs=r1&token={server.token()}"
        with client.stream("GET", f"/dashboard/events?runs=done&token={server.token()}") as stream:
            lines = stream.iter_lines()
            assert (next_event(lines), next_event(lines)) == (("end", ["done"]), None)
        with ExitStack() as open_streams:
            streams = [open_streams.enter_context(client.stream("GET", follow)) for _ in range(MAX_STREAMS)]
            assert [stream.status_code for stream in streams] == [200] * MAX_STREAMS
            refused = client.get(follow)
            assert refused.status_code == 503 and f"at most {MAX_STREAMS}" in refused.json()["error"]
            streams[0].close()  # a client that goes gives its stream's slot back

            def another_stream_opens() -> bool:
                with client.stream("GET", follow) as stream:
                    return stream.status_code == 200

            wait_until(another_stream_opens, HEARD_WITHIN_S, "a slot given back by a closed stream")


STEPS = 2_000


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs chromium (.ci/run installs it)")
def test_the_page_draws_the_runs_real_numbers_and_updates_as_rows_arrive(tmp_path, small_corpus, tiny_run_settings):
    from playwright.sync_api import sync_playwright

    ctx = ToolContext.open(tmp_path / "ws")
    shutil.copy(small_corpus, ctx.workspace.root / "corpus.txt")
    (ctx.workspace.root / "settings.yaml").write_text("backend: local\n", encoding="utf-8")
    dataset = tokenize_dataset(ctx, TokenizeDatasetRequest(input="corpus.txt")).dataset_id
    settings = {**tiny_run_settings, "log_every": 1, "eval_every": 100}
    with running_server(ctx.workspace.root) as server, sync_playwright() as playwright:
        # Long enough (a few seconds of training) that the page, loading alongside, sees the run before it ends.
        run = launch_training(ctx, LaunchTrainingRequest(dataset=dataset, steps=STEPS, **settings))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        data_requests = []  # the page's fetches of /dashboard/data: each answers an event it heard
        page.on("request", lambda request: "/dashboard/data" in request.url and data_requests.append(request.url))
        page.goto(f"http://127.0.0.1:{server.port}/dashboard/runs/{run.run_id}?token={server.token()}")
        assert "token=" not in page.url  # dropped from the address bar at once
        loss_line = f"{run.run_id} loss"  # each chart's data-last: its lines' last points, {"RUN SERIES": [x, y]}
        seen_steps = []
        while not seen_steps or seen_steps[-1] < STEPS:  # ends: the run finishes within finish()'s 300 s below
            page.wait_for_function(
                "([line, seen]) => { const last = JSON.parse(document.getElementById('chart-loss').dataset.last"
                " || '{}'); return last[line] && last[line][0] > seen; }",
                arg=[loss_line, seen_steps[-1] if seen_steps else 0],
                timeout=300_000,
            )
            seen_steps.append(last_points(page, "loss")[loss_line][0])
        page.wait_for_function(
            f"() => document.querySelector('#status tr[data-run=\"{run.run_id}\"]').textContent.includes('SUCCEEDED')",
            timeout=60_000,
        )
        drawn = {
            name: last_points(page, chart)[f"{run.run_id} {name}"][1]
            for chart, name in [("loss", "loss"), ("loss", "eval_loss"), ("lr", "lr"), ("tokens_per_s", "tokens_per_s")]
        }
        status_row = page.inner_text(f'#status tr[data-run="{run.run_id}"]')
        fetched = len(data_requests)  # counted before the events: a fetch is sent after the event it answers
        follow, heard = page.evaluate("[document.body.dataset.follow, +document.body.dataset.events]")
        browser.close()
    finish(ctx, run.run_id)
    assert len(seen_steps) >= 2, f"the page never moved on while the run trained: {seen_steps}"
    assert follow == "events" and 0 < fetched <= heard, (follow, fetched, heard)  # fetched on events, not a timer
    rows = read_metrics(RunLayout(ctx.workspace.run_dir(run.run_id)).metrics)
    last = {name: next(getattr(r, name) for r in reversed(rows) if getattr(r, name) is not None) for name in drawn}
    for name, value in drawn.items():  # read_metrics rounds to 6 significant digits
        assert math.isclose(value, last[name], rel_tol=1e-5), (name, value, last[name])
    assert "SUCCEEDED" in status_row and f"{STEPS}/{STEPS}" in status_row and "workspace" in status_row


def last_points(page, chart: str) -> dict[str, list[float]]:
    """The last point ([x, value]) of each line of a chart on the run page, by "RUN SERIES", as it drew them."""
    return json.loads(page.get_attribute(f"#chart-{chart}", "data-last"))
