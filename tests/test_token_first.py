"""With --auth, a write over TCP proves its token before its body is read
(``server.token_first``); the live daemon's side is in tests/test_auth.py. Here: its
lookups, which run before any caller's line, are bounded whoever sends them."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ddpq.server import token_first
from ddpq.server.deps import KNOWN_CALLER, Caller
from ddpq.server.token_first import LOOKUPS, TokenFirst


def a_write(token: str) -> dict[str, Any]:
    state = types.SimpleNamespace(settings=types.SimpleNamespace(auth=True), db=None)
    return {
        "type": "http",
        "method": "POST",
        "app": types.SimpleNamespace(state=state),
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 5000),
    }


async def receive() -> Message:
    return {"type": "http.disconnect"}


def test_token_lookups_are_bounded_and_the_proven_caller_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inside, most, lock, release = [0], [0], threading.Lock(), threading.Event()

    def slow_lookup(_settings: object, _db: object, authorization: str) -> Caller:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(10)  # an accounts database that is slow to answer
        with lock:
            inside[0] -= 1
        return Caller(authorization.split()[-1], admin=False, via="user_token")

    monkeypatch.setattr(token_first, "token_caller", slow_lookup)
    seen: list[str] = []

    async def app(scope: Scope, _receive: Receive, _send: Send) -> None:
        seen.append(scope["state"][KNOWN_CALLER].name)

    async def send(_message: Message) -> None:
        """Nothing answers here: the app records who it was called for."""

    async def run() -> None:
        middleware = TokenFirst(app)
        tasks = [
            asyncio.create_task(middleware(a_write(f"t{i}"), receive, send)) for i in range(12)
        ]
        while most[0] < LOOKUPS:  # as many as may be are in (the pool's threads)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and no more come in meanwhile
        assert most[0] == LOOKUPS
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(asyncio.wait_for(run(), 30))
    assert sorted(seen) == sorted(f"t{i}" for i in range(12))
