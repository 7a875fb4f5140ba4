"""uvicorn's HTTP/1.1 protocol with the two bounds it lacks (header time and connections),
and, on the Unix socket, the caller's credentials in each request's scope (``server.peer``).

uvicorn waits for a request's headers for ever, so a client that opens connections and
never finishes a request line (slowloris) holds them as long as it likes, until the
daemon runs out of file descriptors and cannot accept the next ``/healthz``. Here:

- a request's headers must be complete ``HEADER_TIMEOUT_S`` after the connection opened,
  or after the previous response on it ended; trickling bytes does not extend that. A
  connection that misses it is closed.
- a request's body must be complete ``BODY_TIMEOUT_S`` after its headers: a client that
  announces a body and trickles it (or never sends it) holds no connection for longer.
- at most ``max_connections`` connections are open (fewer if the descriptor limit is
  low, which the daemon raised to its hard limit at its start). When one more arrives,
  the one that has waited longest for its headers is closed to make room; if every
  connection is busy with a request, the newcomer gets 503 and is closed.
- on the Unix socket of a daemon with --auth, at most ``max_per_account`` of them are one
  account's (root's are not counted): past that, that account's connection that has
  waited longest for its headers is closed, else the newcomer gets 503. One user holding
  connections open (a followed log never ends while its job is held) cannot take the
  others' places.

``$DDPQ_HEADER_TIMEOUT``, ``$DDPQ_BODY_TIMEOUT`` (seconds), ``$DDPQ_MAX_CONNECTIONS`` and
``$DDPQ_MAX_CONNECTIONS_PER_ACCOUNT`` override the defaults (tests shorten them).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ddpq.config import ConfigError
from ddpq.server.peer import PeerCredentials, read_peer_credentials, with_peer

log = logging.getLogger("ddpq.server")

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1000
MAX_PER_ACCOUNT = 64
# Descriptors kept for everything else the daemon opens: the database, the worker's
# pidfds and job files, the wake socket.
RESERVED_FDS = 256
KEEP_ALIVE_S = 5
# How long a refused connection stays open for its client's request (read, unused) before
# it is closed: its 503 is read whatever the client does first.
REFUSED_LINGER_S = 2.0

_BUSY_BODY = b'{"detail":"too many connections to ddpq; try again later","code":"too_busy"}'
_MINE_BODY = (
    b'{"detail":"too many connections to ddpq from your account; close some or try again '
    b'later","code":"too_busy"}'
)


def _unavailable(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


_BUSY, _BUSY_MINE = _unavailable(_BUSY_BODY), _unavailable(_MINE_BODY)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with a header deadline and a bound on open connections."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    max_connections = MAX_CONNECTIONS
    max_per_account = MAX_PER_ACCOUNT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._timing_body = False  # the timer running is the body's
        # loop time since which this connection waits for a request's headers, or None
        self.waiting_since: float | None = None
        self.account: int | None = None  # the caller's uid on the Unix socket (not root)
        self._refused: asyncio.TimerHandle | None = None  # a refused one's last moment

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection on the Unix socket: its requests carry the caller's uid (server.peer).
        peer = read_peer_credentials(transport.get_extra_info("socket"))
        if peer is not None:
            self.app = with_peer(self.app, peer)
            if isinstance(peer, PeerCredentials) and peer.uid != 0:
                self.account = peer.uid
        if self.account is not None and not self._within_account():
            self._refuse(_BUSY_MINE)
            return
        if len(self.connections) > self.max_connections and not self._make_room():
            self._refuse(_BUSY)
            return
        self._sync_timer()

    def _within_account(self) -> bool:
        """Whether this account's connections, this one with them, are within its bound,
        once its longest waiting for headers is closed if need be."""
        mine = [c for c in self.connections if getattr(c, "account", None) == self.account]
        return len(mine) <= self.max_per_account or self._make_room(mine)

    def _refuse(self, answer: bytes) -> None:
        """Answer 503 and end the connection, once the client has written its request (or
        within REFUSED_LINGER_S): closed at once, a client still writing its request met a
        broken pipe and never read why (`ddpq` said "cannot reach the daemon")."""
        self.connections.discard(self)
        self.transport.write(answer)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # the answer is whole: the client reads it to its end
        self._refused = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def shutdown(self) -> None:
        # A followed log (`ddpq logs -f`, the page's; its route marks it) lasts as long as
        # its job, and uvicorn waits for every response before it stops, so a restart
        # would wait for the job. It is cut instead; the client takes it up again from its
        # byte once the daemon is back (client.reconnect). Any other response finishes.
        cycle = self.cycle
        follows = cycle is not None and (cycle.scope.get("state") or {}).get("follows_a_job")
        if follows and cycle.response_started and not cycle.response_complete:
            self.transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._refused is not None:
            self._refused.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:  # the request of a refused connection: read, unused
            self.transport.close()
            return
        super().data_received(data)
        self._sync_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_timer()

    def _sync_timer(self) -> None:
        """Run the header clock exactly while the connection waits for a request's headers,
        and the body's while it waits for the rest of a body.

        h11's view of the client is IDLE from the connection's start, and again once a
        response is complete and the next cycle began, until a whole request head arrived;
        SEND_BODY from then until the body announced has all arrived.
        """
        state = self.conn.their_state
        closing = self.transport.is_closing()
        if state is h11.IDLE and not closing:
            if self._header_timer is None:
                self.waiting_since = self.loop.time()
                self._start_timer(self.header_timeout_s, body=False)
        elif state is h11.SEND_BODY and not closing:
            if not self._timing_body:
                self._stop_timer()
                self._start_timer(self.body_timeout_s, body=True)
        else:
            self._stop_timer()

    def _start_timer(self, seconds: float, *, body: bool) -> None:
        self._timing_body = body
        self._header_timer = self.loop.call_later(seconds, self._too_slow)

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = None
        self._timing_body = False
        self.waiting_since = None

    def _too_slow(self) -> None:
        self._stop_timer()  # the timer that fired: cancelling it is harmless
        waiting = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def _make_room(self, among: Iterable[Any] | None = None) -> bool:
        """Close the connection (of ``among``, else of all) that has waited longest for its
        headers; False if none is."""
        oldest: GuardedH11Protocol | None = None
        for other in self.connections if among is None else among:
            if (
                other is not self
                and isinstance(other, GuardedH11Protocol)
                and other.waiting_since is not None
                and not other.transport.is_closing()
                and (oldest is None or other.waiting_since < (oldest.waiting_since or 0.0))
            ):
                oldest = other
        if oldest is None:
            return False
        oldest._stop_timer()
        oldest.transport.close()
        return True


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise ConfigError(f"${name} must be a positive number, not {text!r}")
    return value


def http_config(app: Any, open_files: int, *, per_account: bool = True) -> uvicorn.Config:
    """uvicorn's configuration for the API: the guarded protocol with its bounds, under
    ``open_files`` descriptors (the limit the daemon raised at its start). ``per_account``:
    bound each account's connections on the socket (with --auth; without it, the machine
    has one trusted user, and every caller is an admin)."""
    fds = open_files
    timeout = _env_number("DDPQ_HEADER_TIMEOUT", HEADER_TIMEOUT_S)
    body_timeout = _env_number("DDPQ_BODY_TIMEOUT", BODY_TIMEOUT_S)
    wanted = int(_env_number("DDPQ_MAX_CONNECTIONS", MAX_CONNECTIONS))
    limit = max(8, min(wanted, fds - RESERVED_FDS))
    # A quarter of all at most: four users holding theirs leave room for everyone else.
    each = int(_env_number("DDPQ_MAX_CONNECTIONS_PER_ACCOUNT", MAX_PER_ACCOUNT))
    each = max(2, min(each, limit // 4)) if per_account else limit
    protocol = type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout_s": timeout,
            "body_timeout_s": body_timeout,
            "max_connections": limit,
            "max_per_account": each,
        },
    )
    log.info(
        "API: at most %d connections (%d an account on the socket), %g s for a request's "
        "headers, %g s for its body",
        limit,
        each,
        timeout,
        body_timeout,
    )
    return uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
