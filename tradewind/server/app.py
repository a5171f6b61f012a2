"""The Tradewind MCP server: the tools, prompts and instructions, over stdio or streamable HTTP.

Commands:
    tradewind serve                                        # stdio, for an agent that starts the server
    tradewind serve --transport http --host 127.0.0.1 --port 8765   # streamable HTTP at /mcp
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer

from tradewind import __version__
from tradewind.prompts import render_prompt, server_instructions
from tradewind.server.adapter import as_mcp_tool
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
) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped (HTTP)."""
    server = build_server(ctx)
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port, streamable_http_path="/mcp")
