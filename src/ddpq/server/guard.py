"""Refuse requests a web page on another site could make a browser send (CSRF, DNS rebinding).

Without ``--auth`` the API believes the user name a client sends, which is fine for
programs on the machine, but every browser on it is such a program too: any page it
shows may send requests to ``127.0.0.1``. Three checks, on every request:

- ``Host`` must name this daemon. A DNS-rebinding page reaches the daemon under the
  attacker's own name (``Host: evil.example:8765``), so only names the attacker cannot
  point elsewhere are accepted: ``localhost`` and the other loopback names in
  ``LOOPBACK_NAMES``, any loopback address, the address the connection arrived on, the
  ``--host`` the daemon listens on, the machine's own host name, and the names an operator
  lists in ``$DDPQ_ALLOWED_HOSTS`` (comma-separated; for a proxy or tunnel of another
  name). The port is not compared: names are what rebinding abuses.
- ``Origin``, when a browser sends one, must be the same origin as ``Host``; a page of
  another origin (or ``Origin: null``, a sandboxed or local file) gets 403.
- A write (POST, PUT, PATCH, DELETE) must carry JSON: a body needs
  ``Content-Type: application/json``, and a write without a body may have no content type
  or JSON. A browser sends an HTML form's POST (``application/x-www-form-urlencoded``,
  ``multipart/form-data``, ``text/plain``) without asking the server first; those get 415.
  The ``ddpq`` CLI's POSTs without a body carry no content type and pass.

On the Unix socket the same checks apply but ``Host``'s (any name will do there, as in
``curl --unix-socket S http://ddpq/v1/jobs``: no browser reaches a socket by a name), and a
request that carries what only a browser sends (``Origin``, ``Sec-Fetch-*``) is refused: a
browser cannot connect to a socket, but a local proxy could carry its requests there, as the
proxy's account. Such a request has no
TCP peer and no server address in its scope; nothing here needs one (``_host_ok`` falls
back to names).

And one bound: a request body is at most ``MAX_BODY_BYTES`` (413 beyond), counted as it
arrives, so a chunked body without a length is bounded too. The schemas' own bounds
apply only after the whole body has been read and parsed; this one comes first.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddpq.server.peer import peer_of

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Sent by browsers (Fetch Metadata, CORS) and by no program of ddpq's.
BROWSER_HEADERS = ("origin", "sec-fetch-site", "sec-fetch-mode", "sec-fetch-dest")
DEFAULT_PORT = {"http": 80, "https": 443}
# Far above the largest valid submission (a 256 KiB environment, a 64 KiB command, a
# sweep's parameters), far below what would hurt the daemon to hold and parse.
MAX_BODY_BYTES = 8 * 1024 * 1024


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` (or an origin's netloc) as (lower-case name without brackets, port); None if
    it is not one."""
    try:
        parts = urlsplit("//" + value)
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return name.lower().rstrip("."), port


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def allowed_names(listen_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names (not addresses) a request's ``Host`` may carry."""
    names = set(LOOPBACK_NAMES)
    hostname = socket.gethostname().lower()
    names.update({hostname, hostname.split(".")[0], listen_host.strip("[]").lower()})
    names.update(x.strip().lower().rstrip(".") for x in extra if x.strip())
    return frozenset(names)


def extra_names_from_env() -> list[str]:
    return os.environ.get("DDPQ_ALLOWED_HOSTS", "").split(",")


class RequestGuard:
    """ASGI middleware: the checks above, answered with the API's ``{detail, code}`` body."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is not None:
            status, code, detail = refusal
            await _answer(send, status, code, detail)
            return
        if any(k.lower() == b"transfer-encoding" for k, _ in scope["headers"]):
            # No length to judge by: read it here, bounded, and hand the app the whole.
            body = await _read_bounded(receive)
            if body is None:
                await _answer(send, 413, "too_large", _too_large())
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> tuple[int, str, str] | None:
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            # Latin-1, as HTTP defines header bytes; a repeated header keeps its first value
            # here, and a repeated Host is refused below.
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        on_socket = peer_of(scope) is not None
        if on_socket:
            # The Unix socket: no browser connects to one, but a local proxy or tunnel
            # (socat, ssh -L) can carry a page's request there, which would then act as
            # whoever runs the proxy. What only browsers send is refused outright.
            sent = [name for name in BROWSER_HEADERS if name in headers]
            if sent:
                return (
                    403,
                    "browser",
                    f"the Unix socket serves programs on this machine, not browsers "
                    f"({sent[0]} sent); the web page is on the TCP port",
                )
        hosts = [v for k, v in scope["headers"] if k.lower() == b"host"]
        if len(hosts) > 1:
            return 400, "bad_host", "more than one Host header"
        host = headers.get("host")
        # HTTP/1.0 may omit Host; no browser does, and h11 refuses HTTP/1.1 without one.
        # On the Unix socket any name will do (`curl --unix-socket S http://ddpq/v1/jobs`):
        # the names guard against DNS rebinding, and no browser reaches a socket by a name
        # (what a proxy carries there from one is refused above, by its browser headers).
        if host is not None and not on_socket:
            parsed = split_host(host)
            if parsed is None or not self._host_ok(parsed[0], scope):
                return (
                    403,
                    "bad_host",
                    f"Host {host!r} does not name this ddpq daemon; use localhost or its "
                    "address, or list the name in $DDPQ_ALLOWED_HOSTS on the daemon",
                )
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host):
            return 403, "cross_origin", f"cross-origin request from {origin!r} refused"
        length = headers.get("content-length", "").strip()
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return 413, "too_large", _too_large()
        if scope["method"] in WRITES:
            return _content_type_problem(headers)
        return None

    def _host_ok(self, name: str, scope: Scope) -> bool:
        address = _ip(name)
        if address is None:
            return name in self.names
        if address.is_loopback:
            return True
        # An address cannot be rebound: the one this connection reached is this daemon.
        server = scope.get("server")
        local = _ip(str(server[0])) if server else None
        return (local is not None and local == address) or name in self.names


def _same_origin(origin: str, host: str | None) -> bool:
    if host is None:
        return False
    try:
        parts = urlsplit(origin)
        scheme = parts.scheme
    except ValueError:
        return False
    if scheme not in DEFAULT_PORT or parts.path or parts.query:
        return False
    theirs = split_host(parts.netloc)
    ours = split_host(host)
    if theirs is None or ours is None:
        return False
    default = DEFAULT_PORT[scheme]
    return (theirs[0], theirs[1] or default) == (ours[0], ours[1] or default)


def _content_type_problem(headers: dict[str, str]) -> tuple[int, str, str] | None:
    content_type = headers.get("content-type")
    length = headers.get("content-length", "0").strip()
    has_body = "transfer-encoding" in headers or length not in ("", "0")
    if content_type is None:
        if not has_body:
            return None
        return (
            415,
            "unsupported_media_type",
            "send the body as JSON (Content-Type: application/json)",
        )
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json":
        return None
    return (
        415,
        "unsupported_media_type",
        f"writes take JSON (Content-Type: application/json), not {media or 'an empty type'!r}",
    )


async def _read_bounded(receive: Receive) -> bytes | None:
    """The whole body, or None once it passes ``MAX_BODY_BYTES`` (the rest unread)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away: the app will see an empty body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # what follows the body: a disconnect
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _too_large() -> str:
    return f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB"


async def _answer(send: Send, status: int, code: str, detail: str) -> None:
    body = json.dumps({"detail": detail, "code": code}, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
