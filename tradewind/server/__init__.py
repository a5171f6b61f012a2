"""Server: the MCP server and its transports, a thin adapter over `tools` and `prompts`.

It registers tools, prompts and instructions and holds no logic of its own. The top layer: it may import
every other layer, and none imports it. Importing it does not import JAX.
"""

from tradewind.server.adapter import as_mcp_tool
from tradewind.server.app import build_server, serve

__all__ = ["as_mcp_tool", "build_server", "serve"]
