"""Users and their bearer tokens. Tokens are stored as SHA-256 hashes only.

Tokens are 32 random bytes, so a fast hash is enough: there is nothing to
brute-force the way there is with a human-chosen password.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

# Re-exported: the admin commands check account names with it too.
from ddpq.core.names import UNIX_NAME as UNIX_NAME
from ddpq.store.columns import flushed
from ddpq.store.models import User


class UserExists(ValueError):
    pass


def check_unix_name(name: str) -> str:
    if not UNIX_NAME.match(name):
        raise ValueError(f"{name!r} is not a Unix account name")
    return name


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_user(
    session: Session, name: str, *, admin: bool, unix_user: str | None, now: float
) -> tuple[User, str]:
    """Create a user; returns the user and the token, which is shown once and not stored."""
    if session.scalar(select(User).where(User.name == name)) is not None:
        raise UserExists(f"user {name!r} exists already")
    if unix_user is not None:
        check_unix_name(unix_user)
    token = "ddpq_" + secrets.token_urlsafe(32)
    user = User(
        name=name, token_hash=hash_token(token), is_admin=admin, unix_user=unix_user, created_at=now
    )
    session.add(user)
    session.flush()
    return user, token


def by_token(session: Session, token: str) -> User | None:
    return session.scalar(select(User).where(User.token_hash == hash_token(token)))


def by_name(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def unix_accounts(session: Session, names: set[str]) -> dict[str, str]:
    """name -> mapped Unix account, for the users among ``names`` that have one."""
    if not names:
        return {}
    return {
        name: unix
        for name, unix in flushed(session).execute(_MAPPED, {"names": list(names)})
        if unix
    }


_MAPPED = select(User.name, User.unix_user).where(  # built once: every pass that starts jobs
    User.name.in_(bindparam("names", expanding=True)), User.unix_user.is_not(None)
)


def map_unix_user(session: Session, name: str, unix_user: str | None) -> None:
    """Set (or with None, clear) the Unix account a user's jobs run as."""
    user = by_name(session, name)
    if user is None:
        raise LookupError(f"no user {name!r}")
    user.unix_user = None if unix_user is None else check_unix_name(unix_user)


def all_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.name)))


def remove_user(session: Session, name: str) -> None:
    user = by_name(session, name)
    if user is None:
        raise LookupError(f"no user {name!r}")
    session.delete(user)
