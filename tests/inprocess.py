"""The API in-process: ``create_app`` on a migrated database file, behind a TestClient.

``create_app`` does not migrate (the daemon does, once, before it serves), so whatever
runs the app without a daemon migrates here first, as ``ddpq.daemon.run`` would (a copy of
the session's migrated template: ``tests/template_db.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ddpq.config import Settings
from ddpq.core.gpus import Gpu
from ddpq.server.app import create_app, guard_names, serve_anew
from ddpq.store import devices as device_store
from ddpq.store.db import Database
from tests.asgi_transport import OneCrossingTransport
from tests.template_db import migrated

BASE = "http://127.0.0.1:8765"


# Apps no client holds, by their guard's names (the one thing an app keeps from the settings
# it was built on): FastAPI builds a route's validators on an app's first request to it, ~0.1 s
# of CPU per app, so each test process builds one app per set of names and lends it on.
_IDLE_APPS: dict[frozenset[str], list[FastAPI]] = {}
# Each app's names, as they were when it was built (the variables may have changed since).
_NAMES_OF: dict[FastAPI, frozenset[str]] = {}


class InProcessClient(TestClient):
    """A TestClient whose requests cross to the app's thread once (``tests/asgi_transport``)
    and whose server errors are answers (500s), not exceptions: several tests assert that
    there is none."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(app, base_url=BASE, raise_server_exceptions=False)
        starlettes: httpx2.BaseTransport = self._transport
        self._transport = OneCrossingTransport(self, starlettes, raise_server_exceptions=False)


class _LentClient(InProcessClient):
    """A TestClient on a lent app, which goes back to the idle ones when the client's
    ``with`` block ends (a client never entered keeps its app)."""

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        app: FastAPI = self.app  # type: ignore[assignment]  # what lend gave it
        give_back(app)


def lend(config: Settings) -> FastAPI:
    """An app on ``config`` as ``create_app`` makes it: an idle one made new, or a new one.
    Given back (``give_back``) once its last request and its lifespan have ended."""
    names = guard_names(config)
    idle = _IDLE_APPS.get(names)
    if not idle:
        app = create_app(config)
        _NAMES_OF[app] = names
        return app
    app = idle.pop()
    serve_anew(app, config)
    return app


def give_back(app: FastAPI) -> None:
    idle = _IDLE_APPS.setdefault(_NAMES_OF[app], [])
    if app not in idle:  # a client closed twice lends its app once
        idle.append(app)


@contextlib.contextmanager
def lent_app(config: Settings) -> Iterator[FastAPI]:
    """``lend``, given back when the block ends (enter a client on it after this)."""
    app = lend(config)
    try:
        yield app
    finally:
        give_back(app)


def make_client(home: Path, **settings: Any) -> TestClient:
    """A client on a new app (``lent_client``: a lent one)."""
    config = Settings(home=home, **settings)
    migrated(config.db_path)
    return InProcessClient(create_app(config))


def lent_client(home: Path, **settings: Any) -> TestClient:
    """``make_client`` on a lent app, for tests that change nothing ``create_app`` reads
    but the settings (not, say, a monkeypatched ``apidocs.assets_folder``)."""
    config = Settings(home=home, **settings)
    migrated(config.db_path)
    return _LentClient(lend(config))


def client_with_gpus(
    home: Path, gpus: int = 8, memory_mb: int = 16384, **settings: Any
) -> Iterator[TestClient]:
    """An in-process API whose store shows ``gpus`` fake GPUs, as a worker would have
    published them (submissions are checked against what exists); on a lent app."""
    with lent_client(home, **settings) as c:
        publish_fake_gpus(home / "ddpq.db", gpus, memory_mb)
        yield c


def publish_fake_gpus(db_path: Path, gpus: int, memory_mb: int = 16384) -> None:
    """``gpus`` idle fake GPUs in the store, as a worker publishes what it found:
    submissions are checked against what exists."""
    with Database(db_path).write() as s:
        rows = [Gpu(i, f"GPU-{i}", "fake", memory_mb, 0, (), True) for i in range(gpus)]
        device_store.replace_all(s, rows, time.time())
