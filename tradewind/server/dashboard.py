"""The live run dashboard: one self-contained HTML page per run or comparison, updating while runs train.

Over HTTP (`tradewind serve --transport http`), beside `/mcp`:
    GET /dashboard                          the workspace's runs, newest first, with links
    GET /dashboard/runs/RUN[,RUN...]        the page for one run, or several overlaid
    GET /dashboard/data?runs=RUN[,RUN...]   what the page polls: `dashboard_data` as JSON

A browser cannot send the bearer token as a header when it opens a link, so these GET routes also take it
as `?token=`; the page then drops it from the address bar and sends it as a header when it polls.

In MCP hosts with MCP Apps, the same page is the `ui://` resource `DASHBOARD_URI`, attached to the tools
declared with `dashboard=True` (`get_run`, `read_metrics`): the host hands the page each result of those tools,
and the page asks the host to call `read_metrics` again while the run trains. Hosts without Apps get the tools'
text results as before.

Every number on the page is a tool's result (`get_run`, `read_metrics`): the page draws, it computes nothing.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from tradewind.cluster import JobStatus
from tradewind.core import NotFoundError, TradewindError
from tradewind.tools import (
    ListRunsRequest,
    ReadMetricsRequest,
    RunRequest,
    TailLogsRequest,
    ToolContext,
    get_run,
    list_runs,
    read_metrics,
    tail_logs,
)

DASHBOARD_URI = "ui://tradewind/dashboard"
# The series each chart draws, as read_metrics names them.
SERIES = ["loss", "eval_loss", "lr", "tokens_per_s", "mfu"]
MAX_RUNS = 8  # runs on one page: more would make the charts unreadable
POLL_S = 2.0  # how often a page of a running run asks for new rows
LOG_TAIL_BYTES = 3000
WORKER_THREADS = 4
"""Dashboard requests read and parse run files at once; more wait their turn without holding the event loop."""


def page_template() -> str:
    """The page's HTML, with the placeholders `render_page` fills."""
    return resources.files("tradewind.server").joinpath("dashboard.html").read_text("utf-8")


def render_page(run_ids: list[str], data: dict[str, Any] | None, *, data_url: str | None) -> str:
    """The page for `run_ids`: with `data` drawn at once, and `data_url` polled for fresh data (None in MCP
    Apps, where the page asks the host instead)."""
    config = {
        "runs": run_ids,
        "data": data,
        "dataUrl": data_url,
        "pollMs": int(POLL_S * 1000),
        "series": SERIES,
        "finished": [status.value for status in JobStatus if status.finished],
    }
    # `</` would end the script element early; JSON allows `<\/` for it.
    payload = json.dumps(config).replace("</", "<\\/")
    title = html.escape(", ".join(run_ids) or "runs")
    return page_template().replace("__TITLE__", title).replace("__CONFIG__", payload)


def dashboard_app_html() -> str:
    """The page as the MCP Apps resource: no run yet (the host hands it tool results) and no URL to poll."""
    return render_page([], None, data_url=None)


def run_data(ctx: ToolContext, run_id: str) -> dict[str, Any]:
    """One run's status, metrics and log tail as the tools return them: `get_run`, `read_metrics` of
    `SERIES`, and `tail_logs` of the log's last `LOG_TAIL_BYTES`."""
    info = get_run(ctx, RunRequest(run_id=run_id))
    metrics = read_metrics(ctx, ReadMetricsRequest(run_id=run_id, series=SERIES, max_points=1000 // len(SERIES)))
    size = tail_logs(ctx, TailLogsRequest(run_id=run_id, limit_bytes=1)).size
    tail = TailLogsRequest(run_id=run_id, cursor=max(0, size - LOG_TAIL_BYTES), limit_bytes=LOG_TAIL_BYTES)
    log = tail_logs(ctx, tail)
    return {"run": info.model_dump(mode="json"), "metrics": metrics.model_dump(mode="json"), "log": log.model_dump()}


def dashboard_data(ctx: ToolContext, run_ids: list[str]) -> dict[str, Any]:
    """`run_data` of each run, by run id."""
    return {"runs": {run_id: run_data(ctx, run_id) for run_id in run_ids}}


def parse_run_ids(text: str) -> list[str]:
    """Run ids from a comma-separated list, each once, in order.

    Raises:
        ValueError: no run id, or more than `MAX_RUNS`.
    """
    run_ids = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not run_ids:
        raise ValueError("name at least one run id, e.g. /dashboard/runs/RUN or ?runs=RUN,RUN")
    if len(run_ids) > MAX_RUNS:
        raise ValueError(f"at most {MAX_RUNS} runs on one page (got {len(run_ids)})")
    return run_ids


def dashboard_routes(ctx: ToolContext) -> list[Route]:
    """The HTTP routes of the dashboard, acting on `ctx`'s workspace.

    Each handler does its work (the tools read and parse run files: a second for a long run) in a worker thread,
    at most `WORKER_THREADS` at once, so that the event loop goes on answering every other request meanwhile.
    """
    limiter = anyio.CapacityLimiter(WORKER_THREADS)

    async def answer(work: Callable[[], Response]) -> Response:
        try:
            return await anyio.to_thread.run_sync(work, limiter=limiter)
        except (ValueError, TradewindError) as error:
            return JSONResponse({"error": str(error)}, status_code=404 if isinstance(error, NotFoundError) else 400)

    def index() -> Response:
        entries = list_runs(ctx, ListRunsRequest()).runs
        links = "".join(
            f'<li><a href="/dashboard/runs/{html.escape(e.run_id)}">{html.escape(e.run_id)}</a> '
            f"{e.status.value.lower()}, step {e.step}/{e.total_steps}</li>"
            for e in entries
        )
        return HTMLResponse(render_index(links))

    def page(runs: str) -> Response:
        run_ids = parse_run_ids(runs)
        data = dashboard_data(ctx, run_ids)
        return HTMLResponse(render_page(run_ids, data, data_url="/dashboard/data?runs=" + ",".join(run_ids)))

    def data(runs: str) -> Response:
        return JSONResponse(dashboard_data(ctx, parse_run_ids(runs)))

    async def index_route(request: Request) -> Response:
        return await answer(index)

    async def page_route(request: Request) -> Response:
        return await answer(functools.partial(page, request.path_params["runs"]))

    async def data_route(request: Request) -> Response:
        return await answer(functools.partial(data, request.query_params.get("runs", "")))

    return [
        Route("/dashboard", index_route, methods=["GET"]),
        Route("/dashboard/runs/{runs}", page_route, methods=["GET"]),
        Route("/dashboard/data", data_route, methods=["GET"]),
    ]


def render_index(links: str) -> str:
    """The index page: the runs as links (the token, where the page got one, is carried on by its script)."""
    return (
        "<!doctype html><meta charset=utf-8><title>Tradewind runs</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}</style>"
        f"<h1>Tradewind runs</h1><ul>{links or '<li>no runs yet</li>'}</ul>"
        "<script>const t=new URLSearchParams(location.search).get('token');"
        "if(t){for(const a of document.links){a.href+='?token='+encodeURIComponent(t)}}</script>"
    )
