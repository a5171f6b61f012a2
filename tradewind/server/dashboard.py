"""The live run dashboard: one self-contained HTML page per run or comparison, updating while runs train.

Over HTTP (`tradewind serve --transport http`), beside `/mcp`:
    GET /dashboard                           the runs table: sort, filter, group by sweep, tick runs to compare
    GET /dashboard/table                     what that page fetches while runs go on: `runs_table` as JSON
    GET /dashboard/runs/RUN[,RUN...]         the page for one run, or several overlaid
    GET /dashboard/data?runs=RUN[,RUN...]    what the page fetches: `dashboard_data` as JSON
    GET /dashboard/events?runs=RUN[,RUN...]  server-sent events: one each time a run's record, metrics or log
                                             changes (`event: end` once every run has finished)

While a run trains, the page listens to its events and fetches the data route once per event, so an idle run
costs no requests; where it cannot listen (no `EventSource`, every stream slot taken, a run whose files live in
a bucket and reach the workspace only when read) it fetches every `POLL_S` instead. A stream looks at the runs'
files about once a second (`core.files.file_state`, as the MCP listen streams do) and ends by itself: after its
`end` event, when the client goes, or after `STREAM_S`, when a browser opens a new one.

A browser cannot send the bearer token as a header when it opens a link, so these GET routes also take it
as `?token=`; the page then drops it from the address bar and sends it as a header when it fetches, and as
`?token=` when it listens (`EventSource` sends no headers).

In MCP hosts with MCP Apps, the same page is the `ui://` resource `DASHBOARD_URI`, attached to the tools
declared with `dashboard=True` (`get_run`, `read_metrics`): the host hands the page each result of those tools,
and the page asks the host to call `read_metrics` again while the run trains. Hosts without Apps get the tools'
text results as before.

Every number on the page is a tool's result (`get_run`, `read_metrics`): the page draws, it computes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import threading
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any, NamedTuple, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tradewind.cluster import JobStatus
from tradewind.core import NotFoundError, TradewindError, read_json_config
from tradewind.core.files import file_state
from tradewind.runs import RunLayout, read_record, read_train_config
from tradewind.runs.metrics import ProfileSummary
from tradewind.server.updates import LOOK_EVERY_S
from tradewind.tools import (
    ReadMetricsRequest,
    RunRequest,
    TailLogsRequest,
    ToolContext,
    get_run,
    read_metrics,
    tail_logs,
)
from tradewind.tools.cluster import describe_compile_cache
from tradewind.tools.runs import run_record
from tradewind.tools.runs_table import RunsTable, row_facts, runs_table

DASHBOARD_URI = "ui://tradewind/dashboard"
# The series the charts draw, as read_metrics names them (`elapsed`: for the wall-time axis).
SERIES = ["loss", "eval_loss", "lr", "tokens_per_s", "mfu", "elapsed"]
MAX_RUNS = 8  # runs on one page: more would make the charts unreadable
POLL_S = 2.0  # how often a page of a running run asks for new rows when it cannot listen to its events
LOG_TAIL_BYTES = 3000
WORKER_THREADS = 4
"""Dashboard requests read and parse run files at once; more wait their turn without holding the event loop."""
MAX_STREAMS = WORKER_THREADS
"""Event streams open at once, each an open connection and a look a second; one more gets 503 (its page polls)."""
STREAM_S = 600.0
"""The longest one event stream lasts, so that none is held for ever (the record of a run whose process was killed
never says it ended); the browser's `EventSource` then opens a new one."""

T = TypeVar("T")


def template(name: str) -> str:
    """A page's HTML, with the placeholders its `render_` function fills."""
    return resources.files("tradewind.server").joinpath(name).read_text("utf-8")


@functools.cache
def charting_library() -> tuple[str, str]:
    """uPlot's script and style sheet (`static/`, uPlot 1.6.32, MIT), put into the page itself: an MCP Apps host
    shows the page with no server to fetch a file from, and a browser must need no network."""
    return template("static/uPlot.iife.min.js"), template("static/uPlot.min.css")


def script_json(value: Any) -> str:
    r"""`value` as JSON that cannot end the script element it sits in: `</` would; JSON allows `<\/` for it."""
    return json.dumps(value).replace("</", "<\\/")


def render_page(run_ids: list[str], data: dict[str, Any] | None, *, over_http: bool) -> str:
    """The page for `run_ids`, with `data` drawn at once. Served over HTTP, it follows the runs through
    `/dashboard/events` and `/dashboard/data`; in MCP Apps (`over_http=False`) it asks the host instead."""
    query = "?runs=" + ",".join(run_ids)
    config = {
        "runs": run_ids,
        "data": data,
        "dataUrl": "/dashboard/data" + query if over_http else None,
        "eventsUrl": "/dashboard/events" + query if over_http else None,
        "pollMs": int(POLL_S * 1000),
        "series": SERIES,
        "finished": [status.value for status in JobStatus if status.finished],
    }
    title = html.escape(", ".join(run_ids) or "runs")
    script, style = charting_library()
    page = template("dashboard.html").replace("__UPLOT_JS__", script).replace("__UPLOT_CSS__", style)
    return page.replace("__TITLE__", title).replace("__CONFIG__", script_json(config))


def dashboard_app_html() -> str:
    """The page as the MCP Apps resource: no run yet (the host hands it tool results) and no route to follow."""
    return render_page([], None, over_http=False)


def run_data(ctx: ToolContext, run_id: str) -> dict[str, Any]:
    """One run's status, metrics and log tail as the tools return them: `get_run`, `read_metrics` of
    `SERIES`, and `tail_logs` of the log's last `LOG_TAIL_BYTES`; what its record and config fix of its row of
    the runs table (tokens a step, devices); and the diagnosis of its latest profile (`profile_run`), if it has one."""
    info = get_run(ctx, RunRequest(run_id=run_id))
    metrics = read_metrics(ctx, ReadMetricsRequest(run_id=run_id, series=SERIES, max_points=1000 // len(SERIES)))
    size = tail_logs(ctx, TailLogsRequest(run_id=run_id, limit_bytes=1)).size
    tail = TailLogsRequest(run_id=run_id, cursor=max(0, size - LOG_TAIL_BYTES), limit_bytes=LOG_TAIL_BYTES)
    log = tail_logs(ctx, tail)
    layout = RunLayout(ctx.workspace.run_dir(run_id))
    facts = row_facts(run_record(ctx, run_id), read_train_config(layout.config, ctx.workspace.reader("run_id")))
    return {
        "run": info.model_dump(mode="json"),
        "metrics": metrics.model_dump(mode="json"),
        "log": log.model_dump(),
        "row": {name: facts[name] for name in ("tokens_per_step", "devices")},
        "profile": profile_diagnosis(ctx, run_id),
    }


def profile_diagnosis(ctx: ToolContext, run_id: str) -> dict[str, Any] | None:
    """The verdict, evidence and suggestion `profile_run` left in the run's `profile/summary.json`; None where
    it left none (never profiled, or profiled before verdicts, or the file is unreadable)."""
    path = RunLayout(ctx.workspace.run_dir(run_id)).profile / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = read_json_config(ProfileSummary, path, ctx.workspace.reader("run_id"))
    except (TradewindError, ValueError, OSError):
        return None
    return summary.diagnosis.model_dump(mode="json", exclude={"checked"}) if summary.diagnosis else None


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


class RunFiles(NamedTuple):
    """How the files a run's page shows stand (`file_state` of each): a write to any of them changes it."""

    record: tuple[int, int] | None
    metrics: tuple[int, int] | None
    log: tuple[int, int] | None

    @classmethod
    def of(cls, layout: RunLayout) -> RunFiles:
        return cls(file_state(layout.record), file_state(layout.metrics), file_state(layout.log))


def server_event(run_ids: list[str], finished: bool) -> str:
    """A server-sent event naming runs: of the default type, `message`, those whose files changed; of type `end`,
    the stream's last, all of them once every one has finished."""
    return ("event: end\n" if finished else "") + f"data: {json.dumps(run_ids)}\n\n"


class EventStream(StreamingResponse):
    """A `text/event-stream` answer that holds one of `slots` for as long as it streams; 503 when none is free.

    The slot is taken when the answer starts and given back however it ends (its events ran out, the client
    went, the server stopped), so a stream cannot keep one.
    """

    def __init__(self, events: AsyncIterator[str], slots: anyio.Semaphore) -> None:
        # no-store: an event stream is news, never something to answer from a cache.
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})
        self._slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            busy = f"at most {MAX_STREAMS} dashboard event streams at once; fetch /dashboard/data instead"
            await JSONResponse({"error": busy}, status_code=503)(scope, receive, send)
            return
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.release()


def dashboard_routes(ctx: ToolContext) -> list[Route]:
    """The HTTP routes of the dashboard, acting on `ctx`'s workspace.

    Each handler does its work (the tools read and parse run files: a second for a long run) in a worker thread,
    at most `WORKER_THREADS` at once, so that the event loop goes on answering every other request meanwhile.
    The event streams' looks take their turn in the same threads, and at most `MAX_STREAMS` streams are open.
    """
    limiter = anyio.CapacityLimiter(WORKER_THREADS)
    slots = anyio.Semaphore(MAX_STREAMS)
    # Read every finished run's small files now, so that the first front page comes from memory (1,000 runs: 0.6 s).
    threading.Thread(target=prime_runs_table, args=(ctx,), name="runs table", daemon=True).start()

    async def in_worker(work: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(work, *args, limiter=limiter)

    async def answer(work: Callable[[], Response]) -> Response:
        try:
            return await in_worker(work)
        except (ValueError, TradewindError) as error:
            return JSONResponse({"error": str(error)}, status_code=404 if isinstance(error, NotFoundError) else 400)

    def look(run_ids: list[str]) -> dict[str, RunFiles]:
        return {run_id: RunFiles.of(RunLayout(ctx.workspace.run_dir(run_id))) for run_id in run_ids}

    def ended(run_ids: list[str]) -> tuple[bool, bool]:
        """Whether every run's trainer is done (its record says it finished: no file of it changes any more), and
        whether every run has finished as `get_run` says, the job included, which ends a moment after its trainer.
        The record is read for this decision only; what the page shows comes from the tools."""
        read = ctx.workspace.reader("run_id")
        records = [read_record(RunLayout(ctx.workspace.run_dir(run_id)).record, read) for run_id in run_ids]
        if not all(record.status.finished for record in records):
            return False, False
        return True, all(get_run(ctx, RunRequest(run_id=run_id)).status.finished for run_id in run_ids)

    async def follow(
        run_ids: list[str], seen: dict[str, RunFiles], trained: bool, finished: bool
    ) -> AsyncIterator[str]:
        """One stream's events: one at once (the page fetches what changed since it was drawn), then one for each
        look that finds a run's files changed since `seen`, until every run has `finished` (`end`) or `STREAM_S`
        has passed. `trained` and `finished` are what `ended` said of the runs when `seen` was taken."""
        yield server_event(run_ids, finished)
        stop_at = anyio.current_time() + STREAM_S
        try:
            while not finished and anyio.current_time() < stop_at:
                await anyio.sleep(LOOK_EVERY_S)
                now = await in_worker(look, run_ids)
                changed = [run_id for run_id in run_ids if now[run_id] != seen[run_id]]
                # A changed record may say a run ended; once every trainer is done, each look waits for the jobs.
                if trained or any(now[run_id].record != seen[run_id].record for run_id in changed):
                    trained, finished = await in_worker(ended, run_ids)
                seen = now
                if changed or finished:
                    yield server_event(run_ids if finished else changed, finished)
        except TradewindError:
            return  # a run's folder or record went away: the stream ends, and the next request says why

    def events(runs: str) -> Response:
        run_ids = parse_run_ids(runs)
        seen = look(run_ids)  # before `ended`: a record written after it is a change the stream's next look sees
        return EventStream(follow(run_ids, seen, *ended(run_ids)), slots)

    def index() -> Response:
        return HTMLResponse(render_index(runs_table(ctx), describe_compile_cache(ctx)))

    def table() -> Response:
        return Response(runs_table(ctx).model_dump_json(), media_type="application/json")

    def page(runs: str) -> Response:
        run_ids = parse_run_ids(runs)
        data = dashboard_data(ctx, run_ids)
        return HTMLResponse(render_page(run_ids, data, over_http=True))

    def data(runs: str) -> Response:
        return JSONResponse(dashboard_data(ctx, parse_run_ids(runs)))

    async def index_route(request: Request) -> Response:
        return await answer(index)

    async def table_route(request: Request) -> Response:
        return await answer(table)

    async def page_route(request: Request) -> Response:
        return await answer(functools.partial(page, request.path_params["runs"]))

    async def data_route(request: Request) -> Response:
        return await answer(functools.partial(data, request.query_params.get("runs", "")))

    async def events_route(request: Request) -> Response:
        return await answer(functools.partial(events, request.query_params.get("runs", "")))

    return [
        Route("/dashboard", index_route, methods=["GET"]),
        Route("/dashboard/table", table_route, methods=["GET"]),
        Route("/dashboard/runs/{runs}", page_route, methods=["GET"]),
        Route("/dashboard/data", data_route, methods=["GET"]),
        Route("/dashboard/events", events_route, methods=["GET"]),
    ]


def prime_runs_table(ctx: ToolContext) -> None:
    """Read the runs table once, for its rows of finished runs to be in memory; a workspace gone meanwhile (or
    unreadable: the front page will say why) is no matter here."""
    with contextlib.suppress(TradewindError, OSError):
        runs_table(ctx)


def render_index(table: RunsTable, compile_cache: str) -> str:
    """The front page: `table` drawn at once, sorted, filtered and grouped by its script, which fetches
    `/dashboard/table` again while runs go on."""
    config = {
        "table": table.model_dump(mode="json"),
        "tableUrl": "/dashboard/table",
        "pollMs": int(POLL_S * 1000),
        "maxRuns": MAX_RUNS,
        "finished": [status.value for status in JobStatus if status.finished],
        "compileCache": compile_cache,
    }
    return template("dashboard_index.html").replace("__CONFIG__", script_json(config))
