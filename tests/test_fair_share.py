"""Each caller's line at the API (``server.fair``): one account's requests in flight are
bounded, and the others' go past them; root, followed logs and a daemon without --auth are
not counted. The figures against a real daemon: ``bench/request_flood.py``."""

from __future__ import annotations

import asyncio
import types
from dataclasses import dataclass
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


@dataclass
class Crowd:
    """What ``crowd`` saw with every request in: who was inside the app, the lines kept
    (by key), the most of each caller inside at once, and the lines left at the end."""

    inside: list[str]
    keys: list[tuple[str, object]]
    most: dict[str, int]
    left: dict[tuple[str, object], object]


def crowd(scopes: list[dict[str, Any]]) -> Crowd:
    """Every request of ``scopes`` sent at once through FairShare to an app that holds
    them until all that may enter have: who got in, then all let go."""

    async def run() -> Crowd:
        app = Blocked()
        fair = FairShare(app)
        tasks = [asyncio.create_task(fair(scope, receive, send)) for scope in scopes]
        for _ in range(20):  # every request as far as it goes: in, or waiting its turn
            await asyncio.sleep(0)
        inside, keys = list(app.inside), list(fair.lines)
        app.release.set()
        await asyncio.gather(*tasks)
        return Crowd(inside, keys, app.most, dict(fair.lines))

    return asyncio.run(run())


def with_token(who: str, header: bytes) -> dict[str, Any]:
    scope = a_request(who)
    scope["headers"] = [(b"authorization", header)]
    return scope


def test_one_accounts_flood_waits_in_its_own_line() -> None:
    scopes = [a_request("bob", 1002) for _ in range(12)]
    scopes += [a_request("alice", 1001)] + [a_request("root", 0) for _ in range(6)]
    seen = crowd(scopes)
    assert seen.inside.count("bob") == IN_FLIGHT  # the rest wait in bob's line
    assert "alice" in seen.inside and seen.inside.count("root") == 6  # past bob's line
    assert seen.most["bob"] == IN_FLIGHT and seen.left == {}  # each line gone once empty


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
    seen = crowd([a_request("bob", 1002, **uncounted) for _ in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT + 3


def test_tcp_callers_are_told_apart_by_their_tokens() -> None:
    tokens = [b"Bearer ddpq_aaa", b"Bearer ddpq_bbb"]
    seen = crowd([with_token(t.decode(), t) for t in tokens for _ in range(IN_FLIGHT + 2)])
    assert sorted(seen.inside) == sorted([t.decode() for t in tokens] * IN_FLIGHT)
    assert all(b"ddpq_" not in repr(key).encode() for key in seen.keys)  # hashed


@pytest.mark.parametrize(
    "query", [b"follow=false&x=follow=true", b"follow=true&follow=false", b"limit=16777216"]
)
def test_a_log_read_that_does_not_follow_is_counted(query: bytes) -> None:
    """Only a request the route will stream for ever goes past the line: not one whose
    text holds "follow=true" somewhere while its last ``follow`` says no."""
    log = "/v1/jobs/7/log"
    seen = crowd([a_request("bob", 1002, path=log, query=query) for _ in range(IN_FLIGHT + 2)])
    assert seen.inside.count("bob") == IN_FLIGHT


def test_one_token_is_one_line_however_it_is_written() -> None:
    written = [b"Bearer ddpq_aaa", b"bearer ddpq_aaa", b"BEARER  ddpq_aaa ", b" Bearer ddpq_aaa"]
    seen = crowd([with_token("bob", written[i % 4]) for i in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT and len(seen.keys) == 1
