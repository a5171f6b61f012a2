"""Slow clients cannot hold `tradewind serve --transport http`: a request must arrive whole within
`--read-timeout-s` (headers, then body), and connections beyond `--max-connections` are answered 503 and closed.

Each server is the real subprocess on a free loopback port; the clients are raw sockets on 127.0.0.1 that send
half a request and then nothing.
"""

import socket
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx2
from http_helpers import running_server
from polling import wait_until
from runs_helpers import metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.tools import ToolContext
from tradewind.trainer import RunRecord

READ_TIMEOUT_S = 1.0
CLOSED_WITHIN_S = READ_TIMEOUT_S + 9  # the deadline, and slack for a busy machine
HALF_SENT = 20


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN_S)
    sock.settimeout(CLOSED_WITHIN_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after the socket's
    timeout."""
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass  # closed with data of ours unread: closed all the same
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open (received {received[:80]!r})") from None
    return received


def test_half_sent_requests_are_closed_after_the_read_timeout_while_a_slow_answer_is_not_cut(tmp_path):
    ctx = ToolContext.open(tmp_path / "ws")
    # Reading a run with 20,000 metrics rows for the dashboard takes about a second: longer than the read timeout.
    write_run(ctx, "big", metric_rows(20_000), RunRecord(run_id="big", backend="process", status=JobStatus.SUCCEEDED))
    with running_server(ctx.workspace.root, "--read-timeout-s", str(READ_TIMEOUT_S)) as server, ExitStack() as stack:
        host = f"Host: 127.0.0.1:{server.port}\r\n".encode()
        token = f"Authorization: Bearer {server.token()}\r\n".encode()
        half_sent = {
            "nothing sent": b"",
            "headers never finished": b"GET /dashboard HTTP/1.1\r\n" + host,
            "a declared body stalled": b"POST /mcp HTTP/1.1\r\n" + host + token + b"Content-Type: application/json\r\n"
            b'Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{"jsonrpc"',
        }
        opened = time.monotonic()
        held = []
        for index in range(HALF_SENT):
            kind, data = list(half_sent.items())[index % len(half_sent)]
            sock = stack.enter_context(connect(server.port))
            sock.sendall(data)
            held.append((kind, sock))
        slow = httpx2.get(
            f"http://127.0.0.1:{server.port}/dashboard/data?runs=big",
            headers={"Authorization": f"Bearer {server.token()}"},
            timeout=60,
        )
        for kind, sock in held:
            assert b"200 OK" not in read_until_closed(sock), kind
        closed_after = time.monotonic() - opened
        assert slow.status_code == 200 and "big" in slow.json()["runs"]
        # The server still serves once the slow clients are gone.
        assert httpx2.get(f"http://127.0.0.1:{server.port}/dashboard", timeout=10).status_code == 401
    assert closed_after < CLOSED_WITHIN_S, f"{HALF_SENT} half-sent requests took {closed_after:.1f} s to close"


def test_connections_beyond_the_bound_get_503_and_are_closed_while_one_under_it_gets_through(tmp_path):
    limit = 3
    extra = ("--max-connections", str(limit), "--read-timeout-s", "60")  # the held ones stay until closed here
    with running_server(tmp_path / "ws", *extra) as server, ExitStack() as stack:
        url = f"http://127.0.0.1:{server.port}/dashboard"
        held = [stack.enter_context(connect(server.port)) for _ in range(limit - 1)]
        assert httpx2.get(url, timeout=10).status_code == 401  # the last connection under the bound is served
        held.append(stack.enter_context(connect(server.port)))
        # The server took the held connections in order (nothing else connects to it); the next one is one too many.
        beyond = stack.enter_context(connect(server.port))
        assert read_until_closed(beyond).startswith(b"HTTP/1.1 503 ")
        held.pop().close()

        def served() -> bool:
            try:
                return httpx2.get(url, timeout=10).status_code == 401
            except httpx2.TransportError:  # refused until the server has seen the held connection close
                return False

        wait_until(served, timeout=30, what="a request served after a held connection closed")
        assert all(still_open(sock) for sock in held), "the server closed a connection within the bound"


def still_open(sock: socket.socket) -> bool:
    """Whether the server has neither sent anything on `sock` nor closed it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    return False


def test_a_read_timeout_or_connection_bound_of_zero_is_refused_naming_the_flag(tmp_path):
    for flag, value in (("--read-timeout-s", "0"), ("--read-timeout-s", "inf"), ("--max-connections", "0")):
        command = [sys.executable, "-m", "tradewind", "serve", "--workspace", str(tmp_path), flag, value]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"argument {flag}: expected a" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())
