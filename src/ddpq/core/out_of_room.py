"""Whether an error says a write found no room: the disk full, or the account's quota.

The shim keeps its own copy (it imports nothing of ddpq); everything else asks here."""

from __future__ import annotations

import errno
from typing import TypeGuard

NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def out_of_room(exc: BaseException) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in NO_ROOM
