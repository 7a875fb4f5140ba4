"""Local callers: the Unix account behind a uid, and whether it is one of ddpq's admins.

On the Unix socket the kernel says which uid is calling (``server.peer``); a token an
account made for itself says which account and uid it was. Either way the caller is that
account, named as the password database names it, and an admin if it is root, the
daemon's own account, or a member of the configured admin group (``admin_group``):
membership as a login would get it (``getgrouplist``: /etc/group, or LDAP through NSS),
read at each request, so adding someone to the group or removing them counts at once.

Every lookup goes through ``look_up``: "no such entry" is believed only while the daemon
can open a file, so running out of descriptors is a 503 (``server.exhaustion``), never a
caller told they have no account.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ddpq.core.names import NAME_RE, NAME_RULE
from ddpq.server import exhaustion

T = TypeVar("T")


class NotAnAccount(LookupError):
    """The uid has no name ddpq can use; the message says why."""


@dataclass(frozen=True)
class LocalAccount:
    name: str
    uid: int
    gid: int  # its primary group, from the password database


def look_up(find: Callable[[], T]) -> T | None:
    """``find()``, an entry of the account or group database; None where it has none.

    ``Exhausted`` instead when "none" may only mean that the database could not be read
    (see ``server.exhaustion``), or the lookup itself ran out of descriptors or memory.
    """
    try:
        return find()
    except KeyError:
        exhaustion.check()
        return None
    except (OSError, MemoryError) as exc:
        cause = exhaustion.cause_of(exc)
        if cause is None:
            raise
        raise exhaustion.Exhausted(cause) from exc


def account_of_uid(uid: int) -> LocalAccount:
    """The account of ``uid``, or ``NotAnAccount``: the uid has no entry in the password
    database (a container's), or its name is none that ddpq can own jobs under."""
    entry = look_up(lambda: pwd.getpwuid(uid))
    if entry is None:
        raise NotAnAccount(f"uid {uid} has no account on this machine")
    if not NAME_RE.match(entry.pw_name):
        raise NotAnAccount(f"account {entry.pw_name!r} (uid {uid}): a ddpq user name {NAME_RULE}")
    return LocalAccount(entry.pw_name, entry.pw_uid, entry.pw_gid)


def account_named(name: str, uid: int) -> LocalAccount | None:
    """The account ``name`` if it is still that of ``uid``; None if it was removed, or
    another account was made under its name since."""
    entry = look_up(lambda: pwd.getpwnam(name))
    if entry is None or entry.pw_uid != uid:
        return None
    return LocalAccount(entry.pw_name, entry.pw_uid, entry.pw_gid)


def is_admin(account: LocalAccount, admin_group: str | None) -> bool:
    if account.uid in (0, os.geteuid()):
        return True
    if admin_group is None:
        return False
    group = look_up(lambda: grp.getgrnam(admin_group))
    if group is None:
        return False  # no such group: no admins but root (the daemon says so at start)
    groups = look_up(lambda: os.getgrouplist(account.name, account.gid)) or []
    if group.gr_gid in groups:
        return True
    # glibc answers with what it could read: short of descriptors, the primary group alone.
    exhaustion.check()
    return False


def group_exists(name: str) -> bool:
    return look_up(lambda: grp.getgrnam(name)) is not None
