"""Round trips over the real transports: `tradewind serve` as a stdio subprocess and over HTTP on loopback."""

import os
import sys

import anyio
import httpx2
import pytest
from http_helpers import running_server
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tradewind.core import Workspace

pytestmark = pytest.mark.anyio


async def list_tools_and_runs(client: Client) -> tuple[list[str], int]:
    tools = [tool.name for tool in (await client.list_tools()).tools]
    runs = await client.call_tool("list_runs", {})
    assert not runs.is_error, runs.content
    return tools, runs.structured_content["total"]


async def test_stdio_round_trip(tmp_path):
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tradewind", "serve", "--workspace", str(tmp_path)],
        env=dict(os.environ),
    )
    with anyio.fail_after(60):
        async with Client(server) as client:
            tools, total = await list_tools_and_runs(client)
            bad = await client.call_tool("get_run", {"run_id": "run-nope"})
    assert "launch_training" in tools and total == 0
    assert bad.is_error and "unknown run id 'run-nope'" in bad.content[0].text


async def test_stdio_read_only_serves_only_the_tools_that_change_nothing(tmp_path):
    Workspace(tmp_path)  # made by a writer first: a read-only server makes nothing
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tradewind", "serve", "--workspace", str(tmp_path), "--read-only"],
        env=dict(os.environ),
    )
    with anyio.fail_after(60):
        async with Client(server) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            refused = await client.call_tool("launch_training", {"dataset": "builtin:tinyshakespeare", "steps": 1})
    assert "list_runs" in tools and "read_metrics" in tools
    assert all(tool.annotations.read_only_hint for tool in tools.values())
    assert "launch_training" not in tools and "cancel_run" not in tools and "run_pipeline" not in tools
    assert refused.is_error and "launch_training" in refused.content[0].text
    assert not any((tmp_path / "runs").iterdir())


async def test_streamable_http_round_trip_on_loopback(tmp_path):
    with running_server(tmp_path) as server:  # the token comes from the file the server writes
        auth = {"Authorization": f"Bearer {server.token()}"}
        with anyio.fail_after(60):
            async with (
                httpx2.AsyncClient(headers=auth, timeout=30) as http,
                Client(streamable_http_client(server.url, http_client=http)) as client,
            ):
                tools, total = await list_tools_and_runs(client)
        assert "summarize_report" in tools and total == 0
        assert httpx2.get(f"http://127.0.0.1:{server.port}/not-mcp", headers=auth, timeout=5).status_code == 404
