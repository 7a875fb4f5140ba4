"""The daemon about itself: health, who is asking, the job states, metrics, and the web page."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, Field

from ddpq import __version__
from ddpq.config import Settings
from ddpq.core import states
from ddpq.core.states import JobState
from ddpq.server.deps import Auth, Caller, DatabaseDep, SettingsDep, slurm_refusal
from ddpq.store import jobs as job_store
from ddpq.store import tokens as token_store
from ddpq.store import users as user_store
from ddpq.store.db import Database

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
def whoami(who: Auth, settings: SettingsDep, db: DatabaseDep) -> dict[str, Any]:
    """Who the daemon takes the caller for, how it knows (``via``), and as which Unix
    account the caller's jobs would run (``runs_as``; None: they would fail to launch)."""
    out: dict[str, Any] = {
        "name": who.name,
        "admin": who.admin,
        "auth": settings.auth,
        "via": who.via,
        "account": who.account,
        "uid": who.uid,
        "runs_as": runs_as(who, settings, db),
    }
    if who.via == "socket" and (why := slurm_refusal(who, settings)) is not None:
        out["runs_no_job"] = why  # whoami says why instead of blaming a mapping
    if who.token_id is not None:
        with db.read() as s:
            token = token_store.by_id(s, who.token_id)
        out["token"] = {"id": who.token_id, "expires_at": token.expires_at if token else None}
    return out


def runs_as(who: Caller, settings: Settings, db: Database) -> str | None:
    """As ``job_spec`` and the worker would choose it, without refusing anything."""
    if not settings.auth or os.geteuid() != 0:
        return _name_of(os.geteuid())  # jobs run as the daemon's own account
    if who.via == "socket" or (who.via == "account_token" and settings.remote_accounts):
        return None if slurm_refusal(who, settings) else who.account
    if who.via == "account_token":
        return None
    with db.read() as s:
        return user_store.unix_accounts(s, {who.name}).get(who.name)


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class StatesOut(BaseModel):
    """The job states and their groups, as ``ddpq.core.states`` defines them."""

    states: list[JobState] = Field(
        description="every state, in the order ddpq.core.states has them"
    )
    active: list[JobState] = Field(description="states in which a job holds leases")
    waiting: list[JobState] = Field(description="states in which a job waits for the scheduler")
    terminal: list[JobState] = Field(description="states a job never leaves")


def _in_order(group: frozenset[JobState]) -> list[JobState]:
    return [state for state in JobState if state in group]


# No token, like /healthz: the names are the same for every caller and tell nothing about
# anyone's jobs.
@router.get("/v1/meta/states", response_model=StatesOut, tags=["meta"])
def job_states() -> StatesOut:
    """The job states, so a client (the web page) groups them as the daemon does."""
    return StatesOut(
        states=list(JobState),
        active=_in_order(states.ACTIVE),
        waiting=_in_order(states.WAITING),
        terminal=_in_order(states.TERMINAL),
    )


# Public, no token, like most exporters: a Prometheus scraper has no ddpq account. The
# counts here name no job or command; they name the Unix accounts that use GPUs outside the
# queue (and their ddpq users), which `ps` shows anyone on the machine.
@router.get("/metrics", include_in_schema=False)
def metrics(db: DatabaseDep, settings: SettingsDep) -> Response:
    # Imported by the first scrape, not at the daemon's start: prometheus_client and what
    # it loads (http.server, wsgiref) are ~25 ms of every start, most of them never scraped.
    from ddpq.server import metrics as prometheus

    with db.read() as s:
        body, content_type = prometheus.render(
            s, time.time(), not settings.auth, settings.idle_long_s
        )
    return Response(body, media_type=content_type)


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")
