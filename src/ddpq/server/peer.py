"""Who is at the other end of a Unix socket connection, as the kernel says (SO_PEERCRED).

uvicorn puts no transport in an ASGI scope, so the protocol (``server.protocol``) reads the
credentials when a connection on the Unix socket is made and wraps the app for that
connection with ``with_peer``: each of its requests then carries them in
``scope["extensions"][PEER_KEY]``. Nothing a client sends can put them there, and a TCP
connection never has them: ``peer_of`` is None for it.

The credentials are those of the process that called ``connect()``, fixed at that moment:
a connection handed to another process, or kept across a ``setuid``, still speaks for
whoever opened it (as for Docker's and systemd's sockets).

A connection on the Unix socket whose credentials cannot be read is no TCP connection for
that: it carries an ``UnknownPeer`` (why), which ``server.deps`` refuses, 503 when the
daemon ran out of a resource (``server.exhaustion``), else 403.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ddpq.server.exhaustion import cause_of

PEER_KEY = "ddpq.peer_credentials"
_UCRED = struct.Struct("iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid
_NO_ID = 0xFFFFFFFF  # (uid_t)-1: no such id


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class UnknownPeer:
    """A connection on the Unix socket whose caller the kernel did not name."""

    why: str
    exhausted: bool  # because the daemon ran out of a resource: try again later


Peer = PeerCredentials | UnknownPeer


def read_peer_credentials(sock: Any) -> Peer | None:
    """The credentials of a connected AF_UNIX socket (or asyncio's TransportSocket of one);
    None for any other kind of socket; ``UnknownPeer`` where the kernel does not say."""
    if getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError) as exc:
        cause = cause_of(exc)
        return UnknownPeer(cause or f"its credentials cannot be read: {exc}", cause is not None)
    pid, uid, gid = _UCRED.unpack(raw)
    if _NO_ID in (uid, gid):
        return UnknownPeer("the kernel names no user for it", exhausted=False)
    return PeerCredentials(pid, uid, gid)


def with_peer(app: ASGIApp, peer: Peer) -> ASGIApp:
    """``app`` for one connection: each request's scope carries ``peer``."""

    async def connection_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "extensions": {**(scope.get("extensions") or {}), PEER_KEY: peer}}
        await app(scope, receive, send)

    return connection_app


def peer_of(scope: Scope) -> Peer | None:
    """The request's peer credentials (or why there are none): set only for a connection
    on the Unix socket."""
    extensions = scope.get("extensions") or {}
    peer = extensions.get(PEER_KEY)
    return peer if isinstance(peer, PeerCredentials | UnknownPeer) else None
