"""The Tradewind MCP server: the tools, prompts and instructions, over stdio or streamable HTTP.

Commands:
    tradewind serve                                        # stdio, for an agent that starts the server
    tradewind serve --transport http --host 127.0.0.1 --port 8765   # streamable HTTP at /mcp

HTTP requests need the bearer token and pass Host/Origin allowlists and a body cap; see `security`.
"""

from __future__ import annotations

import sys
from typing import Literal

from mcp.server.mcpserver import MCPServer

from tradewind import __version__
from tradewind.prompts import render_prompt, server_instructions
from tradewind.server.adapter import as_mcp_tool
from tradewind.server.security import (
    MAX_REQUEST_BODY_BYTES,
    BearerTokenMiddleware,
    check_bind,
    load_or_create_token,
    transport_security,
)
from tradewind.tools import TOOLS, ToolContext


def build_server(ctx: ToolContext) -> MCPServer:
    """An MCP server whose tools act on `ctx`'s workspace."""
    server = MCPServer(name="tradewind", version=__version__, instructions=server_instructions())
    for tool in TOOLS:
        server.add_tool(as_mcp_tool(tool, ctx), name=tool.__name__, structured_output=True)

    @server.prompt(description="Step-by-step plan to tokenize a text, train on it and report the result.")
    def train_on_text(input: str = "builtin:tinyshakespeare", steps: int = 300) -> str:
        return render_prompt("train_on_text", input=input, steps=steps)

    return server


def serve(
    ctx: ToolContext,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    auth: bool = True,
    allow_origins: tuple[str, ...] = (),
    allow_hosts: tuple[str, ...] = (),
) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped (HTTP).

    Over HTTP: bearer-token auth unless `auth=False` (loopback only), Host/Origin allowlists extended by
    `allow_hosts`/`allow_origins`, and request bodies capped at `MAX_REQUEST_BODY_BYTES`.
    """
    if transport == "stdio":
        build_server(ctx).run("stdio")
        return
    check_bind(host, auth=auth)
    security = transport_security(host, port, allow_origins, allow_hosts)
    server = build_server(ctx)
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        max_request_body_size=MAX_REQUEST_BODY_BYTES,
        transport_security=security,
        host=host,
    )
    if auth:
        token, source = load_or_create_token(ctx.workspace.root)
        app = BearerTokenMiddleware(app, token)
        print(f"tradewind serve: HTTP needs 'Authorization: Bearer <token>'; token from {source}", file=sys.stderr)
    else:
        print(
            f"tradewind serve: WARNING: --no-auth: any local process can use http://{host}:{port}/mcp",
            file=sys.stderr,
        )
    _run_uvicorn(app, host, port, server.settings.log_level)


def _run_uvicorn(app, host: str, port: int, log_level: str) -> None:
    import anyio
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower())
    anyio.run(uvicorn.Server(config).serve)
