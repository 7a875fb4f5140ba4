"""The in-process client's transport (tests/asgi_transport.py) answers as Starlette's own
does: bodies whole or streamed, a stream left unread ends the app's work, a failure is a
500 (or raised, when asked), work after the answer is done before the client returns."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import httpx2
import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.asgi_transport import OneCrossingTransport


class Seen:
    """What the app's handlers did, read by the test's thread."""

    def __init__(self) -> None:
        self.stream_ended = threading.Event()
        self.background_done = False
        self.loop_threads: set[int] = set()
        self.loops: list[asyncio.AbstractEventLoop] = []  # held: no id of one reused


def make_app(seen: Seen) -> Starlette:
    async def echo(request: Request) -> Response:
        seen.loop_threads.add(threading.get_ident())
        seen.loops.append(asyncio.get_running_loop())
        body = await request.body()
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "user": request.headers.get("x-user"),
                "body": body.decode(),
            }
        )

    async def endless(request: Request) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            try:
                n = 0
                while True:
                    n += 1
                    yield f"line {n}\n".encode()
                    await asyncio.sleep(0.001)
            finally:
                seen.stream_ended.set()

        return StreamingResponse(lines())

    async def fails(request: Request) -> Response:
        raise RuntimeError("the handler broke")

    async def later(request: Request) -> Response:
        async def done() -> None:
            await asyncio.sleep(0.2)  # long after the answer was sent
            seen.background_done = True

        return Response("answered", background=BackgroundTask(done))

    routes = [
        Route("/echo/{rest:path}", echo, methods=["GET", "POST"]),
        Route("/endless", endless),
        Route("/fails", fails),
        Route("/later", later),
    ]
    return Starlette(routes=routes)


class Client(TestClient):
    def __init__(self, app: Starlette, raise_errors: bool) -> None:
        super().__init__(app, raise_server_exceptions=raise_errors)
        starlettes: httpx2.BaseTransport = self._transport
        self._transport = OneCrossingTransport(
            self, starlettes, raise_server_exceptions=raise_errors
        )


def test_a_request_reaches_the_app_whole_on_its_loop() -> None:
    seen = Seen()
    with Client(make_app(seen), raise_errors=False) as c:
        r = c.post("/echo/a%20b?x=1&y=%C3%A9", content=b"payload", headers={"X-User": "ann"})
        assert r.status_code == 200
        assert r.json() == {
            "method": "POST",
            "path": "/echo/a b",
            "query": "x=1&y=%C3%A9",
            "user": "ann",
            "body": "payload",
        }
        again = c.get("/echo/x")
        assert again.json()["method"] == "GET" and again.json()["body"] == ""
    # Both on the portal's loop, not the test's thread.
    assert len(seen.loop_threads) == 1 and threading.get_ident() not in seen.loop_threads


def test_a_stream_is_read_as_it_comes_and_closing_it_ends_the_apps_work() -> None:
    seen = Seen()
    with Client(make_app(seen), raise_errors=True) as c:
        with c.stream("GET", "/endless") as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert [next(lines) for _ in range(3)] == ["line 1", "line 2", "line 3"]
        # The stream never ends by itself: the client's close stopped it.
        assert seen.stream_ended.wait(10)
        assert c.get("/echo/after").status_code == 200


def test_a_stream_that_never_listens_for_a_disconnect_is_cancelled() -> None:
    """An app that only sends (no ``receive``): the close cancels its task."""
    ended = threading.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
                await asyncio.sleep(0.001)
        finally:
            ended.set()

    with Client(app, raise_errors=True) as c:  # type: ignore[arg-type]
        with c.stream("GET", "/") as r:
            assert next(r.iter_bytes()) == b"x"
        assert ended.is_set()  # cancelled and waited for before the close returned


def test_a_failing_handler_is_a_500_or_raised_when_asked() -> None:
    seen = Seen()
    with Client(make_app(seen), raise_errors=False) as c:
        assert c.get("/fails").status_code == 500
        assert c.get("/echo/still").status_code == 200
    with (
        Client(make_app(seen), raise_errors=True) as c,
        pytest.raises(RuntimeError, match="the handler broke"),
    ):
        c.get("/fails")


def test_work_after_the_answer_is_done_before_the_client_returns() -> None:
    seen = Seen()
    with Client(make_app(seen), raise_errors=True) as c:
        r = c.get("/later")
        assert r.text == "answered" and seen.background_done


def test_a_client_entered_again_is_served_on_its_new_loop() -> None:
    seen = Seen()
    c = Client(make_app(seen), raise_errors=True)
    for _ in range(3):  # a new portal, a new loop, each time
        with c:
            assert c.get("/echo/again").status_code == 200
    assert len({id(loop) for loop in seen.loops}) == 3


def test_a_client_not_entered_is_served_by_starlettes_transport() -> None:
    seen = Seen()
    c = Client(make_app(seen), raise_errors=True)
    assert c.portal is None
    assert c.get("/echo/plain").json()["path"] == "/echo/plain"
    c.close()
