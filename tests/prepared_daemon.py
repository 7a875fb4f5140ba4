"""What every test daemon builds the same, built once in the zygote before it forks them:
the command line with the daemon's commands, and the API app with its routes made ready.

``ddpq serve`` builds the client's and the daemon's Typer commands to find its own (~0.1 s
of CPU here, ``entry.command_line``); the zygote builds them once, and a forked daemon's
``command_line`` is that group (any other command line builds its own, as before).

FastAPI makes each included route's dependencies, validators and serializers the first time
a request is matched against its router, once per app (``_populate_api_route_state``,
under a forked ``ddpq serve``'s first /healthz polls), and the suite starts hundreds of
daemons: with both built here, a forked daemon's API half takes 0.16 s of CPU, not 0.31
(``bench/forked_daemon_cpu.py``). The zygote
(``tests/zygote.py``) builds one app before it forks and sends it a request that matches no
route, which walks every router and makes every route ready; each forked daemon's first
``create_app`` then serves that app made new (``serve_anew``, as ``tests/inprocess`` lends
its apps), whenever the app it would have built lets in the same Host names. Anything else
builds a new app, as before.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, MutableMapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from typer.core import TyperGroup

from ddpq import entry
from ddpq.config import Settings
from ddpq.server import app as app_module

# Matched against every route of every router, and by none.
NO_ROUTE = "/.ddpq-zygote-makes-every-route-ready"

_prepared: list[tuple[FastAPI, frozenset[str]]] = []  # at most one, for one create_app


def prepare() -> None:
    """In the zygote, before any fork: the command line and the app built, and
    ``command_line`` and ``create_app`` set to hand them out (in each forked child)."""
    prepare_command_line()
    prepare_app()


def prepare_command_line() -> None:
    """A daemon's command line, made once; ``entry.command_line`` gives it to a daemon."""
    built = entry.command_line(["serve"])
    original = entry.command_line

    def command_line(argv: Sequence[str] | None = None) -> TyperGroup:
        words = sys.argv[1:] if argv is None else argv
        return built if entry.starts_a_daemon(built, words) else original(argv)

    entry.command_line = command_line


def prepare_app() -> None:
    """The app built, its routes made ready, and ``create_app`` set to hand it out once."""
    settings = Settings(home=Path("/nonexistent/ddpq-zygote"))
    app = app_module.create_app(settings)
    status = asyncio.run(request_nothing(app))
    assert status == 404, f"the app's warm-up request answered {status}, not 404"
    _prepared.append((app, app_module.guard_names(settings)))
    original = app_module.create_app

    def create_app(
        settings: Settings,
        pause_jobs: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> FastAPI:
        if _prepared and _prepared[0][1] == app_module.guard_names(settings):
            ready, _ = _prepared.pop()
            app_module.serve_anew(ready, settings, pause_jobs)
            return ready
        return original(settings, pause_jobs)

    app_module.create_app = create_app


async def request_nothing(app: FastAPI) -> int:
    """A GET of ``NO_ROUTE`` through the whole app (its middleware, every router), without
    its lifespan (no database is opened): the answer's status."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": NO_ROUTE,
        "raw_path": NO_ROUTE.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return int(sent[0]["status"])
