"""Slow clients cannot hold `tradewind serve --transport http`: a request must arrive whole within
`--read-timeout-s` (headers, then body), connections beyond `--max-connections` are answered 503 and closed, and
connections that have not shown the token give way to newer ones, so no flood of them keeps a token holder out.

Each server is the real subprocess on a free loopback port; the clients are raw sockets on 127.0.0.1 (and, for
a second address, 127.0.0.2) that send half a request and then nothing.
"""

import resource
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, suppress

import httpx2
import pytest
from http_helpers import Server, running_server
from polling import wait_until
from runs_helpers import metric_rows, write_run

from tradewind.cluster import JobStatus
from tradewind.runs import RunRecord
from tradewind.server.http import MAX_CONNECTIONS
from tradewind.tools import ToolContext

READ_TIMEOUT_S = 1.0
CLOSED_WITHIN_S = READ_TIMEOUT_S + 9  # the deadline, and slack for a busy machine
HALF_SENT = 20
FLOOD = 1_000
HALF_OPEN = b"POST /mcp HTTP/1.1\r\n"  # what a flood sends: a request line, then nothing
ANSWERED_WITHIN_S = 1.0


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


def held_with_the_token(server: Server) -> socket.socket:
    """A connection whose request shows the token and then withholds its body: it returns once the server has read
    the headers and asked for the body (`Expect: 100-continue`), and the server then waits for the read timeout."""
    sock = connect(server.port)
    sock.sendall(
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {server.token()}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        "Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n".encode()
    )
    assert sock.recv(4096).startswith(b"HTTP/1.1 100 "), "the server did not ask for the body"
    return sock


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
        held = [stack.enter_context(held_with_the_token(server)) for _ in range(limit - 1)]
        assert httpx2.get(url, timeout=10).status_code == 401  # the last connection under the bound is served
        held.append(stack.enter_context(held_with_the_token(server)))
        # Every open connection has shown the token, so none gives way: the next one is one too many.
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


@pytest.fixture
def files_for_a_flood():
    """Room for the flood's sockets under this process's open-file limit (which the server it starts inherits):
    the soft limit raised up to the hard one for the test, or the test skipped when the hard one is too low."""
    needed = FLOOD + 256  # the flood's sockets, and the files pytest and the test's clients hold
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"a flood of {FLOOD} connections needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def flood_while_calling(server: Server, stack: ExitStack, connections: int, rounds: int) -> list[tuple[int, float]]:
    """Open `connections` half-open connections from 127.0.0.1 (kept until `stack` closes them) in `rounds` bursts,
    each followed by a request that shows the token: it arrives as the last of a fresh burst, while connections
    without the token fill whatever room they may. Each request's status and seconds."""
    bearer = {"Authorization": f"Bearer {server.token()}"}
    answers = []
    for _ in range(rounds):
        for _ in range(connections // rounds):
            sock = stack.enter_context(connect(server.port))
            with suppress(ConnectionError):  # the server may have closed it already, to make way
                sock.sendall(HALF_OPEN)
        started = time.monotonic()
        status = httpx2.get(f"http://127.0.0.1:{server.port}/dashboard", headers=bearer, timeout=60).status_code
        answers.append((status, round(time.monotonic() - started, 3)))
    return answers


def test_a_client_with_the_token_is_answered_within_a_second_amid_a_thousand_half_open_connections_from_its_address(
    tmp_path, files_for_a_flood
):
    # Default bounds: 128 connections, a 10 s read timeout; the flood is several times the bound, from the same
    # address as the client, and renewed before each of its requests.
    with running_server(tmp_path / "ws") as server, ExitStack() as stack:
        answers = flood_while_calling(server, stack, FLOOD, rounds=20)
    slowest = max(seconds for _, seconds in answers)
    assert all(status == 200 for status, _ in answers) and slowest < ANSWERED_WITHIN_S, answers


def test_a_flood_from_one_address_closes_no_half_sent_request_from_another(tmp_path):
    with running_server(tmp_path / "ws") as server, ExitStack() as stack:
        head = f"GET /dashboard HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {server.token()}\r\n"
        others = []
        for _ in range(8):
            sock = socket.socket()
            stack.enter_context(sock)
            sock.settimeout(CLOSED_WITHIN_S)
            try:
                sock.bind(("127.0.0.2", 0))  # all of 127.0.0.0/8 is loopback on Linux
            except OSError as error:
                pytest.skip(f"127.0.0.2 is not this machine's: {error}")
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(head.encode())  # the headers' end, and with it the token, still to come
            others.append(sock)
        answers = flood_while_calling(server, stack, 2 * MAX_CONNECTIONS, rounds=4)
        for sock in others:
            sock.sendall(b"\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 "), "a connection from 127.0.0.2 was closed"
    assert all(status == 200 for status, _ in answers), answers


def test_a_connection_without_the_token_has_seconds_for_its_headers_and_one_with_it_the_read_timeout(tmp_path):
    with running_server(tmp_path / "ws", "--read-timeout-s", "60") as server, ExitStack() as stack:
        with_token = stack.enter_context(held_with_the_token(server))
        without = stack.enter_context(connect(server.port))
        without.sendall(HALF_OPEN)
        assert read_until_closed(without) == b""  # within CLOSED_WITHIN_S, far short of the 60 s read timeout
        assert still_open(with_token), "the connection that showed the token was closed before its read timeout"
