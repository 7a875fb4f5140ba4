"""Tokens that Unix accounts make for themselves (through the socket), each with an id and an
expiry. Stored as SHA-256 hashes only, like the users' tokens (``store.users``).

A token is its account over TCP only while it has not expired, has not been revoked, and
its account's name still means the uid that made it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ddpq.store.models import Token
from ddpq.store.users import hash_token

# Live tokens one account may hold: each is a row anyone on the machine could otherwise
# make without bound.
MAX_PER_ACCOUNT = 50
# An expired token is kept this long (listed as expired), then removed when its account
# makes another.
KEEP_EXPIRED_S = 30 * 24 * 3600.0


class TooManyTokens(ValueError):
    pass


@dataclass(frozen=True)
class TokenInfo:
    """A token as it is shown: never its secret, which is shown once when it is made."""

    id: int
    owner: str
    owner_uid: int
    note: str | None
    created_at: float
    expires_at: float


def _info(t: Token) -> TokenInfo:
    return TokenInfo(t.id, t.owner, t.owner_uid, t.note, t.created_at, t.expires_at)


def create_token(
    session: Session, owner: str, owner_uid: int, *, expires_at: float, note: str | None, now: float
) -> tuple[TokenInfo, str]:
    """Make a token for ``owner``; returns it and its secret (shown once, not stored)."""
    session.execute(
        delete(Token).where(Token.owner == owner, Token.expires_at < now - KEEP_EXPIRED_S)
    )
    live = session.scalar(
        select(func.count()).select_from(Token).where(Token.owner == owner, Token.expires_at > now)
    )
    if (live or 0) >= MAX_PER_ACCOUNT:
        raise TooManyTokens(
            f"{owner} holds {MAX_PER_ACCOUNT} tokens already; revoke some (`ddpq token ls`, "
            "`ddpq token revoke ID`)"
        )
    secret = "ddpq_" + secrets.token_urlsafe(32)
    token = Token(
        owner=owner,
        owner_uid=owner_uid,
        token_hash=hash_token(secret),
        note=note,
        created_at=now,
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return _info(token), secret


def by_secret(session: Session, secret: str) -> TokenInfo | None:
    """The token of this secret, if there is one, expired or not (the caller says which)."""
    token = session.scalar(select(Token).where(Token.token_hash == hash_token(secret)))
    return None if token is None else _info(token)


def by_id(session: Session, token_id: int) -> TokenInfo | None:
    token = session.get(Token, token_id)
    return None if token is None else _info(token)


def list_tokens(session: Session, owner: str | None) -> list[TokenInfo]:
    """``owner``'s tokens (everyone's with None), oldest first, expired ones included."""
    query = select(Token).order_by(Token.id)
    if owner is not None:
        query = query.where(Token.owner == owner)
    return [_info(t) for t in session.scalars(query)]


def revoke(session: Session, token_id: int) -> None:
    """Remove a token: it stops working at once."""
    session.execute(delete(Token).where(Token.id == token_id))
