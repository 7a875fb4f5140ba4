"""The REST API: ``create_app(settings)`` assembles it from the routers in ``server.routes``.

Routes call the store and the core, never SQL. The app does not migrate the database: the
daemon does, once, before it serves (``ddpq.daemon.run``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from ddpq import __version__
from ddpq.config import Settings
from ddpq.server import apidocs
from ddpq.server.errors import ERRORS, HANDLERS
from ddpq.server.fair import FairShare
from ddpq.server.faults import StorageFaults
from ddpq.server.guard import RequestGuard, allowed_names, extra_names_from_env
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.server.routes import (
    devices,
    history,
    job_edits,
    jobs,
    logs,
    meta,
    progress,
    queue,
    reservations,
    sweeps,
    tokens,
    usage,
)
from ddpq.server.token_first import TokenFirst
from ddpq.store.db import Database
from ddpq.store.headroom import Reserve

# In this order in the OpenAPI document.
ROUTERS = (
    meta.router,
    jobs.router,
    job_edits.router,
    queue.router,
    logs.router,
    progress.router,
    sweeps.router,
    devices.router,
    usage.router,
    reservations.router,
    tokens.router,
    history.router,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    # Given back when the disk is full; made whole by the process that runs jobs.
    reserve = Reserve(
        settings.reserve_path, settings.state_reserve_bytes, pause_jobs=app.state.pause_jobs
    )
    app.state.db = Database(settings.db_path, reserve=reserve)
    yield
    app.state.db.dispose()


def create_app(
    settings: Settings, pause_jobs: Callable[[], AbstractContextManager[object]] | None = None
) -> FastAPI:
    """The API on ``settings``; ``pause_jobs`` holds the jobs still while the database's
    reserve is given back on a full disk (``store.headroom``), given by the daemon that
    knows how (the server starts and touches no process)."""
    app = FastAPI(
        title="ddpq",
        version=__version__,
        description="GPU job queue for a shared training server: leases disjoint GPUs and a "
        "rendezvous port to each PyTorch DDP job.",
        lifespan=lifespan,
        # /docs and /redoc: apidocs's, with their assets served from here, not a CDN.
        docs_url=None,
        redoc_url=None,
        responses=ERRORS,
        exception_handlers={**HANDLERS, **sweeps.HANDLERS},
    )
    for router in ROUTERS:
        app.include_router(router)
    # No token needed: the page's script and style sheet hold no data, and the API calls
    # they make send the user's token.
    app.mount("/static", StaticFiles(directory=meta.STATIC), name="static")
    apidocs.add_docs(app)
    # Every route, for the Allow header of a 405. Not app.router.routes alone: since
    # FastAPI 0.137 it holds an included router as one entry, not the router's routes.
    app.state.routes = [*app.router.routes, *(route for r in ROUTERS for route in r.routes)]

    # The last added runs first: the guard refuses foreign requests before anything else;
    # a storage fault anywhere after it is a 503; a write's token is proven before its
    # body is read; then each caller waits its turn in its own line.
    app.add_middleware(FairShare)
    app.add_middleware(TokenFirst)
    app.add_middleware(StorageFaults)
    app.add_middleware(RequestGuard, names=guard_names(settings))
    serve_anew(app, settings, pause_jobs)
    return app


def guard_names(settings: Settings) -> frozenset[str]:
    """The Host names the app's guard lets in: the one part of ``settings`` fixed when the
    app is built."""
    return allowed_names(settings.host, extra_names_from_env())


def serve_anew(
    app: FastAPI,
    settings: Settings,
    pause_jobs: Callable[[], AbstractContextManager[object]] | None = None,
) -> None:
    """The app's state as ``create_app`` leaves it, on ``settings`` (whose ``guard_names``
    must be the app's): the settings, and nothing held from an earlier serving. Tests lend
    one app to test after test this way, as FastAPI builds each route's validators on the
    first request an app gets (~0.1 s of CPU), not once per process."""
    app.state.settings = settings
    app.state.pause_jobs = pause_jobs
    app.state.notify_lookups = NotifyLookups()
    app.state.log_followers = {}  # routes.logs: each user's followed logs
    # The middleware are made again on the next request: they keep state (the fault that
    # StorageFaults logged last).
    app.middleware_stack = None
