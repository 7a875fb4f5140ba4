"""What routes are given through ``Depends``: the settings, the database, the caller.

``create_app`` keeps one ``Settings``, one ``Database`` and the notification URLs' lookups
(``NotifyLookups``) on ``app.state``; routes never reach for them any other way, so a
route's signature says what it uses.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from ddpq.config import Settings
from ddpq.core.names import UNIX_NAME
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import NAME_PATTERN, NAME_RE, NAME_RULE
from ddpq.server import identity
from ddpq.server.errors import ApiError
from ddpq.server.exhaustion import Exhausted
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.server.peer import Peer, UnknownPeer, peer_of
from ddpq.store import tokens as token_store
from ddpq.store import users as user_store
from ddpq.store.db import Database


@dataclass(frozen=True)
class Caller:
    name: str
    admin: bool
    # How the daemon knows who this is (see ``get_caller``): "socket", "user_token",
    # "account_token", "header" or "anonymous".
    via: str = "header"
    # The Unix account the caller proved to be (on the socket, or with a token that
    # account made for itself), and its uid; None otherwise.
    account: str | None = None
    uid: int | None = None
    token_id: int | None = None  # an account's own token: its id


# Where a caller found before the route (``server.token_first``) waits in the request's
# scope (``request.state``): ``get_caller`` takes it instead of looking again.
KNOWN_CALLER = "ddpq.caller"


# async: a plain def would cost every request a trip through the thread pool for a lookup.
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_notify_lookups(request: Request) -> NotifyLookups:
    lookups: NotifyLookups = request.app.state.notify_lookups
    return lookups


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_db)]
NotifyLookupsDep = Annotated[NotifyLookups, Depends(get_notify_lookups)]


async def get_caller(
    settings: SettingsDep,
    db: DatabaseDep,
    request: Request,
    x_ddpq_user: Annotated[
        str | None,
        Header(
            description="who is asking, without --auth over TCP (ignored otherwise); a user name",
            json_schema_extra={"pattern": NAME_PATTERN},
        ),
    ] = None,
) -> Caller:
    """Who is asking.

    - On the Unix socket: the account the kernel says is calling (``server.peer``), with no
      token; whatever the request says of itself (``X-Ddpq-User``, a token) changes
      nothing.
    - Over TCP with --auth: the token's user (``ddpq admin user add``), or the account that
      made the token for itself (``ddpq token create``) while it has not expired.
    - Over TCP without --auth: whoever the client says it is.

    Without --auth every caller is an admin: the daemon cannot tell TCP callers apart, so
    it enforces nothing between them (no owner checks, no priority cap). With it, admins
    are the users made with --admin, root, and the members of ``admin_group``.
    """
    known = request.scope.get("state", {}).get(KNOWN_CALLER)
    if isinstance(known, Caller):  # told apart before the body was read (server.token_first)
        return known
    peer = peer_of(request.scope)
    if peer is None and not settings.auth:
        # Answered here: a sync dependency is a trip through the thread pool, and each hop
        # waits for the interpreter lock while the worker's pass holds it (bench/RESULTS.md).
        return _header_caller(x_ddpq_user)
    # The password database and the tokens' table may block: not on the event loop.
    return await run_in_threadpool(_looked_up_caller, settings, db, request, peer)


def _header_caller(x_ddpq_user: str | None) -> Caller:
    """Over TCP without --auth: whoever the client says it is."""
    if x_ddpq_user is None:
        return Caller(name="anonymous", admin=True, via="anonymous")
    # Checked like any user name: it becomes the owner of what this caller submits.
    if not NAME_RE.match(x_ddpq_user):
        raise ApiError(422, "invalid", f"X-Ddpq-User: {NAME_RULE}")
    return Caller(name=x_ddpq_user, admin=True, via="header")


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (any case of "Bearer");
    None for any other header."""
    scheme, _, token = header.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def _looked_up_caller(
    settings: Settings, db: Database, request: Request, peer: Peer | None
) -> Caller:
    """On the Unix socket, or over TCP with --auth (a token)."""
    if peer is not None:
        return _socket_caller(settings, peer)
    return token_caller(settings, db, request.headers.get("authorization", ""))


def token_caller(settings: Settings, db: Database, authorization: str) -> Caller:
    """Over TCP with --auth: the caller its ``Authorization`` header's token names; raises
    ApiError (401) for none, an unknown one or an expired one."""
    token = bearer_token(authorization)
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            "this daemon needs a token: set DDPQ_TOKEN (on the server itself, the Unix "
            "socket needs none)",
        )
    now = time.time()
    with db.read() as s:
        user = user_store.by_token(s, token.strip())
        if user is not None:
            return Caller(name=user.name, admin=user.is_admin, via="user_token")
        own = token_store.by_secret(s, token.strip())
    if own is None:
        raise ApiError(401, "unauthorized", "unknown token")
    if own.expires_at <= now:
        raise ApiError(401, "unauthorized", f"token {own.id} expired; make another")
    account = identity.account_named(own.owner, own.owner_uid)
    if account is None:
        raise ApiError(
            401, "unauthorized", f"token {own.id}: its account {own.owner} no longer exists"
        )
    return Caller(
        name=account.name,
        admin=identity.is_admin(account, settings.admin_group),
        via="account_token",
        account=account.name,
        uid=account.uid,
        token_id=own.id,
    )


def _socket_caller(settings: Settings, peer: Peer) -> Caller:
    if isinstance(peer, UnknownPeer):
        if peer.exhausted:  # the daemon's condition, not the caller's: 503 (server.faults)
            raise Exhausted(peer.why)
        raise ApiError(403, "forbidden", f"the Unix socket's caller is unknown: {peer.why}")
    try:
        account = identity.account_of_uid(peer.uid)
    except identity.NotAnAccount as exc:
        raise ApiError(403, "forbidden", f"{exc}: ddpq cannot tell whose jobs these are") from None
    # Without --auth, TCP callers are all admins: no less on the socket.
    admin = not settings.auth or identity.is_admin(account, settings.admin_group)
    return Caller(account.name, admin, via="socket", account=account.name, uid=account.uid)


Auth = Annotated[Caller, Depends(get_caller)]


def proven_account(who: Caller, settings: Settings) -> str | None:
    """The Unix account this caller's jobs run as because the request proved it (stored
    as ``jobs.run_as``), or None: the owner's mapping (``ddpq admin user map``) applies.

    The socket's caller is its account. An account's own token over TCP is too, but only
    where the admin allows it (``remote_accounts``): a token that leaked would otherwise
    run programs as its account from anywhere the API is reachable.
    """
    if who.via == "socket" or (who.via == "account_token" and settings.remote_accounts):
        if settings.auth and who.account is not None and not UNIX_NAME.match(who.account):
            # The launch switches only to portable names (executors.accounts): say so now.
            raise ApiError(
                403,
                "forbidden",
                f"account {who.account!r}: jobs run only as accounts with portable names "
                "(lower-case letters, digits, '_', '-'); ask the admin for a ddpq user",
            )
        if (why := slurm_refusal(who, settings)) is not None:
            raise ApiError(403, "forbidden", why)
        return who.account
    if who.via != "account_token":
        return None
    if settings.auth and not settings.shared_account:
        raise ApiError(
            403,
            "forbidden",
            f"a token {who.name} made for themselves runs no job over TCP on this daemon "
            "(the admin may allow it: remote_accounts = true); submit on the server "
            "itself, where the Unix socket knows you",
        )
    return None  # every job runs as the daemon's one account anyway


def slurm_refusal(who: Caller, settings: Settings) -> str | None:
    """Why the Slurm executor would not run this proven account's jobs, or None.

    A root daemon submits a job to Slurm as the account it runs as (``sbatch`` as that
    user, executors/slurm/submit.py), and never as root: Slurm would run it as root on
    every node. Root's own account, known from the socket, is refused here at submission
    rather than failing at launch.
    """
    switches = settings.auth and os.geteuid() == 0  # else the daemon's account submits all
    if not capabilities(settings.executor).runs_jobs_as_root and switches and who.uid == 0:
        return (
            f"account {who.account or 'root'} (uid 0): ddpq never submits a Slurm job as "
            "root; submit as your own account (e.g. `runuser -u NAME -- ddpq submit ...`)"
        )
    return None


def may_touch(who: Caller, owner: str, job_id: int) -> None:
    """Refuse a user another user's job. Admins may touch any, and without --auth every
    caller is one (see ``get_caller``), so this enforces nothing there."""
    if not who.admin and who.name != owner:
        raise ApiError(403, "forbidden", f"job {job_id} belongs to {owner}, not {who.name}")
