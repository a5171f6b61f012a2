"""Running the HTTP app under uvicorn, with a read deadline per request and a bound on open connections.

uvicorn times out only idle kept-alive connections: a client that opens a connection and sends nothing, half a
request line and headers, or headers that declare a body it never sends, holds its socket (and, once the headers
are in, a task of the server) for as long as it likes. `GuardedH11Protocol` closes such a connection once
`read_timeout_s` has passed, and answers 503 to a connection beyond `max_connections` before reading anything.

Only connections that have shown the bearer token are sure of their place under that bound. One that has not
(`UnprovenConnections`) has `UNPROVEN_READ_TIMEOUT_S` for its request, and gives way to a newer connection when too
many such wait, so that no flood of them, however renewed, keeps out a client that holds the token.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from tradewind.server.security import holds_token

READ_TIMEOUT_S = 10.0
"""Seconds a request may take to arrive: its headers from the first byte (or the connection), its body from the
headers. A client on a working network sends a 1 MiB body (the cap) in well under that."""
UNPROVEN_READ_TIMEOUT_S = 3.0
"""Seconds a connection that has not shown the token has for a request (the read timeout when that is shorter): a
client that holds the token sends its headers at once."""
MAX_CONNECTIONS = 128
"""Connections open at once; one more gets 503. An MCP session holds one or two, a dashboard page one."""

_BUSY_TEXT = b"503 Service Unavailable: too many open connections; try again when some have closed.\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class UnprovenConnections:
    """A server's open connections that have not shown the token, by client address, oldest first.

    A client that holds the token sends it with its first request's headers, so its connection is here for as long
    as those take to arrive; a connection whose requests lack it stays here. At most a quarter of `max_connections`
    may be here from one address, and half from all: a new connection takes the place of the oldest one of its
    own address when that has its quarter, else, when the half or the server is full, of the address with the most
    here. A flood of connections that never show the token then closes its own, oldest first, once it has its
    quarter: it takes no place from a connection that showed the token, nor from other addresses holding less.
    """

    def __init__(self, max_connections: int) -> None:
        self.budget = max(1, max_connections // 2)
        self.per_address = max(1, max_connections // 4)
        self._address_of: dict[GuardedH11Protocol, str] = {}
        self._by_address: dict[str, dict[GuardedH11Protocol, None]] = {}  # oldest first: dicts keep their order

    def add(self, connection: GuardedH11Protocol, address: str) -> None:
        self._address_of[connection] = address
        self._by_address.setdefault(address, {})[connection] = None

    def discard(self, connection: GuardedH11Protocol) -> None:
        address = self._address_of.pop(connection, None)
        if address is not None:
            same_address = self._by_address[address]
            del same_address[connection]
            if not same_address:
                del self._by_address[address]

    def to_give_way(self, address: str, server_full: bool) -> GuardedH11Protocol | None:
        """The connection to close so that a new one from `address` has a place, or None when it has one already."""
        same_address = self._by_address.get(address, {})
        if len(same_address) >= self.per_address:
            return next(iter(same_address))
        if self._address_of and (server_full or len(self._address_of) >= self.budget):
            return next(iter(max(self._by_address.values(), key=len)))
        return None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on reading each request and a bound on connections.

    A request must arrive whole: its headers within `read_timeout_s` of the connection opening (on a kept-alive
    connection, of the previous answer), its body within `read_timeout_s` of its headers; a trickle of bytes does
    not move the deadline. A request late on either counts is dropped with its connection (an app still waiting
    for the body is told the client disconnected). Once a request is read, its answer may take as long as it needs.

    Until a request's headers carry `token` (any request's, when the server has no token), the connection is in
    `unproven`: its deadline is `UNPROVEN_READ_TIMEOUT_S` at most, and a newer connection may take its place.
    """

    def __init__(
        self,
        *args: Any,
        read_timeout_s: float,
        max_connections: int,
        token: bytes | None,
        unproven: UnprovenConnections,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.token = token
        self.unproven = unproven
        self.proven = False
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: object = None  # the request whose body the deadline waits for; None: headers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        client = get_remote_addr(transport)
        address = client[0] if client else ""
        server_full = len(self.connections) >= self.max_connections
        oldest = self.unproven.to_give_way(address, server_full)
        if oldest is not None:
            oldest.give_way()
        elif server_full:  # every open connection has shown the token
            self.transport = transport  # so that connection_lost can close it as it closes any other
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        self.unproven.add(self, address)
        self._watch_reading()

    def give_way(self) -> None:
        """Close this connection, which has not shown the token, to make room for a newer one."""
        self.logger.debug("closing a connection that has not shown the token, to make room for a newer one")
        self.unproven.discard(self)
        self.connections.discard(self)  # counted out now: its transport reports the close on the loop's next turn
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.proven and self.scope is not None and (self.token is None or holds_token(self.scope, self.token)):
            self.proven = True
            self.unproven.discard(self)
        self._watch_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_reading()  # the next request on this connection starts its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.unproven.discard(self)
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
            self._deadline = self.loop.call_later(self._read_timeout(), self._read_timed_out)
            self._deadline_for = awaiting

    def _read_timeout(self) -> float:
        return self.read_timeout_s if self.proven else min(UNPROVEN_READ_TIMEOUT_S, self.read_timeout_s)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.DONE and not self.transport.is_closing():
            self.logger.debug("closing a connection whose request did not arrive within %s s", self._read_timeout())
            self.transport.close()


def run_http(
    app: Any,
    host: str,
    port: int,
    *,
    token: str | None,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    log_level: str = "INFO",
) -> None:
    """Serve `app` on `host:port` until the process is stopped.

    Requests are read by `GuardedH11Protocol` (h11, whatever else is installed: the deadline watches h11's state).
    `token` is the bearer token `app` asks for (None: `--no-auth`); a connection that has not shown it may give way
    to newer ones (`UnprovenConnections`).
    uvicorn logs its start-up and errors at `log_level`; the access line per request only at DEBUG (it is a
    measurable share of a quick call, see the MCP section of docs/reports/benchmarks.md). The event loop is
    uvloop where it is installed (orbax-checkpoint depends on it), else asyncio's own. No WebSocket: no route
    takes one.
    """
    import anyio
    import uvicorn

    level = log_level.lower()
    protocol = functools.partial(
        GuardedH11Protocol,
        read_timeout_s=read_timeout_s,
        max_connections=max_connections,
        token=token.encode() if token is not None else None,
        unproven=UnprovenConnections(max_connections),
    )
    config = uvicorn.Config(
        app, host=host, port=port, log_level=level, access_log=level == "debug", http=protocol, ws="none"
    )
    backend_options = {"use_uvloop": True} if importlib.util.find_spec("uvloop") else {}
    anyio.run(uvicorn.Server(config).serve, backend_options=backend_options)
