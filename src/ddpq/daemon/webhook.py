"""One POST of a JSON message to a URL a user gave: bounded, and never to this host itself.

The URL is the user's, and the daemon may be root: what it connects to is checked after
the name is resolved, and the connection goes to the very address checked (a name that
resolves elsewhere a moment later changes nothing). Loopback (the daemon's own API, other
services of this host), link-local (cloud metadata at 169.254.169.254), multicast and
unspecified addresses are refused unless the admin allows loopback (tests, a relay on
this host). Private networks are allowed: a lab's Mattermost lives there.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ddpq import __version__

MAX_ANSWER = 64 * 1024  # of the receiver's body, read and dropped


def refused_address(ip: str, allow_loopback: bool) -> str | None:
    """Why a notification may not go to ``ip``, or None if it may."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback and not allow_loopback:
        return "it is this host's own address (loopback)"
    if addr.is_link_local or addr.is_multicast or addr.is_unspecified:
        return "it is a link-local, multicast or unspecified address"
    return None


def post(url: str, body: bytes, *, timeout: float, allow_loopback: bool) -> tuple[int | None, str]:
    """POST ``body`` (JSON) to ``url``: the HTTP status, or None and why there was none."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return None, f"cannot resolve {host}: {exc.strerror or exc}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    reasons = []
    for family, kind, proto, _, address in infos:
        why = refused_address(str(address[0]), allow_loopback)
        if why is not None:
            reasons.append(why)
            continue
        target = _Target(family, kind, proto, address, host, port, path, secure)
        try:
            return _send(target, body, timeout), ""
        except (OSError, http.client.HTTPException) as exc:
            return None, _describe(exc)
    return None, f"refused: {host} leads nowhere a notification may go ({'; '.join(reasons)})"


@dataclass(frozen=True)
class _Target:
    family: int
    kind: int
    proto: int
    address: Any  # the resolved socket address, checked
    host: str  # the URL's name: the Host header and the TLS server name
    port: int
    path: str
    secure: bool


def _send(target: _Target, body: bytes, timeout: float) -> int:
    sock = socket.socket(target.family, target.kind, target.proto)
    sock.settimeout(timeout)
    try:
        sock.connect(target.address)
        if target.secure:
            tls = ssl.create_default_context()
            sock = tls.wrap_socket(sock, server_hostname=target.host)
    except BaseException:
        sock.close()
        raise
    conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    conn.sock = sock  # connected to the address checked above, not to a fresh lookup
    try:
        headers = {"Content-Type": "application/json", "User-Agent": f"ddpq/{__version__}"}
        conn.request("POST", target.path, body, headers)
        answer = conn.getresponse()
        answer.read(MAX_ANSWER)
        return answer.status
    finally:
        conn.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return f"bad answer: {type(exc).__name__}"
