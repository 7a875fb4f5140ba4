"""What routes are given through ``Depends``: the settings, the database, the caller.

``create_app`` keeps one ``Settings`` and one ``Database`` on ``app.state``; routes never
reach for them any other way, so a route's signature says what it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from ddpq.config import Settings
from ddpq.schemas import NAME_PATTERN, NAME_RE, NAME_RULE
from ddpq.server.errors import ApiError
from ddpq.store import users as user_store
from ddpq.store.db import Database


@dataclass(frozen=True)
class Caller:
    name: str
    admin: bool


# async: a plain def would cost every request a trip through the thread pool for a lookup.
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_db)]


def get_caller(
    settings: SettingsDep,
    db: DatabaseDep,
    request: Request,
    x_ddpq_user: Annotated[
        str | None,
        Header(
            description="who is asking, without --auth (ignored with it); a user name",
            json_schema_extra={"pattern": NAME_PATTERN},
        ),
    ] = None,
) -> Caller:
    """Who is asking: the token's user with --auth, else whoever the client says it is.

    Without --auth every caller is an admin: the daemon cannot tell users apart, so it
    enforces nothing between them (no owner checks, no priority cap).
    """
    if not settings.auth:
        if x_ddpq_user is None:
            return Caller(name="anonymous", admin=True)
        # Checked like any user name: it becomes the owner of what this caller submits.
        if not NAME_RE.match(x_ddpq_user):
            raise ApiError(422, "invalid", f"X-Ddpq-User: {NAME_RULE}")
        return Caller(name=x_ddpq_user, admin=True)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "this daemon needs a token: set DDPQ_TOKEN")
    with db.read() as s:
        user = user_store.by_token(s, token.strip())
        if user is None:
            raise ApiError(401, "unauthorized", "unknown token")
        return Caller(name=user.name, admin=user.is_admin)


Auth = Annotated[Caller, Depends(get_caller)]


def may_touch(who: Caller, owner: str, job_id: int) -> None:
    """Refuse a user another user's job. Admins may touch any, and without --auth every
    caller is one (see ``get_caller``), so this enforces nothing there."""
    if not who.admin and who.name != owner:
        raise ApiError(403, "forbidden", f"job {job_id} belongs to {owner}, not {who.name}")
