"""Whether a job could enter its working directory (or find a file), judged at submission.

A root daemon must not tell a user which paths exist where they cannot look (a 0700
folder of someone else's): it judges the path as the job's own Unix account would reach
it, walking every component with the account's uid and groups, and answers the same
whether the path is missing or merely out of reach. This is a courtesy check, so a typo
fails at once instead of at launch; the launch, which enters the directory after dropping
privileges, stays the authority (a POSIX ACL, which the walk does not evaluate, is left
to it).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections import deque
from dataclasses import dataclass

from ddpq.server import identity

# Linux gives up after 40 links in one lookup (ELOOP); so does the walk.
MAX_LINKS = 40
ACL_XATTR = "system.posix_acl_access"


@dataclass(frozen=True)
class Account:
    uid: int
    gids: frozenset[int]


def account(name: str) -> Account | None:
    """The Unix account ``name`` with all its groups, or None if there is no such account."""
    pw = identity.look_up(lambda: pwd.getpwnam(name))
    if pw is None:
        return None
    groups = identity.look_up(lambda: os.getgrouplist(name, pw.pw_gid)) or []
    # The groups a login (and the launch's initgroups) would give it.
    return Account(pw.pw_uid, frozenset({pw.pw_gid, *groups}))


def _searchable(path: str, info: os.stat_result, who: Account) -> bool:
    """May ``who`` pass through (search) the directory ``path``, by its mode bits?"""
    if who.uid == 0:
        return True
    if _has_acl(path):
        return True  # not judged here: the launch as the account decides
    if info.st_uid == who.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid in who.gids:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, ACL_XATTR)
    except OSError:
        return False
    return True


def can_enter(path: str, who: Account) -> bool:
    """Could ``who`` make the absolute ``path`` its working directory?

    The walk resolves the path as the kernel would for that account: it needs search
    permission on every directory it passes, including those a symbolic link leads
    through, and on the last one. Every failure (missing, not a directory, out of reach,
    a link loop) is the same False.
    """
    found = _resolve(path, who)
    return found is not None and stat.S_ISDIR(found[1].st_mode) and _searchable(*found, who)


def sees_file(path: str, who: Account) -> bool:
    """Could ``who`` find a regular file at the absolute ``path``: every folder on the way
    searchable by it, links resolved as it would (a link from a folder of its own into a
    0700 one of someone else's leads nowhere, as it would for the account)."""
    found = _resolve(path, who)
    return found is not None and stat.S_ISREG(found[1].st_mode)


def _resolve(path: str, who: Account) -> tuple[str, os.stat_result] | None:
    """What ``path`` leads ``who`` to, with no link left in it, and its status; None where
    the walk fails for that account (missing, out of reach, too many links)."""
    parts = deque(path.split("/"))
    current = "/"
    links = 0
    while parts:
        part = parts.popleft()
        if part in ("", "."):
            continue
        try:
            here = os.stat(current)
        except OSError:
            return None
        if not stat.S_ISDIR(here.st_mode) or not _searchable(current, here, who):
            return None
        if part == "..":
            current = os.path.dirname(current)  # `current` never holds a link: exact
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                return None
            try:
                target = os.readlink(candidate)
            except OSError:
                return None
            if target.startswith("/"):
                current = "/"
            parts.extendleft(reversed(target.split("/")))
            continue
        current = candidate
    try:
        return current, os.stat(current)
    except OSError:
        return None


def daemon_can_enter(path: str) -> bool:
    """The same question for the daemon's own account, which the kernel answers exactly."""
    return os.path.isdir(path) and os.access(path, os.X_OK)
