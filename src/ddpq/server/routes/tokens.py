"""Tokens a Unix account makes for itself: made through the socket, used over TCP.

On the server itself nobody needs a token: the Unix socket knows who calls. A token is for
where the socket is out of reach (another machine, the web page): its account makes it
through the socket (``ddpq token create``), with an expiry, and may list and revoke its
tokens from either side. A token cannot make another (that would let a stolen token
outlive its expiry), and an admin may list and revoke everyone's.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from ddpq.core.names import NAME_PATTERN
from ddpq.server.deps import Auth, Caller, DatabaseDep, SettingsDep
from ddpq.server.errors import WRITE_ERRORS, ApiError
from ddpq.store import tokens as token_store

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])

DAY_S = 24 * 3600.0
DEFAULT_EXPIRY_S = 90 * DAY_S
MAX_EXPIRY_S = 365 * DAY_S
TokenId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    expires_s: float = Field(
        default=DEFAULT_EXPIRY_S,
        ge=1,
        le=MAX_EXPIRY_S,
        allow_inf_nan=False,
        description="seconds from now until the token stops working (at most 365 days)",
    )
    note: str | None = Field(
        default=None,
        max_length=64,
        json_schema_extra={"pattern": NAME_PATTERN},
        pattern=NAME_PATTERN,
        description="a word to tell this token from others: where it is used ('laptop')",
    )


class TokenOut(BaseModel):
    id: int
    owner: str
    note: str | None
    created_at: float
    expires_at: float
    expired: bool


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, only its hash is kept")


class TokenList(BaseModel):
    items: list[TokenOut]


def _out(t: token_store.TokenInfo, now: float) -> TokenOut:
    return TokenOut(
        id=t.id,
        owner=t.owner,
        note=t.note,
        created_at=t.created_at,
        expires_at=t.expires_at,
        expired=t.expires_at <= now,
    )


@router.post("", status_code=201, response_model=TokenCreated, responses=WRITE_ERRORS)
def create(body: TokenCreate, who: Auth, settings: SettingsDep, db: DatabaseDep) -> TokenCreated:
    """Make a token for the calling Unix account; through the Unix socket only."""
    if not settings.auth:
        raise ApiError(
            409,
            "conflict",
            "this daemon runs without --auth: it asks no one for a token (and so tells no "
            "one apart over TCP)",
        )
    if who.via != "socket" or who.account is None or who.uid is None:
        raise ApiError(
            403,
            "forbidden",
            "tokens are made on the server itself, through its Unix socket (`ddpq token "
            "create` there); a token cannot make another",
        )
    if who.uid == 0:
        raise ApiError(
            403,
            "forbidden",
            "root makes no token for itself: for an admin elsewhere, `ddpq admin user add "
            "NAME --admin`",
        )
    now = time.time()
    try:
        with db.write() as s:
            info, secret = token_store.create_token(
                s, who.account, who.uid, expires_at=now + body.expires_s, note=body.note, now=now
            )
    except token_store.TooManyTokens as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return TokenCreated(**_out(info, now).model_dump(), token=secret)


@router.get("", response_model=TokenList)
def list_tokens(
    who: Auth,
    db: DatabaseDep,
    all_: Annotated[bool, Query(alias="all", description="everyone's (admins)")] = False,
) -> TokenList:
    """The caller's tokens (an admin's with all=true: everyone's), expired ones included
    for 30 days."""
    if all_ and not who.admin:
        raise ApiError(403, "forbidden", "only an admin may list everyone's tokens")
    now = time.time()
    with db.read() as s:
        rows = token_store.list_tokens(s, None if all_ else who.name)
    return TokenList(items=[_out(t, now) for t in rows])


@router.post("/{token_id}/revoke", response_model=TokenOut, responses=WRITE_ERRORS)
def revoke(token_id: TokenId, who: Auth, db: DatabaseDep) -> TokenOut:
    """Revoke a token: it stops working at once. Yours, or anyone's for an admin."""
    now = time.time()
    with db.write() as s:
        info = token_store.by_id(s, token_id)
        if info is None or not _may_revoke(who, info):
            # Another's token reads as none: ids tell nothing about who holds what.
            raise ApiError(404, "not_found", f"you have no token {token_id}")
        token_store.revoke(s, token_id)
    return _out(info, now)


def _may_revoke(who: Caller, info: token_store.TokenInfo) -> bool:
    return who.admin or info.owner == who.name
