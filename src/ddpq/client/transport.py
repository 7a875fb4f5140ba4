"""HTTP/1.1 for the client, on sockets (the standard library's ``socket``, ``ssl`` for https).

Not httpx, and not even ``http.client``: importing httpx costs ~100 ms, ``http.client``
~12 ms (it brings the ``email`` package and ``ssl``), and a `ddpq ls` has ~120 ms in all
(bench/cli_latency.py). The client needs little of HTTP: requests with a JSON body or none,
answers with a ``Content-Length`` or chunked, one connection kept alive for the requests of
one command, ``TCP_NODELAY`` (a request and its answer are one segment each way; waiting on
delayed ACKs would cost 40 ms a request), timeouts, and a chunked stream for
`ddpq logs -f`; the same over the daemon's Unix socket (``unix:/path``), where the daemon
knows the caller from the socket. Errors are the CLI's: ``Unreachable`` (exit 3) when the
daemon cannot be reached or does not speak HTTP, ``api_error`` for an answer of 400 or more.
"""

from __future__ import annotations

# ``_socket``, the C module under ``socket``: socket.py adds what this client does not use
# (file objects, enums of every constant built at import, selectors), ~2 ms of every
# command. https, where ``ssl`` needs ``socket.socket``, imports ``socket`` itself.
import _socket
import io
import json
import os
import select
from collections.abc import Iterator, Mapping

from ddpq import __version__
from ddpq.client import urls
from ddpq.client.errors import DdpqError, Unreachable, api_error, protocol_error
from ddpq.client.urls import Params

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

UNIX_SCHEME = "unix:"
# The Host a request on the socket names: one the daemon's guard accepts (a loopback name).
UNIX_HOST = "localhost"
STREAM_CHUNK = 64 * 1024
MAX_LINE = 64 * 1024  # a status or header line (uvicorn's are far shorter)
MAX_HEADERS = 100
# A whole answer read into memory (`ddpq logs` asks for at most 1 MiB at a time; a list of
# 1,000 jobs is far less): past this, what answers is not the daemon.
MAX_BODY = 256 * 1024 * 1024


class ProtocolError(Exception):
    """What answered is not speaking HTTP/1.1 as the daemon does."""


CONNECTION_ERRORS = (OSError, ProtocolError)  # timeouts and TLS errors are OSErrors


class Response:
    """An answer below 400: its status, headers (names in lower case) and whole body."""

    __slots__ = ("body", "headers", "status", "url")

    def __init__(self, url: str, status: int, headers: dict[str, str], body: bytes) -> None:
        self.url, self.status, self.headers, self.body = url, status, headers, body

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            raise protocol_error(self.url, f"not JSON, HTTP {self.status}") from None


class Connection:
    """One connection to the daemon, read through a buffer: TCP (or TLS), or the daemon's
    Unix socket when ``unix`` names it."""

    def __init__(
        self, host: str, port: int, https: bool, timeout: float | None, unix: str | None = None
    ) -> None:
        module: ModuleType = _socket
        if https:
            import socket  # what ssl wraps
            import ssl  # only for https: ~10 ms to import

            module = socket
        sock: _socket.socket
        if unix is None:
            sock = _connect(host, port, timeout, module)
        else:
            sock = _connect_unix(unix, timeout)
        try:
            if unix is None:
                sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            if https:
                assert isinstance(sock, socket.socket)
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        # What socket.makefile("rb") gives, over recv_into (a timeout raises TimeoutError).
        self.reader = io.BufferedReader(_Received(sock))

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def closed_by_peer(self) -> bool:
        """Whether this idle kept-alive connection is readable: the daemon closed it (its
        keep-alive timeout) or sent what no request asked for; either way it cannot carry
        the next request."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def exchange(self, request: bytes) -> tuple[int, str, dict[str, str]]:
        """Send a whole request; read the answer's status line and headers."""
        self.sock.sendall(request)
        while True:
            status, reason, headers = self._head()
            if not 100 <= status < 200:  # skip interim answers (none expected)
                return status, reason, headers

    def _line(self) -> bytes:
        line = self.reader.readline(MAX_LINE + 1)
        if not line:
            raise ProtocolError("the connection closed before an answer")
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise ProtocolError("an answer line that does not end")
        return line.rstrip(b"\r\n")

    def _head(self) -> tuple[int, str, dict[str, str]]:
        version, _, rest = self._line().partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit() or len(code) != 3:
            raise ProtocolError("not an HTTP/1.1 answer")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = self._line()
            if not line:
                if version == b"HTTP/1.0" and "keep-alive" not in headers.get("connection", ""):
                    headers["connection"] = "close"
                return int(code), reason.decode("latin-1"), headers
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError("a malformed header")
            key = name.strip().decode("latin-1").lower()
            value_text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {value_text}" if key in headers else value_text
        raise ProtocolError("too many headers")

    def body(self, headers: Mapping[str, str]) -> Iterator[bytes]:
        """The answer's body as it arrives: chunked, of a length, or up to the close."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            yield from self._chunks()
            return
        length = headers.get("content-length")
        if length is not None:
            # str.isdigit also takes other scripts' digits ("²"), which int() refuses.
            if not (length.isascii() and length.isdigit()):
                raise ProtocolError("a malformed Content-Length")
            left = int(length)
            while left:
                data = self.reader.read1(min(left, STREAM_CHUNK))
                if not data:
                    raise ProtocolError("the connection closed in the middle of an answer")
                left -= len(data)
                yield data
            return
        while data := self.reader.read1(STREAM_CHUNK):
            yield data

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            # Hex digits only: int() would also take a sign, "0x" and "_".
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF") or len(size_text) > 16:
                raise ProtocolError("a malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return
            while size:  # in pieces: a chunk may say any size
                data = self.reader.read1(min(size, STREAM_CHUNK))
                if not data:
                    raise ProtocolError("a chunk cut short")
                size -= len(data)
                yield data
            if self.reader.read(2) != b"\r\n":
                raise ProtocolError("a chunk cut short")


def _whole(pieces: Iterator[bytes]) -> bytes:
    """A body read whole, up to ``MAX_BODY``."""
    body = bytearray()
    for piece in pieces:
        body += piece
        if len(body) > MAX_BODY:
            raise ProtocolError(f"an answer of more than {MAX_BODY >> 20} MiB")
    return bytes(body)


class _Received(io.RawIOBase):
    """A socket's bytes as a raw stream, for ``io.BufferedReader`` to buffer (what
    ``socket.SocketIO`` is to ``socket.makefile``, as this client reads it)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)


def _connect(host: str, port: int, timeout: float | None, module: ModuleType) -> _socket.socket:
    """``socket.create_connection``, but an ASCII name is looked up as bytes: as a str,
    getaddrinfo would import the IDNA codec first (~1 ms on every command)."""
    error: OSError = ConnectionRefusedError(f"no address for {host}")
    address = host.encode() if host.isascii() else host
    for family, kind, proto, _, where in _socket.getaddrinfo(address, port, 0, _socket.SOCK_STREAM):
        sock: _socket.socket = module.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error


def _connect_unix(path: str, timeout: float | None) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def unix_path(url: str) -> str | None:
    """The socket path of a ``unix:/path`` (or ``unix:///path``) URL; None for another URL."""
    if not url.startswith(UNIX_SCHEME):
        return None
    path = url[len(UNIX_SCHEME) :]
    return "/" + path.lstrip("/") if path.startswith("//") else path


class Transport:
    """Requests to one daemon over one kept-alive connection (a stream gets its own).

    ``url`` is http://, https://, or unix:/path for the daemon's Unix socket on this
    machine (where the daemon knows the caller from the socket itself)."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout: float) -> None:
        self.url = url
        self._unix = unix_path(url)
        host: str | None
        if self._unix is not None:
            if not os.path.isabs(self._unix) or "\x00" in self._unix:
                raise DdpqError(
                    f"{url!r}: a socket is named by its absolute path, unix:/run/ddpq/ddpq.sock",
                    exit_code=2,
                )
            scheme, host, port, path = "http", UNIX_HOST, None, ""
        else:
            try:
                scheme, host, port, path = urls.split(url)
            except ValueError:
                scheme, host, port, path = "", None, None, ""
        if scheme not in ("http", "https") or not host:
            raise DdpqError(
                f"{url!r} is not an http://, https:// or unix:/path URL (--url, $DDPQ_URL)",
                exit_code=2,
            )
        self._https = scheme == "https"
        self._host = host
        self._port = port or (443 if self._https else 80)
        self._prefix = path.rstrip("/")  # a daemon behind a proxy, under a path
        name = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = name if port is None else f"{name}:{port}"
        self._headers = {"User-Agent": f"ddpq/{__version__}", **headers}
        self._timeout = timeout
        self._conn: Connection | None = None

    @property
    def socket_path(self) -> str | None:
        """The Unix socket this transport speaks on, or None for TCP."""
        return self._unix

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None
    ) -> Response:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        request = self._request(method, path, params, data)
        try:
            conn = self._connection()
            status, reason, headers = conn.exchange(request)
            content = _whole(conn.body(headers))
        except CONNECTION_ERRORS as exc:
            self.close()
            raise self._unreachable(exc) from None
        if headers.get("connection", "").lower() == "close" or (
            "content-length" not in headers and "transfer-encoding" not in headers
        ):
            self.close()
        if status >= 400:
            raise api_error(status, reason, content)
        return Response(self.url, status, headers, content)

    def stream(self, path: str, params: Params | None = None) -> Iterator[bytes]:
        """The body of a GET as it arrives, for as long as the daemon sends it: on a
        connection of its own, with no read timeout (a quiet job sends nothing)."""
        try:
            conn = self._open()
        except CONNECTION_ERRORS as exc:
            raise self._unreachable(exc) from None
        try:
            try:
                conn.sock.settimeout(None)
                status, reason, headers = conn.exchange(self._request("GET", path, params, b""))
                if status >= 400:
                    raise api_error(status, reason, _whole(conn.body(headers)))
            except CONNECTION_ERRORS as exc:
                raise self._unreachable(exc) from None
            try:
                yield from conn.body(headers)
            except CONNECTION_ERRORS as exc:
                raise Unreachable(
                    f"lost the ddpq daemon at {self.url} ({type(exc).__name__})", exit_code=3
                ) from None
        finally:
            conn.close()

    def _request(self, method: str, path: str, params: Params | None, body: bytes) -> bytes:
        query = f"?{urls.query(params)}" if params else ""
        lines = [f"{method} {self._prefix}{path}{query} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{name}: {value}" for name, value in self._headers.items()]
        if body:
            lines.append("Content-Type: application/json")
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        # One buffer, one send: with TCP_NODELAY a request is one segment when it fits.
        return "\r\n".join([*lines, "", ""]).encode("latin-1") + body

    def _unreachable(self, exc: BaseException) -> Unreachable:
        if isinstance(exc, ProtocolError):
            return Unreachable(
                f"cannot reach the ddpq daemon at {self.url} (ProtocolError: {exc}): what "
                "answers there does not speak HTTP as ddpq does (--url or DDPQ_URL for another)",
                exit_code=3,
            )
        if self._unix is not None:
            hint = (
                "no daemon listens there (a socket left by one that was killed)"
                if isinstance(exc, ConnectionRefusedError)
                else "is `ddpq serve` running?"
            )
            return Unreachable(
                f"cannot reach the ddpq daemon on the socket {self._unix} "
                f"({type(exc).__name__}): {hint} (--url or DDPQ_URL for another)",
                exit_code=3,
            )
        return Unreachable(
            f"cannot reach the ddpq daemon at {self.url} ({type(exc).__name__}); "
            "is `ddpq serve` running? (set --url or DDPQ_URL)",
            exit_code=3,
        )

    def _connection(self) -> Connection:
        if self._conn is not None and self._conn.closed_by_peer():
            self.close()
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> Connection:
        return Connection(self._host, self._port, self._https, self._timeout, self._unix)
