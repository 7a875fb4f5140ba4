"""Storage faults (a full disk, a read-only or locked database) and exhausted resources (no
file descriptor or memory left, ``server.exhaustion``) answered as 503, logged once.

They are conditions of the machine, not bugs, nor anything the caller did: the client gets
one ``{detail, code: "unavailable"}`` body naming the cause, and the log gets one line per
condition (repeated at most every ``REPEAT_S`` while it lasts), not a traceback per
request. Any other exception goes on to the usual 500 and its traceback.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddpq.server.exhaustion import cause_of
from ddpq.store.db import storage_fault

log = logging.getLogger("ddpq.server")
REPEAT_S = 600.0


class StorageFaults:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._logged: tuple[str, float] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            why = storage_fault(exc) or cause_of(exc)
            if why is None or started:  # a bug, or too late to answer: the usual path
                raise
            self._note(why, scope)
            await _unavailable(send, why)

    def _note(self, why: str, scope: Scope) -> None:
        now = time.monotonic()
        if self._logged is not None and self._logged[0] == why and now - self._logged[1] < REPEAT_S:
            return
        self._logged = (why, now)
        log.error(
            "API: %s; answering 503 to requests that need it (first: %s %s)",
            why,
            scope["method"],
            scope["path"],
        )


async def _unavailable(send: Send, why: str) -> None:
    detail = f"{why}; try again later"
    body = json.dumps({"detail": detail, "code": "unavailable"}, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # A fault of the machine lasts: tell clients not to hammer it.
                (b"retry-after", b"5"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
