"""uvicorn's HTTP/1.1 protocol with the two bounds it lacks (header time and connections),
and, on the Unix socket, the caller's credentials in each request's scope (``server.peer``).

uvicorn waits for a request's headers for ever, so a client that opens connections and
never finishes a request line (slowloris) holds them as long as it likes, until the
daemon runs out of file descriptors and cannot accept the next ``/healthz``. Here:

- a request's headers must be complete ``HEADER_TIMEOUT_S`` after the connection opened,
  or after the previous response on it ended; trickling bytes does not extend that. A
  connection that misses it is closed.
- at most ``max_connections`` connections are open (fewer if the descriptor limit is
  low, which the daemon raised to its hard limit at its start). When one more arrives,
  the one that has waited longest for its headers is closed to make room; if every
  connection is busy with a request, the newcomer gets 503 and is closed.

``$DDPQ_HEADER_TIMEOUT`` (seconds) and ``$DDPQ_MAX_CONNECTIONS`` override the defaults
(tests shorten them).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ddpq.config import ConfigError
from ddpq.server.peer import read_peer_credentials, with_peer

log = logging.getLogger("ddpq.server")

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1000
# Descriptors kept for everything else the daemon opens: the database, the worker's
# pidfds and job files, the wake socket.
RESERVED_FDS = 256
KEEP_ALIVE_S = 5

_BUSY_BODY = b'{"detail":"too many connections to ddpq; try again later","code":"too_busy"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with a header deadline and a bound on open connections."""

    header_timeout_s = HEADER_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        # loop time since which this connection waits for a request's headers, or None
        self.waiting_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection on the Unix socket: its requests carry the caller's uid (server.peer).
        peer = read_peer_credentials(transport.get_extra_info("socket"))
        if peer is not None:
            self.app = with_peer(self.app, peer)
        if len(self.connections) > self.max_connections and not self._make_room():
            self.connections.discard(self)
            transport.write(_BUSY)
            transport.close()
            return
        self._sync_timer()

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
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_timer()

    def _sync_timer(self) -> None:
        """Run the header clock exactly while the connection waits for a request's headers.

        h11's view of the client is IDLE from the connection's start, and again once a
        response is complete and the next cycle began, until a whole request head arrived.
        """
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._header_timer is None:
            self.waiting_since = self.loop.time()
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)
        elif not waiting:
            self._stop_timer()

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = None
        self.waiting_since = None

    def _too_slow(self) -> None:
        self._header_timer = None
        self.waiting_since = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for its headers; False if none is."""
        oldest: GuardedH11Protocol | None = None
        for other in self.connections:
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


def http_config(app: Any, open_files: int) -> uvicorn.Config:
    """uvicorn's configuration for the API: the guarded protocol with its bounds, under
    ``open_files`` descriptors (the limit the daemon raised at its start)."""
    fds = open_files
    timeout = _env_number("DDPQ_HEADER_TIMEOUT", HEADER_TIMEOUT_S)
    wanted = int(_env_number("DDPQ_MAX_CONNECTIONS", MAX_CONNECTIONS))
    limit = max(8, min(wanted, fds - RESERVED_FDS))
    protocol = type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_s": timeout, "max_connections": limit},
    )
    log.info("API: at most %d connections, %g s for a request's headers", limit, timeout)
    return uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
