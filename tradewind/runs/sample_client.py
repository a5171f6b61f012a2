"""The sampling worker's client side: where its socket is, and one request and its answer as JSON lines.

The worker (`tradewind.trainer.sample_worker`, a job) listens on a Unix socket in the workspace's jobs folder and
answers one request per connection, one JSON line each way, at most `MAX_MESSAGE_BYTES`; the `sample_text` and
`export_model` tools ask it through these functions, and it reads and answers with `read_line` and `send_line`.

Example:
    reply = exchange(socket_path(jobs_dir), {"op": "ping"}, timeout_s=5)   # {"pid": ..., "error": None}
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tradewind.core import TradewindError

SOCKET_NAME = "sample-worker.sock"
LOCK_NAME = "sample-worker.lock"
IDLE_ENV = "TRADEWIND_SAMPLE_WORKER_IDLE_S"
DEFAULT_IDLE_S = 600.0
MAX_MESSAGE_BYTES = 1 << 20
_SUN_PATH_MAX = 100  # sockaddr_un holds 104 (macOS) to 108 (Linux) bytes


def socket_path(jobs_dir: Path) -> Path:
    """The worker's socket for the workspace whose jobs folder is `jobs_dir`: in it when the path fits a
    socket address, else a name in the temporary folder derived from it."""
    path = Path(jobs_dir).absolute() / SOCKET_NAME
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"tradewind-{digest}.sock"


def idle_seconds() -> float:
    """The idle timeout of a worker started now: $TRADEWIND_SAMPLE_WORKER_IDLE_S, else 10 minutes."""
    value = os.environ.get(IDLE_ENV)
    return float(value) if value else DEFAULT_IDLE_S


def read_line(conn: socket.socket, on_timeout: Callable[[], None] | None = None) -> bytes | None:
    """One message (without its newline) from `conn`, or None if the peer closed (or died) first. Each time the
    socket's timeout passes, `on_timeout()` is called (it may raise to give up) and reading goes on.

    Raises:
        TradewindError: the message is longer than `MAX_MESSAGE_BYTES`.
        TimeoutError: the socket's timeout passed and there is no `on_timeout`.
    """
    data = b""
    while b"\n" not in data:
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            if on_timeout is None:
                raise
            on_timeout()
            continue
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise TradewindError(f"a sampling worker message exceeds {MAX_MESSAGE_BYTES} bytes")
    return data.split(b"\n", 1)[0]


def send_line(conn: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise TradewindError(f"a sampling worker message exceeds {MAX_MESSAGE_BYTES} bytes")
    conn.sendall(data)


def connect(path: Path) -> socket.socket | None:
    """A connection to the worker listening at `path`, or None if none does (no socket, or a dead one's)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    return conn


def ask(conn: socket.socket, request: dict[str, Any], on_timeout: Callable[[], None] | None = None) -> bytes | None:
    """Send `request` over `conn` (then closed) and return the reply line; None if the worker died first.

    Reading waits in steps of the socket's timeout, calling `on_timeout` after each (see `read_line`).
    """
    with conn:
        try:
            send_line(conn, request)
        except (BrokenPipeError, ConnectionResetError):  # it died after taking the connection
            return None
        return read_line(conn, on_timeout=on_timeout)


def exchange(path: Path, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    """Send `request` to the worker at `path` and return its reply; None if no worker listens there.

    Raises:
        TradewindError: the worker hung up without answering (it died) or sent something unreadable.
        TimeoutError: no answer within `timeout_s`.
    """
    conn = connect(path)
    if conn is None:
        return None
    conn.settimeout(timeout_s)
    line = ask(conn, request)
    if line is None:
        raise TradewindError(f"the sampling worker at {path} ended before it answered")
    return json.loads(line)
