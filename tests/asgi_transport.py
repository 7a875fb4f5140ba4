"""The in-process API's requests, each handed to the app's event loop in one crossing.

Starlette's ``TestClient`` runs the app on an event loop in a thread of its own (its
portal) and crosses to that thread for every step of a request: two events, a stream and a
cancel scope made there, the app started, the wait for its response, each piece of the
body. Eight crossings for a one-piece answer, each a wake-up of the other thread: ~7.5 ms of
CPU for a ``/healthz`` on this project's AMD machine, against ~1 ms for the daemon to serve
it over real HTTP (``bench/inprocess_requests.py``). Here the whole request goes to the loop
as one task, which puts what the app sends on a queue the calling thread reads; a body still
streams piece by piece (``ddpq logs --follow``'s test reads one as it comes). The portal, the
lifespan and a client used without ``with`` (a portal per request) stay ``TestClient``'s.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx2
from starlette.types import Message

DEFAULT_PORTS = {"http": 80, "https": 443}
PEER = ("testclient", 50000)  # the client's address the app sees, as Starlette's client says


# Put on the queue when the app's task has returned or raised (its future says which).
_ENDED: Message = {"type": "ended"}


@dataclass
class _Exchange:
    """One request's two sides: the app's task in the loop, and the calling thread that
    reads what the app sent from ``parts``."""

    loop: asyncio.AbstractEventLoop
    raise_errors: bool
    parts: queue.SimpleQueue[Message] = field(default_factory=queue.SimpleQueue)
    task: Future[None] | None = None
    # Set (in the loop) when the caller is done with an unfinished response: a disconnect.
    gone: asyncio.Future[None] | None = None

    def finish(self, *, complete: bool) -> None:
        """Wait for the app's task to end (a finished response's background work too, as
        Starlette's client does); one whose answer was left unread is told the client went
        away, and cancelled. Raises what the app raised when so asked."""
        assert self.task is not None
        if not complete and not self.task.done():
            self.loop.call_soon_threadsafe(self._disconnect)
            self.task.cancel()
        wait([self.task])
        if self.raise_errors and not self.task.cancelled() and self.task.exception():
            raise self.task.exception()  # type: ignore[misc]

    def _disconnect(self) -> None:
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)


class _Body(httpx2.SyncByteStream):
    """The answer's body as the app sends it, piece by piece."""

    def __init__(self, exchange: _Exchange) -> None:
        self.exchange, self.more = exchange, True

    def __iter__(self) -> Iterator[bytes]:
        while self.more:
            part = self.exchange.parts.get()
            if part is _ENDED:
                self.more = False
            elif part["type"] == "http.response.body":
                self.more = part.get("more_body", False)
                if part.get("body"):
                    yield bytes(part["body"])

    def close(self) -> None:
        self.exchange.finish(complete=not self.more)


class OneCrossingTransport(httpx2.BaseTransport):
    """``fallback`` (Starlette's transport) serves what this does not: a client not
    entered, so without a running portal, and websockets."""

    def __init__(
        self,
        client: Any,  # a TestClient: its app, its portal while entered, its app's state
        fallback: httpx2.BaseTransport,
        *,
        raise_server_exceptions: bool,
    ) -> None:
        self.client, self.fallback, self.raise_errors = client, fallback, raise_server_exceptions
        # The portal whose loop was looked up last, held: a portal's id could be a new
        # one's after it was freed, and a loop of a client's earlier ``with`` is closed.
        self._portal: object = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        self.fallback.close()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        portal = self.client.portal
        if portal is None or request.url.scheme not in DEFAULT_PORTS:
            return self.fallback.handle_request(request)
        if portal is not self._portal or self._loop is None:  # a client entered anew
            self._portal, self._loop = portal, portal.call(asyncio.get_running_loop)
        loop = self._loop
        exchange = _Exchange(loop, self.raise_errors)
        exchange.task = asyncio.run_coroutine_threadsafe(
            self._serve(self._scope(request), request.read(), exchange), loop
        )
        return self._response(request, exchange)

    def _scope(self, request: httpx2.Request) -> dict[str, Any]:
        url = request.url
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": unquote(url.path),
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "root_path": "",
            "query_string": url.query,
            "headers": [(name.lower(), value) for name, value in request.headers.raw],
            "client": PEER,
            "server": [url.host, url.port or DEFAULT_PORTS[url.scheme]],
            "state": dict(self.client.app_state),
        }

    async def _serve(self, scope: dict[str, Any], body: bytes, exchange: _Exchange) -> None:
        exchange.gone = asyncio.get_running_loop().create_future()
        request_sent = False

        async def receive() -> Message:
            nonlocal request_sent
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            assert exchange.gone is not None
            await exchange.gone
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            exchange.parts.put(message)

        try:
            await self.client.app(scope, receive, send)
        finally:  # wakes the caller, whatever the app did; its future says what that was
            exchange.parts.put(_ENDED)

    def _response(self, request: httpx2.Request, exchange: _Exchange) -> httpx2.Response:
        part = exchange.parts.get()
        while part is not _ENDED and part["type"] != "http.response.start":
            part = exchange.parts.get()  # nothing else comes first from a sound app
        if part is _ENDED:  # the app ended, or failed, before it answered
            exchange.finish(complete=True)
            if self.raise_errors:
                raise AssertionError("the app ended without an answer")
            return httpx2.Response(500, request=request)
        status, headers = part["status"], part.get("headers", [])
        return httpx2.Response(status, headers=headers, stream=_Body(exchange), request=request)
