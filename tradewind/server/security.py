"""HTTP transport security: the bearer token, the Host and Origin allowlists, the bind check, the body cap.

The model, for `tradewind serve --transport http`; one middleware, `HttpGate`, wraps the whole app and applies
it to every request whatever its route (`/mcp`, the dashboard, any route added later):

- Every HTTP request must carry `Authorization: Bearer <token>`; anything else gets 401 and reaches no tool.
  The token is `$TRADEWIND_TOKEN` when set, else the one in `<workspace>/.tradewind-token`, a file the server
  creates with mode 0600 on its first start and reuses after; its path (never the token) goes to stderr.
- Host and Origin are always checked, whatever address is bound: Host must name the bound address or a
  loopback name with the bound port (plus `--allow-host`); a request with an Origin must come from a
  loopback origin on that port (plus `--allow-origin`).
- `--no-auth` is accepted only on a loopback address; a non-loopback bind without auth is refused.
- Request bodies over `MAX_REQUEST_BODY_BYTES` get 413.

The stdio transport has none of this: whoever starts the process owns it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from tradewind.core import InvalidInputError, NotFoundError

TOKEN_ENV = "TRADEWIND_TOKEN"
TOKEN_FILE_NAME = ".tradewind-token"
MAX_REQUEST_BODY_BYTES = 1024 * 1024
"""The largest request body the HTTP transport accepts (1 MiB); a larger one gets 413."""

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_bind(host: str, *, auth: bool) -> None:
    """Refuse to serve HTTP without auth on an address other machines can reach."""
    if not auth and not is_loopback(host):
        raise InvalidInputError(
            f"--no-auth is allowed only on a loopback address (127.0.0.1, ::1, localhost), not --host {host}: "
            "anyone who can reach the port could start training or run a pipeline. "
            f"Drop --no-auth and send the bearer token (${TOKEN_ENV} or <workspace>/{TOKEN_FILE_NAME})."
        )


def load_or_create_token(workspace_root: Path, read_only: bool = False) -> tuple[str, str]:
    """The bearer token and where it came from: `$TRADEWIND_TOKEN`, else the workspace's token file.

    The file is created with mode 0600 (exclusively, so a concurrent start reads the same token) and reused.
    A read-only server neither creates it nor changes its mode.

    Raises:
        NotFoundError: `read_only`, no `$TRADEWIND_TOKEN` and no token file.
        InvalidInputError: the file is empty, or (`read_only`) readable by others.
    """
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env, f"${TOKEN_ENV}"
    path = workspace_root / TOKEN_FILE_NAME
    if read_only:
        if not (path.exists() or path.is_symlink()):
            raise NotFoundError(
                f"no token for a read-only server: {path} is not there and a read-only server makes nothing; set "
                f"${TOKEN_ENV}, or start the server once without --read-only to make the file"
            )
        return _read_token_file(path, read_only=True), str(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return _read_token_file(path), str(path)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    return token, str(path)


def _read_token_file(path: Path, read_only: bool = False) -> str:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, encoding="ascii") as handle:
        if stat.S_IMODE(os.fstat(handle.fileno()).st_mode) & 0o077:  # readable by others: take it back
            if read_only:
                raise InvalidInputError(f"token file {path} is readable by others; `chmod 600` it, then start again")
            os.fchmod(handle.fileno(), 0o600)
        token = handle.read().strip()
    if not token:
        raise InvalidInputError(f"token file {path} is empty; delete it to make a new one or set ${TOKEN_ENV}")
    return token


def _with_port(host: str, port: int) -> str:
    host = host.strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # a bare IPv6 address
    return f"{host}:{port}"


def transport_security(
    host: str, port: int, allow_origins: tuple[str, ...] = (), allow_hosts: tuple[str, ...] = ()
) -> TransportSecuritySettings:
    """The Host and Origin allowlists, as the SDK's settings: `HttpGate` enforces them on every route, and the SDK
    once more on `/mcp`."""
    hosts = [_with_port(host, port), *(f"{name}:{port}" for name in _LOOPBACK_NAMES)]
    if port == 80:  # clients leave the default port out of Host
        hosts += [host.strip(), *_LOOPBACK_NAMES]
    for extra in allow_hosts:
        hosts.append(extra if _has_port(extra) else _with_port(extra, port))
    origins = [f"http://{name}:{port}" for name in _LOOPBACK_NAMES]
    origins += [normalize_origin(origin) for origin in allow_origins]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(hosts)),
        allowed_origins=list(dict.fromkeys(origins)),
    )


def _has_port(host: str) -> bool:
    if host.startswith("["):
        return "]:" in host
    return host.count(":") == 1


def normalize_origin(url: str) -> str:
    """`url` as browsers send it in Origin (`scheme://host[:port]`); rejects anything with a path or query."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise InvalidInputError(
            f"--allow-origin {url!r} is not an origin; write scheme://host[:port], e.g. http://localhost:3000"
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidInputError(f"--allow-origin {url!r} is not an origin; drop the query, fragment or user")
    return f"{parts.scheme}://{parts.netloc.lower()}"


class HttpGate:
    """ASGI middleware in front of the whole app: every HTTP request, whatever its route, passes three checks.

    In order: Host must be one `security` allows (else 421), Origin, when sent, one it allows (else 403: a web
    page of another site, DNS rebinding included, can send neither), and with a `token`, `Authorization: Bearer
    <token>` (else 401). A refused request reaches no route, so a route added later needs nothing to be covered.

    A GET of a dashboard page (`/dashboard...`) may carry the token as `?token=` instead: a browser opening a
    link cannot send the header. The page then sends it as the header when it polls. `token=None` (`--no-auth`,
    loopback only) drops the token check, never the Host and Origin checks.
    """

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings, token: str | None) -> None:
        self.app = app
        self._hosts = frozenset(host.lower().encode("latin-1") for host in security.allowed_hosts)
        self._origins = frozenset(origin.lower().encode("latin-1") for origin in security.allowed_origins)
        self._token = token.encode() if token is not None else None

    def _refusal(self, scope: Scope) -> PlainTextResponse | None:
        """Why the request may not pass, as the response that says so; None when it may."""
        headers = dict(scope.get("headers", ()))
        if headers.get(b"host", b"").lower() not in self._hosts:
            return PlainTextResponse(
                "421 Misdirected Request: this Host header is not the address the server was started on; "
                "start it with --allow-host NAME[:PORT] to accept another name\n",
                status_code=421,
            )
        origin = headers.get(b"origin")
        if origin is not None and origin.lower() not in self._origins:
            return PlainTextResponse(
                "403 Forbidden: requests from this Origin are refused; start the server with --allow-origin URL "
                "to accept a web page's requests\n",
                status_code=403,
            )
        if self._token is not None and not holds_token(scope, self._token):
            return PlainTextResponse(
                "401 Unauthorized: send 'Authorization: Bearer <token>' "
                f"(${TOKEN_ENV}, or the token file the server named at start-up)\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="tradewind"'},
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await refusal(scope, receive, send)


def holds_token(scope: Scope, token: bytes) -> bool:
    """Whether the HTTP request `scope` carries `token`: as `Authorization: Bearer <token>`, or as `?token=` on a
    dashboard GET. `HttpGate` lets a request through on it; `GuardedH11Protocol` trusts a connection for it."""
    # Scheme names are case-insensitive; the token is compared in constant time.
    scheme, _, rest = dict(scope.get("headers", ())).get(b"authorization", b"").partition(b" ")
    if scheme.lower() == b"bearer" and hmac.compare_digest(rest.strip(), token):
        return True
    return _dashboard_get(scope) and hmac.compare_digest(_query_token(scope), token)


def _dashboard_get(scope: Scope) -> bool:
    path = scope.get("path", "")
    return scope.get("method") == "GET" and (path == "/dashboard" or path.startswith("/dashboard/"))


def _query_token(scope: Scope) -> bytes:
    """The `token` query parameter of a request, or b"" without one."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])
    return values[0].encode()
