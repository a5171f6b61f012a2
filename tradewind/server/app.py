"""The Tradewind MCP server: the tools, prompts and instructions, over stdio or streamable HTTP.

Commands:
    tradewind serve                                        # stdio, for an agent that starts the server
    tradewind serve --transport http --host 127.0.0.1 --port 8765   # streamable HTTP at /mcp, dashboard at /dashboard

HTTP requests need the bearer token and pass Host/Origin allowlists and a body cap; see `security`.
"""

from __future__ import annotations

import inspect
import sys
import typing
from typing import Any, Literal

from mcp.server.apps import Apps
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.applications import Starlette

from tradewind import __version__
from tradewind.prompts import server_instructions
from tradewind.server.adapter import as_mcp_tool, compact_sections, lean_input_schema, request_schema
from tradewind.server.dashboard import DASHBOARD_TOOLS, DASHBOARD_URI, dashboard_app_html, dashboard_routes
from tradewind.server.http import MAX_CONNECTIONS, READ_TIMEOUT_S, run_http
from tradewind.server.resources import register_prompts, register_resources, schema_uri
from tradewind.server.security import (
    MAX_REQUEST_BODY_BYTES,
    HttpGate,
    check_bind,
    load_or_create_token,
    transport_security,
)
from tradewind.tools import TOOLS, ToolContext


def _hints(title: str, *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


# What MCP takes a hint a tool leaves out to be (`ToolAnnotations`): a listing without those says the same.
SPEC_DEFAULT_HINTS = {
    "read_only_hint": False,
    "destructive_hint": True,
    "idempotent_hint": False,
    "open_world_hint": True,
}


def listed_hints(hints: ToolAnnotations) -> ToolAnnotations:
    """`hints` as tools/list carries them: without the title (the tool's own, listed once) and without each hint
    that equals the spec's default (751 characters of the list, every tool's four hints being stated)."""
    return ToolAnnotations(
        **{
            name: getattr(hints, name)
            for name, default in SPEC_DEFAULT_HINTS.items()
            if getattr(hints, name) != default
        }
    )


# Each tool's title and what it does to the world, the one place they are stated.
# read_only: changes nothing in the workspace or on a backend (a tool that writes a file, even a log, is not).
# destructive: may delete or stop something that was there (cancel_run stops a run; run_pipeline runs the user's
#   own step code, which may do anything). Writing new files, or rewriting a file the tool owns, is not.
# idempotent: calling again with the same arguments changes nothing more (caches reused, a report rewritten).
# open_world: may reach outside the workspace and this machine's processes: a Ray cluster (runs go to one when
#   the backend is 'ray', and run tools ask the run's backend about its job) or user code (run_pipeline). Dataset
#   tools read only files under the workspace's allowed roots, so they are closed-world.
TOOL_HINTS: dict[str, ToolAnnotations] = {
    "tokenize_dataset": _hints(
        "Tokenize a dataset", read_only=False, destructive=False, idempotent=True, open_world=False
    ),
    "train_tokenizer": _hints(
        "Train a BPE tokenizer", read_only=False, destructive=False, idempotent=True, open_world=False
    ),
    "inspect_dataset": _hints(
        "Inspect a dataset", read_only=True, destructive=False, idempotent=True, open_world=False
    ),
    "list_datasets": _hints("List datasets", read_only=True, destructive=False, idempotent=True, open_world=False),
    "estimate_run": _hints("Estimate a run", read_only=False, destructive=False, idempotent=True, open_world=True),
    "launch_training": _hints(
        "Launch a training run", read_only=False, destructive=False, idempotent=False, open_world=True
    ),
    "get_run": _hints("Get a run's status", read_only=True, destructive=False, idempotent=True, open_world=True),
    "wait_for_run": _hints("Wait for a run", read_only=True, destructive=False, idempotent=True, open_world=True),
    "list_runs": _hints("List runs", read_only=True, destructive=False, idempotent=True, open_world=True),
    "cancel_run": _hints("Cancel a run", read_only=False, destructive=True, idempotent=True, open_world=True),
    "read_metrics": _hints(
        "Read a run's metrics", read_only=True, destructive=False, idempotent=True, open_world=False
    ),
    "tail_logs": _hints("Read a run's log", read_only=True, destructive=False, idempotent=True, open_world=False),
    "profile_run": _hints(
        "Profile a run's steps", read_only=False, destructive=False, idempotent=False, open_world=False
    ),
    "summarize_report": _hints(
        "Write a run report", read_only=False, destructive=False, idempotent=True, open_world=False
    ),
    "compare_runs": _hints("Compare runs", read_only=False, destructive=False, idempotent=True, open_world=False),
    "list_experiments": _hints(
        "List experiments", read_only=False, destructive=False, idempotent=True, open_world=True
    ),
    "set_experiment_status": _hints(
        "Keep or discard an experiment", read_only=False, destructive=False, idempotent=True, open_world=True
    ),
    "launch_sweep": _hints("Launch a sweep", read_only=False, destructive=False, idempotent=False, open_world=True),
    "get_sweep": _hints("Get a sweep", read_only=True, destructive=False, idempotent=True, open_world=True),
    "cancel_sweep": _hints("Cancel a sweep", read_only=False, destructive=True, idempotent=True, open_world=True),
    "sample_text": _hints(
        "Sample text from a run", read_only=False, destructive=False, idempotent=False, open_world=False
    ),
    "export_model": _hints("Export a model", read_only=False, destructive=True, idempotent=True, open_world=False),
    "run_pipeline": _hints("Run a pipeline", read_only=False, destructive=True, idempotent=False, open_world=True),
    "cluster_status": _hints(
        "Show cluster status", read_only=True, destructive=False, idempotent=True, open_world=True
    ),
}


def _mcp_tool(tool, ctx: ToolContext, listed_results: dict[type, str]) -> Tool:
    """`tool` as the SDK lists it: its table entry, its docstring's first paragraph, and lean schemas.

    A nested config section (`model`, `optimizer`) is listed by its field names; its whole schema is the
    resource `tradewind://schema/{tool}`, which the description then names. The rest of the docstring, and the result
    fields' types and meanings, are for the reference page (`tradewind.server.reference`).
    """
    hints = TOOL_HINTS[tool.__name__]
    listed = Tool.from_function(
        as_mcp_tool(tool, ctx),
        name=tool.__name__,
        title=hints.title,
        description=" ".join(inspect.cleandoc(tool.__doc__ or "").split("\n\n")[0].split()),
        annotations=listed_hints(hints),
        structured_output=True,
        meta={"ui": {"resourceUri": DASHBOARD_URI}} if tool.__name__ in DASHBOARD_TOOLS else None,
    )
    listed.parameters, sections = compact_sections(lean_input_schema(listed.parameters))
    if sections:  # named once for all of them, not in each section's description
        listed.description = f"{listed.description} Full schema: {schema_uri(tool.__name__)}."
    result_model = typing.get_type_hints(tool)["return"]
    listed.fn_metadata.output_schema = _output_schema(tool.__name__, result_model, listed_results)
    return listed


def _output_schema(name: str, result_model: type[BaseModel], listed_results: dict[type, str]) -> dict[str, Any]:
    """What tool `name` returns, as listed: the names of its result's fields, each always there.

    A result is named JSON, so its field names are what an agent needs before calling; their types and meanings
    are on the tool's reference page. A result model an earlier tool in the list returned (or one it extends) is
    listed once: later tools list only the fields they add, naming the tool whose result has the rest.
    `listed_results` maps each model listed so far to its tool.
    """
    shared = next((model for model in result_model.__mro__ if model in listed_results), None)
    if shared is None:
        listed_results[result_model] = name
        return {"type": "object", "required": list(result_model.model_fields)}
    added = [field for field in result_model.model_fields if field not in shared.model_fields]
    owner = listed_results[shared]
    if not added:
        return {"type": "object", "description": f"The fields of {owner}'s result."}
    return {"type": "object", "description": f"The fields of {owner}'s result, and these.", "required": added}


READ_ONLY_NOTE = (
    "\n\nThis server is read-only (`tradewind serve --read-only`): it lists only the tools that change nothing, so "
    "it can show datasets, runs, metrics and logs but not start, stop or write anything."
)


def build_server(ctx: ToolContext, *, read_only: bool = False) -> MCPServer:
    """An MCP server whose tools act on `ctx`'s workspace; with `read_only`, only the tools that change nothing."""
    tools = [tool for tool in TOOLS if TOOL_HINTS[tool.__name__].read_only_hint or not read_only]
    listed_results: dict[type, str] = {}
    # MCP Apps hosts render the dashboard beside get_run and read_metrics; other hosts ignore it.
    apps = Apps()
    apps.add_html_resource(DASHBOARD_URI, dashboard_app_html(), title="Tradewind run dashboard")
    server = MCPServer(
        name="tradewind",
        version=__version__,
        instructions=server_instructions() + (READ_ONLY_NOTE if read_only else ""),
        tools=[_mcp_tool(tool, ctx, listed_results) for tool in tools],
        extensions=[apps],
    )
    register_resources(server, ctx, {tool.__name__: request_schema(tool) for tool in tools})
    register_prompts(server)
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
    run_http(app, host, port, read_timeout_s=read_timeout_s, max_connections=max_connections)
