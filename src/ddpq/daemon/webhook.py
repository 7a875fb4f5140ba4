"""One POST of a JSON message to a URL a user gave: bounded in time as a whole, and never
to this host itself.

The URL is the user's, and the daemon may be root: its name is resolved once and each
address checked (``ddpq.notify_target``: this host's own addresses, cloud metadata, and
any address that is no single host's are refused; loopback only where the admin allows
it), and the connection goes to an address checked there. The Host header and TLS's
server name are still the URL's.

One attempt has one deadline (``timeout``) for all of it: the lookup, connecting, TLS,
sending and reading the answer's status line. Each step gets what is left of it, so a
receiver that drips a byte now and then cannot stretch an attempt.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from urllib.parse import SplitResult, quote, urlsplit

from ddpq import __version__
from ddpq.notify_target import Destination, Refused, url_destinations

MAX_HEAD = 16 * 1024  # of the receiver's answer, read until its status line is there
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: [^\r\n]*)?\r?\n")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
# A path's characters sent as they are: printable ASCII (check_url allows nothing below);
# anything beyond ASCII is percent-encoded as UTF-8.
_PATH_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))


class BadAnswer(Exception):
    """The receiver answered something that is not HTTP."""


class _NotConnected(Exception):
    """Connecting to one address failed: the next may be tried."""


def post(url: str, body: bytes, *, timeout: float, allow_loopback: bool) -> tuple[int | None, str]:
    """POST ``body`` (JSON) to ``url``: the HTTP status, or None and why there was none."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    host = parts.hostname or ""
    secure = parts.scheme == "https"
    try:
        targets = url_destinations(url, allow_loopback=allow_loopback, timeout=timeout)
        request = _request(parts, body)
    except Refused as exc:
        return None, str(exc)
    except UnicodeError:
        return None, f"cannot name {host} in a request"
    why = "no address to connect to"
    for target in targets:
        try:
            return _send(target, host, secure, request, deadline), ""
        except _NotConnected as exc:  # the next address, if there is one
            why = _describe(exc.__cause__ or exc)
        except (OSError, BadAnswer) as exc:
            return None, _describe(exc)
    return None, why


def _request(parts: SplitResult, body: bytes) -> bytes:
    host = parts.hostname or ""
    name = f"[{host}]" if ":" in host else host.encode("idna").decode("ascii")
    if parts.port is not None:
        name += f":{parts.port}"
    target = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_PATH_SAFE)
    head = (
        f"POST {target} HTTP/1.1\r\n"
        f"Host: {name}\r\n"
        f"User-Agent: ddpq/{__version__}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the attempt's time is up")
    return left


def _send(target: Destination, host: str, secure: bool, request: bytes, deadline: float) -> int:
    sock = socket.socket(target.family, target.kind, target.proto)
    try:
        sock.settimeout(_left(deadline))
        try:
            sock.connect(target.address)  # the address checked, not a fresh lookup
        except OSError as exc:
            raise _NotConnected from exc
        if secure:
            sock.settimeout(_left(deadline))  # for the whole handshake (ssl's own deadline)
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        view = memoryview(request)
        while view:
            sock.settimeout(_left(deadline))
            view = view[sock.send(view) :]
        return _status(sock, deadline)
    finally:
        sock.close()


def _status(sock: socket.socket, deadline: float) -> int:
    """The status of the receiver's final answer (a 1xx one is skipped), read within the
    deadline; the rest of the answer is not read."""
    got = b""
    while True:
        found = _STATUS_LINE.match(got)
        if found is not None:
            status = int(found.group(1))
            if status >= 200:
                return status
            end = _HEAD_END.search(got)
            if end is not None:  # an interim answer, whole: the final one follows
                got = got[end.end() :]
                continue
        elif b"\n" in got or (len(got) >= 13 and not got.startswith(b"HTTP/1.")):
            raise BadAnswer("not an HTTP answer")
        if len(got) > MAX_HEAD:
            raise BadAnswer("an answer's head is too long")
        sock.settimeout(_left(deadline))
        chunk = sock.recv(4096)
        if not chunk:
            raise BadAnswer("the connection closed before an answer")
        got += chunk


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    if isinstance(exc, BadAnswer):
        return f"bad answer: {exc}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return f"bad answer: {type(exc).__name__}"
