"""Each caller's share of the API: at most ``IN_FLIGHT`` of one caller's requests are worked
on at once; the rest wait their turn, in their caller's own line.

The API's work runs on one event loop and a pool of threads that every caller shares. One
user's script that keeps 48 requests in flight (a loop of `ddpq ls` on many connections)
took as many threads, and everyone else's requests queued behind them: another caller's
(root's, in the bench) `GET /v1/queue` went from 1.4 ms to 123 ms at the median
(``bench/request_flood.py``).
With the bound, a flood is that caller's own wait.

A caller is its Unix account on the socket (root's requests are not counted: the admin's
own tools), else for a write the user its token names (proven first, ``server.token_first``:
a made-up token never gets this far), else its token (a hash of it: the token itself is
not kept), else its address.
Only with ``--auth``: without it the machine has one trusted user. A turn is given back
when the answer starts, not when it ends: a followed log streams for as long as its job,
outside the line (it has a bound of its own, ``routes/logs``).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddpq.server.deps import KNOWN_CALLER, Caller, bearer_token
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
        turn = False
        try:
            await line.turns.acquire()
            turn = True

            async def answering(message: Message) -> None:
                # The work is done once the answer starts: a stream that lasts as long as
                # its job (a followed log) holds no turn while it lasts.
                nonlocal turn
                if turn and message["type"] == "http.response.start":
                    turn = False
                    line.turns.release()
                await send(message)

            await self.app(scope, receive, answering)
        finally:
            if turn:
                line.turns.release()
            line.waiting -= 1
            if not line.waiting:
                del self.lines[key]


def _counted(scope: Scope) -> bool:
    settings = getattr(getattr(scope.get("app"), "state", None), "settings", None)
    return bool(getattr(settings, "auth", False))


def caller_of(scope: Scope) -> tuple[str, object] | None:
    """Whose request this is, for its line: None for root on the socket."""
    known = scope.get("state", {}).get(KNOWN_CALLER)
    if isinstance(known, Caller):  # a write's, proven before its body (server.token_first)
        return ("user", known.name)
    peer = peer_of(scope)
    if isinstance(peer, PeerCredentials):
        return None if peer.uid == 0 else ("uid", peer.uid)
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            # The token as ``deps`` reads it: one token is one line however it is written.
            token = bearer_token(value.decode("latin-1")) or ""
            return ("token", hashlib.sha256(token.encode()).digest()[:16])
    client = scope.get("client")
    return ("address", client[0] if client else "")
