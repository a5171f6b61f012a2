"""Running the HTTP app under uvicorn, with a read deadline per request and a bound on open connections.

uvicorn times out only idle kept-alive connections: a client that opens a connection and sends nothing, half a
request line and headers, or headers that declare a body it never sends, holds its socket (and, once the headers
are in, a task of the server) for as long as it likes. `GuardedH11Protocol` closes such a connection once
`read_timeout_s` has passed, and answers 503 to a connection beyond `max_connections` before reading anything.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_S = 10.0
"""Seconds a request may take to arrive: its headers from the first byte (or the connection), its body from the
headers. A client on a working network sends a 1 MiB body (the cap) in well under that."""
MAX_CONNECTIONS = 128
"""Connections open at once; one more gets 503. An MCP session holds one or two, a dashboard page one."""

_BUSY_TEXT = b"503 Service Unavailable: too many open connections; try again when some have closed.\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on reading each request and a bound on connections.

    A request must arrive whole: its headers within `read_timeout_s` of the connection opening (on a kept-alive
    connection, of the previous answer), its body within `read_timeout_s` of its headers; a trickle of bytes does
    not move the deadline. A request late on either counts is dropped with its connection (an app still waiting
    for the body is told the client disconnected). Once a request is read, its answer may take as long as it needs.
    """

    def __init__(self, *args: Any, read_timeout_s: float, max_connections: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: object = None  # the request whose body the deadline waits for; None: headers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self.transport = transport  # so that connection_lost can close it as it closes any other
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        self._watch_reading()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_reading()  # the next request on this connection starts its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _watch_reading(self) -> None:
        """Arm the deadline for the part of a request now awaited, keep it while that part is still awaited,
        and drop it once the request is read."""
        if self.conn.their_state is h11.DONE or self.transport.is_closing():
            self._cancel_deadline()
            return
        awaiting = self.cycle if self.conn.their_state is h11.SEND_BODY else None
        if self._deadline is None or awaiting is not self._deadline_for:
            self._cancel_deadline()
            self._deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)
            self._deadline_for = awaiting

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.DONE and not self.transport.is_closing():
            self.logger.debug("closing a connection whose request did not arrive within %s s", self.read_timeout_s)
            self.transport.close()


def run_http(
    app: Any,
    host: str,
    port: int,
    *,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    log_level: str = "INFO",
) -> None:
    """Serve `app` on `host:port` until the process is stopped.

    Requests are read by `GuardedH11Protocol` (h11, whatever else is installed: the deadline watches h11's state).
    uvicorn logs its start-up and errors at `log_level`; the access line per request only at DEBUG (it is a
    measurable share of a quick call, see the MCP section of docs/reports/benchmarks.md). The event loop is
    uvloop where it is installed (orbax-checkpoint depends on it), else asyncio's own. No WebSocket: no route
    takes one.
    """
    import anyio
    import uvicorn

    level = log_level.lower()
    protocol = functools.partial(GuardedH11Protocol, read_timeout_s=read_timeout_s, max_connections=max_connections)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=level, access_log=level == "debug", http=protocol, ws="none"
    )
    backend_options = {"use_uvloop": True} if importlib.util.find_spec("uvloop") else {}
    anyio.run(uvicorn.Server(config).serve, backend_options=backend_options)
