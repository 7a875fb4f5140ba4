"""Names that reach the operating system or cross the API, checked the same way everywhere.

Standard library only: the CLI checks its user name with ``NAME_RE`` before it sends it, and
must not import pydantic (``ddpq.schemas``) to do so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# A portable Unix account name (POSIX, plus the trailing '$' of machine accounts).
UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?\Z")

# A ddpq user or job name. The pattern as JSON Schema (ECMA) writes it, for the OpenAPI
# document; the compiled one ends with \Z, because Python's `$` also matches before a
# trailing newline ("alice\n").
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RE = re.compile(NAME_PATTERN.removesuffix("$") + r"\Z")
NAME_RULE = "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"

# Where the daemon listens unless told otherwise, and so where a client looks for it: the
# daemon's settings and the client's default URL both read it here.
DEFAULT_API_ADDRESS: tuple[str, int] = ("127.0.0.1", 8765)

# The daemon's Unix socket: ``SOCKET_FILE`` in its state folder unless its settings name
# another path (the systemd unit: ``SYSTEM_SOCKET``), and where a client on the same machine
# looks for one before it falls back to ``DEFAULT_API_ADDRESS``.
SOCKET_FILE = "ddpq.sock"
SYSTEM_SOCKET = "/run/ddpq/ddpq.sock"
# sockaddr_un holds 108 bytes, the last a NUL: a longer path cannot be bound or reached.
MAX_SOCKET_PATH = 107


def state_folder(environ: Mapping[str, str], user_home: str) -> str:
    """The state folder a daemon started by this user uses unless told otherwise:
    $DDPQ_HOME, else $XDG_STATE_HOME/ddpq, else ~/.local/state/ddpq. One rule for the
    daemon's default and for where the client looks for its socket."""
    if environ.get("DDPQ_HOME"):
        return os.path.expanduser(environ["DDPQ_HOME"])
    state = environ.get("XDG_STATE_HOME") or os.path.join(user_home, ".local", "state")
    return os.path.join(state, "ddpq")
