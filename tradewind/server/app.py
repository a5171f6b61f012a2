"""The Tradewind MCP server: the tools, prompts and instructions, over stdio or streamable HTTP.

Commands:
    tradewind serve                                        # stdio, for an agent that starts the server
    tradewind serve --transport http --host 127.0.0.1 --port 8765   # streamable HTTP at /mcp, dashboard at /dashboard

HTTP requests need the bearer token and pass Host/Origin allowlists and a body cap; see `security`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, Literal

from mcp.server.apps import Apps
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.types import ToolAnnotations
from starlette.applications import Starlette

from tradewind import __version__
from tradewind.prompts import server_instructions
from tradewind.server.adapter import as_mcp_tool, compact_sections, lean_input_schema, request_schema
from tradewind.server.completion import register_completions
from tradewind.server.dashboard import DASHBOARD_URI, dashboard_app_html, dashboard_routes
from tradewind.server.http import MAX_CONNECTIONS, READ_TIMEOUT_S, run_http
from tradewind.server.resources import register_prompts, register_resources, schema_uri
from tradewind.server.security import (
    MAX_REQUEST_BODY_BYTES,
    HttpGate,
    check_bind,
    load_or_create_token,
    transport_security,
)
from tradewind.server.updates import RunWatcher
from tradewind.tools import TOOLS, ToolContext
from tradewind.tools.spec import spec_of

# What MCP takes a hint a tool leaves out to be (`ToolAnnotations`): a listing without those says the same.
SPEC_DEFAULT_HINTS = {
    "read_only_hint": False,
    "destructive_hint": True,
    "idempotent_hint": False,
    "open_world_hint": True,
}
# The hints MCP says are "meaningful only when readOnlyHint == false": a client reads none of them on a read-only tool.
WRITING_HINTS = ("destructive_hint", "idempotent_hint")


def tool_hints(tool: Callable[..., Any]) -> ToolAnnotations:
    """The title and four hints of `tool`, as its `@tool` declaration states them (`tradewind.tools.spec`)."""
    spec = spec_of(tool)
    return ToolAnnotations(
        title=spec.title,
        read_only_hint=spec.read_only,
        destructive_hint=spec.destructive,
        idempotent_hint=spec.idempotent,
        open_world_hint=spec.open_world,
    )


def listed_hints(hints: ToolAnnotations) -> ToolAnnotations:
    """`hints` as tools/list carries them, saying the same in fewer characters: without the title (the tool's own,
    listed once), without a hint that equals the spec's default, and, on a read-only tool, without the hints a
    client reads only on a tool that changes things (`WRITING_HINTS`)."""
    listed = {
        name: getattr(hints, name)
        for name, default in SPEC_DEFAULT_HINTS.items()
        if getattr(hints, name) != default and not (hints.read_only_hint and name in WRITING_HINTS)
    }
    return ToolAnnotations(**listed)


# What every tool's result is, as listed: JSON with named fields, sent as structured content. Their names, types and
# meanings are on the tool's reference page and in the result itself: an agent chooses a tool by its description,
# and listing each result's field names cost every agent 2,500 characters of tools/list in every conversation.
OUTPUT_SCHEMA = {"type": "object"}


def _mcp_tool(tool, ctx: ToolContext) -> Tool:
    """`tool` as the SDK lists it: its table entry, its docstring's first paragraph, and lean schemas.

    A nested config section (`model`, `optimizer`) is listed by its field names; its whole schema is the
    resource `tradewind://schema/{tool}`, which the description then names. The rest of the docstring, and the result
    fields' types and meanings, are for the reference page (`tradewind.server.reference`).
    """
    hints = tool_hints(tool)
    listed = Tool.from_function(
        as_mcp_tool(tool, ctx),
        name=tool.__name__,
        title=hints.title,
        description=" ".join(inspect.cleandoc(tool.__doc__ or "").split("\n\n")[0].split()),
        annotations=listed_hints(hints),
        structured_output=True,
        meta={"ui": {"resourceUri": DASHBOARD_URI}} if spec_of(tool).dashboard else None,
    )
    listed.parameters, sections = compact_sections(lean_input_schema(listed.parameters))
    if sections:  # named once for all of them, not in each section's description
        listed.description = f"{listed.description} Full schema: {schema_uri(tool.__name__)}."
    listed.fn_metadata.output_schema = dict(OUTPUT_SCHEMA)  # each tool its own: the SDK may add to it
    return listed


READ_ONLY_NOTE = (
    "\n\nThis server is read-only (`tradewind serve --read-only`): it lists only the tools that change nothing, so "
    "it can show datasets, runs, metrics and logs but not start, stop or write anything."
)


def build_server(ctx: ToolContext, *, read_only: bool = False) -> MCPServer:
    """An MCP server whose tools act on `ctx`'s workspace; with `read_only`, only the tools that change nothing."""
    tools = [tool for tool in TOOLS if spec_of(tool).read_only or not read_only]
    # MCP Apps hosts render the dashboard beside get_run and read_metrics; other hosts ignore it.
    apps = Apps()
    apps.add_html_resource(DASHBOARD_URI, dashboard_app_html(), title="Tradewind run dashboard")
    # The bus `subscriptions/listen` streams read; the run watcher publishes the runs' changes on it.
    bus = InMemorySubscriptionBus()
    server = MCPServer(
        name="tradewind",
        version=__version__,
        instructions=server_instructions() + (READ_ONLY_NOTE if read_only else ""),
        tools=[_mcp_tool(tool, ctx) for tool in tools],
        extensions=[apps],
        subscriptions=bus,
    )
    register_resources(server, ctx, {tool.__name__: request_schema(tool) for tool in tools})
    register_prompts(server)
    register_completions(server, ctx, [tool.__name__ for tool in tools])
    server.middleware.append(RunWatcher(ctx.workspace, bus))
    return server


def http_app(
    ctx: ToolContext,
    host: str,
    port: int,
    *,
    token: str | None,
    allow_origins: tuple[str, ...] = (),
    allow_hosts: tuple[str, ...] = (),
    read_only: bool = False,
) -> Starlette:
    """The HTTP app `serve` runs: streamable HTTP at `/mcp`, the dashboard beside it, all behind one `HttpGate`.

    `token` is the bearer token every request needs (None: `--no-auth`, refused unless `host` is loopback);
    `host` and `port` are the bound address, which Host and Origin must name (or `allow_hosts`, `allow_origins`).
    The gate is the app's outermost middleware, so it runs before routing: a route added to `app.routes` later
    is behind it too.
    """
    check_bind(host, auth=token is not None)
    security = transport_security(host, port, allow_origins, allow_hosts)
    app = build_server(ctx, read_only=read_only).streamable_http_app(
        streamable_http_path="/mcp",
        max_request_body_size=MAX_REQUEST_BODY_BYTES,
        transport_security=security,
        host=host,
    )
    app.router.routes.extend(dashboard_routes(ctx))
    app.add_middleware(HttpGate, security=security, token=token)
    return app


def serve(
    ctx: ToolContext,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    auth: bool = True,
    allow_origins: tuple[str, ...] = (),
    allow_hosts: tuple[str, ...] = (),
    read_only: bool = False,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped (HTTP).

    Over HTTP (`http_app`): bearer-token auth unless `auth=False` (loopback only), Host/Origin allowlists extended
    by `allow_hosts`/`allow_origins`, request bodies capped at `MAX_REQUEST_BODY_BYTES`; a request must arrive
    within `read_timeout_s` and at most `max_connections` are open at once (`run_http`). With `read_only`, only
    the tools that change nothing are served.
    """
    if transport == "stdio":
        build_server(ctx, read_only=read_only).run("stdio")
        return
    token, source = load_or_create_token(ctx.workspace.root, read_only) if auth else (None, None)
    app = http_app(
        ctx, host, port, token=token, allow_origins=allow_origins, allow_hosts=allow_hosts, read_only=read_only
    )
    if auth:
        print(f"tradewind serve: HTTP needs 'Authorization: Bearer <token>'; token from {source}", file=sys.stderr)
        print(f"tradewind serve: run dashboard at http://{host}:{port}/dashboard?token=<token>", file=sys.stderr)
    else:
        print(
            f"tradewind serve: WARNING: --no-auth: any local process can use http://{host}:{port}/mcp",
            file=sys.stderr,
        )
        print(f"tradewind serve: run dashboard at http://{host}:{port}/dashboard", file=sys.stderr)
    run_http(app, host, port, token=token, read_timeout_s=read_timeout_s, max_connections=max_connections)
