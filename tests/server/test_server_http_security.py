"""HTTP security of `tradewind serve --transport http`: bearer token, Host/Origin allowlists, bind rules, body cap.

Every server here is a real subprocess on a free loopback port; clients connect only through 127.0.0.1.
"""

import json
import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from http_helpers import TOKEN_FILE, Server, free_loopback_port, running_server, serve_command, server_env
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tradewind.core import Workspace

pytestmark = pytest.mark.anyio

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("workspace")) as started:
        yield started


def call_list_runs(request_id: int = 1) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "list_runs", "arguments": {}}}
    )


def initialize() -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "security-test", "version": "0"},
            },
        }
    )


def post(url: str, body: str | bytes, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.post(url, content=body, headers={**JSON_HEADERS, **(headers or {})}, timeout=10)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def workspace_files(workspace: Path) -> set[Path]:
    return set(workspace.rglob("*"))


async def list_tools_and_runs(url: str, token: str) -> tuple[list[str], int]:
    """A real MCP session over streamable HTTP that sends the token on every request."""
    with anyio.fail_after(60):
        async with (
            httpx2.AsyncClient(headers=bearer(token), timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            tools = [tool.name for tool in (await client.list_tools()).tools]
            runs = await client.call_tool("list_runs", {})
    assert not runs.is_error, runs.content
    return tools, runs.structured_content["total"]


def test_the_token_file_is_created_with_mode_0600_and_its_path_but_not_the_token_goes_to_stderr(server):
    path = server.workspace / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(server.token()) >= 32
    assert str(path) in server.stderr and server.token() not in server.stderr


def test_a_request_without_the_token_gets_401_and_runs_no_tool(server):
    before = workspace_files(server.workspace)
    for body in (initialize(), call_list_runs()):
        response = post(server.url, body)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "mcp-session-id" not in response.headers and '"result"' not in response.text
    assert httpx2.get(f"http://127.0.0.1:{server.port}/not-mcp", timeout=10).status_code == 401
    assert workspace_files(server.workspace) == before


def test_a_wrong_or_malformed_token_gets_401(server):
    for headers in (bearer("not-the-token"), bearer(server.token() + "x"), {"Authorization": server.token()}):
        assert post(server.url, initialize(), headers).status_code == 401


async def test_the_right_token_opens_a_real_session_that_lists_tools_and_calls_list_runs(server):
    tools, total = await list_tools_and_runs(server.url, server.token())
    assert "list_runs" in tools and "launch_training" in tools and total == 0


def test_a_foreign_origin_gets_403_even_with_the_token(server):
    headers = {**bearer(server.token()), "Origin": "http://evil.example"}
    assert post(server.url, initialize(), headers).status_code == 403
    same_host = {**bearer(server.token()), "Origin": f"http://localhost:{server.port}"}
    assert post(server.url, initialize(), same_host).status_code == 200


def test_a_foreign_host_header_is_refused_even_with_the_token(server):
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1:1"):
        response = post(server.url, initialize(), {**bearer(server.token()), "Host": host})
        assert response.status_code in (403, 421), (host, response.status_code)


def test_the_dashboard_refuses_a_foreign_host_or_origin_with_or_without_the_token(server):
    base = f"http://127.0.0.1:{server.port}"
    for path in ("/dashboard", "/dashboard/table", "/dashboard/runs/run-x", "/dashboard/data?runs=run-x"):
        for token in (bearer(server.token()), {}):
            for headers, status in (({"Host": "evil.example"}, 421), ({"Origin": "http://evil.example"}, 403)):
                response = httpx2.get(base + path, headers={**token, **headers}, timeout=10)
                assert response.status_code == status, (path, token != {}, headers, response.status_code)


def test_a_body_over_the_1_mib_cap_gets_413(server):
    padding = "x" * (1024 * 1024)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": padding}})
    assert post(server.url, body, bearer(server.token())).status_code == 413


def test_tradewind_token_overrides_the_token_file(tmp_path):
    (tmp_path / TOKEN_FILE).write_text("file-token\n")
    os.chmod(tmp_path / TOKEN_FILE, 0o600)
    with running_server(tmp_path, env=server_env("env-token-0123456789")) as server:
        assert post(server.url, initialize(), bearer("file-token")).status_code == 401
        assert post(server.url, initialize(), bearer("env-token-0123456789")).status_code == 200
        assert "TRADEWIND_TOKEN" in server.stderr and "env-token-0123456789" not in server.stderr


async def test_binding_all_interfaces_with_auth_still_checks_token_host_and_origin(tmp_path):
    with running_server(tmp_path, "--host", "0.0.0.0") as server:
        assert post(server.url, initialize()).status_code == 401
        token = bearer(server.token())
        assert post(server.url, initialize(), {**token, "Origin": "http://evil.example"}).status_code == 403
        assert post(server.url, initialize(), {**token, "Host": "evil.example"}).status_code in (403, 421)
        tools, total = await list_tools_and_runs(server.url, server.token())
    assert "list_runs" in tools and total == 0


def test_no_auth_on_all_interfaces_is_refused_with_exit_2_before_serving(tmp_path):
    workspace = tmp_path / "workspace"
    port = free_loopback_port()
    done = subprocess.run(
        serve_command(workspace, port, "--host", "0.0.0.0", "--no-auth"),
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(),
    )
    assert done.returncode == 2
    assert "--no-auth is allowed only on a loopback address" in done.stderr and "0.0.0.0" in done.stderr
    assert "Uvicorn running" not in done.stderr and not workspace.exists()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_no_auth_on_loopback_warns_and_keeps_host_and_origin_checks_with_allowed_origins(tmp_path):
    extra = ("--no-auth", "--allow-origin", "http://app.example:3000/")
    with running_server(tmp_path, *extra) as server:
        assert "WARNING: --no-auth" in server.stderr
        assert post(server.url, initialize()).status_code == 200
        assert post(server.url, initialize(), {"Origin": "http://app.example:3000"}).status_code == 200
        assert post(server.url, initialize(), {"Origin": "http://evil.example"}).status_code == 403
        assert post(server.url, initialize(), {"Host": "evil.example"}).status_code in (403, 421)
    assert not (tmp_path / TOKEN_FILE).exists()


def test_a_read_only_http_server_never_makes_the_token_file(tmp_path):
    Workspace(tmp_path)  # made by a writer: a read-only server makes nothing
    done = subprocess.run(
        serve_command(tmp_path, free_loopback_port(), "--read-only"),
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(),
    )
    assert done.returncode == 2 and "no token for a read-only server" in done.stderr, done.stderr
    assert "TRADEWIND_TOKEN" in done.stderr and not (tmp_path / TOKEN_FILE).exists()
    with running_server(tmp_path, "--read-only", env=server_env("env-token")) as server:
        assert post(server.url, initialize(), bearer("env-token")).status_code == 200
    assert not (tmp_path / TOKEN_FILE).exists()
