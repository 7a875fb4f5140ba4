"""Each caller's line at the API (``server.fair``): one account's requests in flight are
bounded, and the others' go past them; root, followed logs and a daemon without --auth are
not counted. The figures against a real daemon: ``bench/request_flood.py``."""

from __future__ import annotations

import asyncio
import types
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from ddpq.server.deps import KNOWN_CALLER, Caller
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
        if scope["answers"]:  # a stream: its answer starts, then it goes on
            await send({"type": "http.response.start", "status": 200, "headers": []})
        self.inside.append(who)
        self.most[who] = max(self.most.get(who, 0), self.inside.count(who))
        await self.release.wait()
        self.inside.remove(who)


async def receive() -> Message:
    return {"type": "http.disconnect"}


async def send(message: Message) -> None:
    """Nothing is sent: the app here answers nothing."""


def a_request(
    who: str, uid: int | None = None, auth: bool = True, answers: bool = False
) -> dict[str, Any]:
    app = types.SimpleNamespace(
        state=types.SimpleNamespace(settings=types.SimpleNamespace(auth=auth))
    )
    scope: dict[str, Any] = {
        "type": "http",
        "who": who,
        "app": app,
        "path": "/v1/queue",
        "answers": answers,
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


def test_a_daemon_without_auth_counts_nobody() -> None:
    seen = crowd([a_request("bob", 1002, auth=False) for _ in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT + 3  # one trusted user


def test_an_answer_under_way_gives_its_turn_back() -> None:
    """A followed log streams as long as its job: its turn is given back when its answer
    starts, so a user following logs is not kept from their own other requests."""
    seen = crowd([a_request("bob", 1002, answers=True) for _ in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT + 3 and seen.most["bob"] == IN_FLIGHT + 3


def test_tcp_callers_are_told_apart_by_their_tokens() -> None:
    tokens = [b"Bearer ddpq_aaa", b"Bearer ddpq_bbb"]
    seen = crowd([with_token(t.decode(), t) for t in tokens for _ in range(IN_FLIGHT + 2)])
    assert sorted(seen.inside) == sorted([t.decode() for t in tokens] * IN_FLIGHT)
    assert all(b"ddpq_" not in repr(key).encode() for key in seen.keys)  # hashed


def test_one_token_is_one_line_however_it_is_written() -> None:
    written = [b"Bearer ddpq_aaa", b"bearer ddpq_aaa", b"BEARER  ddpq_aaa "]  # as deps reads
    seen = crowd([with_token("bob", written[i % 3]) for i in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT and len(seen.keys) == 1


def test_a_writes_line_is_its_proven_users_whatever_token_it_used() -> None:
    """A write's caller, proven before its body (``server.token_first``): one user's line,
    whichever of their tokens each request carries."""

    def proven(token: bytes) -> dict[str, Any]:
        scope = with_token("bob", token)
        scope["state"] = {KNOWN_CALLER: Caller("bob", admin=False, via="user_token")}
        return scope

    tokens = [b"Bearer ddpq_aaa", b"Bearer ddpq_own_bbb"]
    seen = crowd([proven(tokens[i % 2]) for i in range(IN_FLIGHT + 3)])
    assert seen.inside.count("bob") == IN_FLIGHT and seen.keys == [("user", "bob")]
