"""Each caller's share of the API: at most ``IN_FLIGHT`` of one caller's requests are worked
on at once; the rest wait their turn, in their caller's own line.

The API's work runs on one event loop and a pool of threads that every caller shares. One
user's script that keeps 48 requests in flight (a loop of `ddpq ls` on many connections)
took as many threads, and everyone else's requests queued behind them: another caller's
`GET /v1/queue` went from 1.4 ms to 123 ms at the median (``bench/request_flood.py``).
With the bound, a flood is that caller's own wait.

A caller is its Unix account on the socket (root's requests are not counted: the admin's
own tools), else its token (a hash of it: the token itself is not kept), else its address.
Only with ``--auth``: without it the machine has one trusted user. A followed log
(``?follow=true``) is not counted: it lasts as long as its job, and has a bound of its own
(``routes/logs``).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from ddpq.server.peer import PeerCredentials, peer_of

IN_FLIGHT = 4


@dataclass
class _Line:
    """One caller's requests: the turns, and how many are in or waiting (the line goes
    when none is)."""

    turns: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(IN_FLIGHT))
    waiting: int = 0


class FairShare:
    """ASGI middleware: each caller's requests in its own line of ``IN_FLIGHT`` at once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.lines: dict[tuple[str, object], _Line] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = caller_of(scope) if scope["type"] == "http" and _counted(scope) else None
        if key is None:
            await self.app(scope, receive, send)
            return
        line = self.lines.setdefault(key, _Line())
        line.waiting += 1
        try:
            async with line.turns:
                await self.app(scope, receive, send)
        finally:
            line.waiting -= 1
            if not line.waiting:
                del self.lines[key]


# What FastAPI reads as a true ``follow`` (pydantic's words for a bool), in any case.
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})


def _counted(scope: Scope) -> bool:
    settings = getattr(getattr(scope.get("app"), "state", None), "settings", None)
    if not getattr(settings, "auth", False):
        return False
    if not scope.get("path", "").endswith("/log"):
        return True
    # The query read as the route reads it: its last ``follow``, not any text in it.
    query = scope.get("query_string", b"").decode("latin-1")
    said = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "follow"]
    return not (said and said[-1].strip().lower() in _TRUE)


def caller_of(scope: Scope) -> tuple[str, object] | None:
    """Whose request this is, for its line: None for root on the socket."""
    peer = peer_of(scope)
    if isinstance(peer, PeerCredentials):
        return None if peer.uid == 0 else ("uid", peer.uid)
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            # The token as ``deps`` reads it (any case of "Bearer", blanks around it), so
            # that one token is one line however it is written.
            _scheme, _, token = value.strip().partition(b" ")
            return ("token", hashlib.sha256(token.strip()).digest()[:16])
    client = scope.get("client")
    return ("address", client[0] if client else "")
