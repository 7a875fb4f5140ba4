"""The daemon about itself: health, who is asking, metrics, and the web page."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from ddpq import __version__
from ddpq.server import metrics as prometheus
from ddpq.server.deps import Auth, DatabaseDep, SettingsDep
from ddpq.store import jobs as job_store

router = APIRouter()

# The page's script and style sheet. create_app mounts them at /static: FastAPI before
# 0.137 drops a router's mounts when it includes the router.
STATIC = Path(__file__).parent.parent / "static"


@router.get("/healthz", tags=["meta"])
def healthz(db: DatabaseDep) -> dict[str, Any]:
    with db.read() as s:
        counts = job_store.count_by_state(s)
    return {"ok": True, "version": __version__, "jobs": counts}


@router.get("/v1/whoami", tags=["meta"])
def whoami(who: Auth, settings: SettingsDep) -> dict[str, Any]:
    return {"name": who.name, "admin": who.admin, "auth": settings.auth}


# Public, no token, like most exporters: a Prometheus scraper has no ddpq account, and the
# counts here name no user, job or command.
@router.get("/metrics", include_in_schema=False)
def metrics(db: DatabaseDep) -> Response:
    with db.read() as s:
        body, content_type = prometheus.render(s, time.time())
    return Response(body, media_type=content_type)


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")
