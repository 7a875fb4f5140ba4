"""Which Unix account a job runs as."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from ddpq.core.names import UNIX_NAME


class NoAccount(LookupError):
    pass


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def account_for(owner: str, mapped: str | None) -> Account | None:
    """The Unix account a job runs as; None means "as the daemon itself".

    Only a root daemon can switch users. Then a job runs as the account its owner
    is explicitly mapped to (``ddpq admin user add NAME --unix-user ACCOUNT``), and
    never as one that merely shares the owner's name: a ddpq user called ``root``
    or ``daemon`` gets no system account by accident.
    """
    if os.geteuid() != 0:
        return None
    if mapped is None or not UNIX_NAME.match(mapped):
        raise NoAccount(
            f"owner {owner!r} is mapped to no Unix account on this host; map one with "
            f"`ddpq admin user map {owner} ACCOUNT`"
        )
    try:
        entry = pwd.getpwnam(mapped)
    except KeyError:
        raise NoAccount(
            f"owner {owner!r} is mapped to Unix account {mapped!r}, which does not exist here"
        ) from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
