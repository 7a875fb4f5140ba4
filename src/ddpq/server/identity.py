"""Local callers: the Unix account behind a uid, and whether it is one of ddpq's admins.

On the Unix socket the kernel says which uid is calling (``server.peer``); a token an
account made for itself says which account and uid it was. Either way the caller is that
account, named as the password database names it, and an admin if it is root, the
daemon's own account, or a member of the configured admin group (``admin_group``):
membership as a login would get it (``getgrouplist``: /etc/group, or LDAP through NSS),
read at each request, so adding someone to the group or removing them counts at once.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from ddpq.core.names import NAME_RE, NAME_RULE


class NotAnAccount(LookupError):
    """The uid has no name ddpq can use; the message says why."""


@dataclass(frozen=True)
class LocalAccount:
    name: str
    uid: int
    gid: int  # its primary group, from the password database


def account_of_uid(uid: int) -> LocalAccount:
    """The account of ``uid``, or ``NotAnAccount``: the uid has no entry in the password
    database (a container's), or its name is none that ddpq can own jobs under."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise NotAnAccount(f"uid {uid} has no account on this machine") from None
    if not NAME_RE.match(entry.pw_name):
        raise NotAnAccount(f"account {entry.pw_name!r} (uid {uid}): a ddpq user name {NAME_RULE}")
    return LocalAccount(entry.pw_name, entry.pw_uid, entry.pw_gid)


def account_named(name: str, uid: int) -> LocalAccount | None:
    """The account ``name`` if it is still that of ``uid``; None if it was removed, or
    another account was made under its name since."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid != uid:
        return None
    return LocalAccount(entry.pw_name, entry.pw_uid, entry.pw_gid)


def is_admin(account: LocalAccount, admin_group: str | None) -> bool:
    if account.uid in (0, os.geteuid()):
        return True
    if admin_group is None:
        return False
    try:
        gid = grp.getgrnam(admin_group).gr_gid
    except KeyError:
        return False  # no such group: no admins but root (the daemon says so at start)
    return gid in os.getgrouplist(account.name, account.gid)


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True
