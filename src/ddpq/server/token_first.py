"""With ``--auth``, a write over TCP proves its token before its body is read.

FastAPI reads and parses a request's body before it runs the route's dependencies, the
caller's among them: a client with no token, or a made-up one, had the daemon parse up to
``MAX_BODY_BYTES`` of JSON (about 200 MB of Python objects for 8 MiB of ``{}``, on the
event loop) before it was told 401; and each made-up token had a line of its own in
``FairShare``, so such clients were not bounded by it either. Here the token is looked up
first, for writes (the requests that carry a body): one that names no caller is refused
at once with the route's own 401, its body unread; a known caller is kept in the scope
(``deps.KNOWN_CALLER``), for the route and for ``FairShare``'s line, not looked up twice.

Reads carry no body and are left to the routes: some need no token (the page, its
assets, ``/healthz``). The Unix socket's callers are their accounts (``server.peer``).

The lookups run before any line, so at most ``LOOKUPS`` at once, whoever sends them: one
may wait on the accounts' database (NSS: LDAP, sssd), and a client with many connections
would otherwise take every thread the routes share.
"""

from __future__ import annotations

import asyncio

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from ddpq.config import Settings
from ddpq.server.deps import KNOWN_CALLER, token_caller
from ddpq.server.errors import ApiError, error_response
from ddpq.server.guard import WRITES
from ddpq.server.peer import peer_of
from ddpq.store.db import Database

LOOKUPS = 4


class TokenFirst:
    """ASGI middleware: a write's token is proven before anything reads its body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # Made on the loop that serves (a test's client may bring another loop).
        self._lookups: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        checked = scope["type"] == "http" and scope.get("method") in WRITES
        state = scope["app"].state if checked else None
        if state is None or not state.settings.auth or peer_of(scope) is not None:
            await self.app(scope, receive, send)
            return
        settings: Settings = state.settings
        db: Database = state.db
        authorization = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"),
            "",
        )
        loop = asyncio.get_running_loop()
        if self._lookups is None or self._lookups[0] is not loop:
            self._lookups = (loop, asyncio.Semaphore(LOOKUPS))
        try:
            async with self._lookups[1]:
                # The tokens' table may block (a busy database): not on the event loop.
                caller = await run_in_threadpool(token_caller, settings, db, authorization)
        except ApiError as refused:
            await error_response(refused.status, refused.code, refused.detail)(scope, receive, send)
            return
        scope.setdefault("state", {})[KNOWN_CALLER] = caller
        await self.app(scope, receive, send)
