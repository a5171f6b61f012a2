"""One gate in front of every HTTP route: Host (421), Origin (403) and the bearer token (401) are checked for every
request before any route runs, the dashboard's as well as `/mcp`'s.

The app is the one `tradewind serve --transport http` runs (`http_app`), driven in-process. The routes are read from
the app itself, so a route added later is walked too; one is added here, and it must never be reached by a request
the gate refuses.
"""

import json

import anyio
import httpx2
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from tradewind.server.app import http_app
from tradewind.tools import ToolContext

pytestmark = pytest.mark.anyio

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = "gate-test-token-0123456789abcdef"
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "gate", "version": "0"}},
    }
)
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def app_with_a_route_added_later(tmp_path, token: str | None):
    """The served app, plus a route appended to its table afterwards that counts the requests reaching it."""
    app = http_app(ToolContext.open(tmp_path / "ws"), "127.0.0.1", PORT, token=token)
    reached: list[str] = []

    async def added_later(request: Request) -> PlainTextResponse:
        reached.append(request.method)
        return PlainTextResponse("reached")

    app.router.routes.append(Route("/added-later/{name}", added_later, methods=["GET", "POST"]))
    return app, reached


def requests_for_every_route(app) -> list[tuple[str, str]]:
    """(method, path) for each route in the app's table, path parameters filled in; every method it answers."""
    requests = []
    for route in app.routes:
        if isinstance(route, Route):
            path = route.path_format.format(**dict.fromkeys(route.param_convertors, "x"))
            methods = route.methods or {"GET", "POST", "DELETE"}  # an ASGI-app endpoint answers every method
        elif isinstance(route, Mount):
            path, methods = route.path + "/x", {"GET", "POST"}
        else:
            pytest.fail(f"a route of a kind this test cannot walk: {route!r}")
        requests += [(method, path) for method in sorted(methods)]
    return requests


@pytest.mark.parametrize("auth", [True, False], ids=["token", "no-auth"])
async def test_every_route_refuses_a_foreign_host_a_foreign_origin_and_a_missing_token_before_it_runs(tmp_path, auth):
    app, reached = app_with_a_route_added_later(tmp_path, TOKEN if auth else None)
    walked = requests_for_every_route(app)
    paths = {path for _, path in walked}
    assert {"/mcp", "/dashboard", "/dashboard/runs/x", "/dashboard/data", "/added-later/x"} <= paths, paths
    token = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
    # (headers, query, status, what the refusal names); the dashboard's query token is no way past Host or Origin.
    refusals = [
        ({**token, "Host": "evil.example"}, f"?token={TOKEN}", 421, "--allow-host"),
        ({**token, "Host": f"evil.example:{PORT}"}, f"?token={TOKEN}", 421, "--allow-host"),
        ({**token, "Origin": "http://evil.example"}, f"?token={TOKEN}", 403, "--allow-origin"),
        ({**token, "Origin": "null"}, f"?token={TOKEN}", 403, "--allow-origin"),
    ]
    if auth:
        refusals += [({}, "", 401, "Bearer"), ({"Authorization": "Bearer wrong"}, "?token=wrong", 401, "Bearer")]
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE) as client:
        for method, path in walked:
            for headers, query, status, names in refusals:
                response = await client.request(method, path + query, headers=headers, content=b"{}")
                named = method == "HEAD" or names in response.text  # a HEAD answer has no body
                assert (response.status_code, named) == (status, True), (method, path, headers)
    assert reached == [], "a refused request reached a route"


async def test_a_good_request_passes_the_gate_to_mcp_the_dashboard_and_a_route_added_later(tmp_path):
    app, reached = app_with_a_route_added_later(tmp_path, TOKEN)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with anyio.fail_after(30):
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE) as client,
        ):
            local_origin = {**bearer, **MCP_HEADERS, "Origin": f"http://localhost:{PORT}"}
            initialized = await client.post("/mcp", content=INITIALIZE, headers=local_origin)
            index = await client.get("/dashboard", headers=bearer)
            linked = await client.get(f"/dashboard?token={TOKEN}")  # a browser opening the printed link
            added = await client.post("/added-later/x", headers=bearer)
    assert initialized.status_code == 200 and "mcp-session-id" in initialized.headers
    assert '"serverInfo"' in initialized.text
    assert (index.status_code, linked.status_code) == (200, 200) and "Tradewind runs" in index.text
    assert added.text == "reached" and reached == ["POST"]
