"""Each caller's line at the API (``server.fair``): one account's requests in flight are
bounded, and the others' go past them; root, followed logs and a daemon without --auth are
not counted. The figures against a real daemon: ``bench/request_flood.py``."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ddpq.server.fair import IN_FLIGHT, FairShare
from ddpq.server.peer import PEER_KEY, PeerCredentials


class Blocked:
    """An app whose requests stay in until released: who is in now, and the most at once."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.most: dict[str, int] = {}
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = scope["who"]
        self.inside.append(who)
        self.most[who] = max(self.most.get(who, 0), self.inside.count(who))
        await self.release.wait()
        self.inside.remove(who)


async def receive() -> Message:
    return {"type": "http.disconnect"}


async def send(message: Message) -> None:
    """Nothing is sent: the app here answers nothing."""


def a_request(
    who: str, uid: int | None = None, auth: bool = True, path: str = "/v1/queue", query: bytes = b""
) -> dict[str, Any]:
    app = types.SimpleNamespace(
        state=types.SimpleNamespace(settings=types.SimpleNamespace(auth=auth))
    )
    scope: dict[str, Any] = {
        "type": "http",
        "who": who,
        "app": app,
        "path": path,
        "query_string": query,
        "headers": [],
        "client": ("127.0.0.1", 5000),
    }
    if uid is not None:
        scope["extensions"] = {PEER_KEY: PeerCredentials(pid=1, uid=uid, gid=uid)}
    return scope


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_one_accounts_flood_waits_in_its_own_line() -> None:
    async def run() -> None:
        app = Blocked()
        fair = FairShare(app)
        bobs = [asyncio.create_task(fair(a_request("bob", 1002), receive, send)) for _ in range(12)]
        await settle()
        assert app.inside.count("bob") == IN_FLIGHT  # the rest wait in bob's line
        alice = asyncio.create_task(fair(a_request("alice", 1001), receive, send))
        root = [asyncio.create_task(fair(a_request("root", 0), receive, send)) for _ in range(6)]
        await settle()
        assert "alice" in app.inside and app.inside.count("root") == 6  # past bob's line
        app.release.set()
        await asyncio.gather(*bobs, alice, *root)
        assert app.most["bob"] == IN_FLIGHT and fair.lines == {}  # each line gone once empty

    asyncio.run(run())


@pytest.mark.parametrize(
    "uncounted",
    [
        {"auth": False},  # one trusted user
        {"path": "/v1/jobs/7/log", "query": b"follow=true&offset=0"},  # a followed log
        {"path": "/v1/jobs/7/log", "query": b"follow=1"},  # as FastAPI reads a bool
        {"path": "/v1/jobs/7/log", "query": b"offset=0&follow=True"},
    ],
)
def test_what_is_not_counted(uncounted: dict[str, Any]) -> None:
    async def run() -> None:
        app = Blocked()
        fair = FairShare(app)
        tasks = [
            asyncio.create_task(fair(a_request("bob", 1002, **uncounted), receive, send))
            for _ in range(IN_FLIGHT + 3)
        ]
        await settle()
        assert app.inside.count("bob") == IN_FLIGHT + 3
        app.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_tcp_callers_are_told_apart_by_their_tokens() -> None:
    async def run() -> None:
        app = Blocked()
        fair = FairShare(app)
        tasks = []
        for token in (b"Bearer ddpq_aaa", b"Bearer ddpq_bbb"):
            for _ in range(IN_FLIGHT + 2):
                scope = a_request(token.decode())
                scope["headers"] = [(b"authorization", token)]
                tasks.append(asyncio.create_task(fair(scope, receive, send)))
        await settle()
        assert sorted(app.inside) == sorted(["Bearer ddpq_aaa", "Bearer ddpq_bbb"] * IN_FLIGHT)
        assert all(b"ddpq_" not in repr(key).encode() for key in fair.lines)  # hashed
        app.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())


@pytest.mark.parametrize(
    "query", [b"follow=false&x=follow=true", b"follow=true&follow=false", b"limit=16777216"]
)
def test_a_log_read_that_does_not_follow_is_counted(query: bytes) -> None:
    """Only a request the route will stream for ever goes past the line: not one whose
    text holds "follow=true" somewhere while its last ``follow`` says no."""

    async def run() -> None:
        app = Blocked()
        fair = FairShare(app)
        tasks = [
            asyncio.create_task(
                fair(a_request("bob", 1002, path="/v1/jobs/7/log", query=query), receive, send)
            )
            for _ in range(IN_FLIGHT + 2)
        ]
        await settle()
        assert app.inside.count("bob") == IN_FLIGHT
        app.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_one_token_is_one_line_however_it_is_written() -> None:
    async def run() -> None:
        app = Blocked()
        fair = FairShare(app)
        tasks = []
        for i in range(IN_FLIGHT + 3):
            written = [
                b"Bearer ddpq_aaa",
                b"bearer ddpq_aaa",
                b"BEARER  ddpq_aaa ",
                b" Bearer ddpq_aaa",
            ]
            scope = a_request("bob")
            scope["headers"] = [(b"authorization", written[i % len(written)])]
            tasks.append(asyncio.create_task(fair(scope, receive, send)))
        await settle()
        assert app.inside.count("bob") == IN_FLIGHT and len(fair.lines) == 1
        app.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())
