"""Messages between this machine's processes over Unix sockets: one JSON object a packet, file descriptors beside it.

The warm process (`warm.py`) and the fork server (`forkserver.py`) listen at addresses in Linux's abstract
namespace: no file to leave behind, and none to clean up after a process that was killed. Such an address has no
file permissions either, and anyone on the machine may connect: `accept` hangs up on another user's process,
since each request runs code as this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from typing import Any

MAX_MESSAGE = 16 * 2**20  # a job's call carries its config: kilobytes


def abstract_address(kind: str, name: str) -> str:
    """The abstract socket address of the `kind` process serving `name` (a folder, an environment's key)."""
    return f"\0tradewind-{kind}-" + hashlib.sha256(name.encode()).hexdigest()[:24]


def listen(address: str, backlog: int = 8) -> socket.socket | None:
    """A socket listening at `address`, or None when another process listens there already."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return None
    listener.listen(backlog)
    return listener


def accept(listener: socket.socket) -> socket.socket | None:
    """The next connection to `listener`, or None when it came from another user's process (it is closed)."""
    conn, _ = listener.accept()
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    if uid != os.getuid():
        conn.close()
        return None
    return conn


def connect(address: str) -> socket.socket | None:
    """A connection to the process listening at `address`, or None when none listens."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address)
    except (ConnectionRefusedError, FileNotFoundError):
        conn.close()
        return None
    return conn


def send(conn: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(conn, [json.dumps(message).encode()], list(fds))


def receive(conn: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the file descriptors sent with it; (None, []) when the other end has closed."""
    data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
    return (json.loads(data) if data else None), fds
