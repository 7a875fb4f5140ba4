"""Whether a database file is already at the newest schema, known without Alembic.

Every start of ``ddpq serve`` (and of each test daemon) used to hand the file to Alembic,
which imports every migration script to find the newest revision: about a second of CPU on
a 2-core box, for a file that is almost always at the head already. The revisions and their
parents are plain assignments at the top of each script, so reading the scripts' text
finds the head in milliseconds. Anything unusual (no scripts, two heads, a file without a
version table, an older or unknown revision) answers "not known current", and the caller
runs Alembic as before: this is a shortcut for the common case, never a second migrator.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
from pathlib import Path

_ASSIGNMENT = re.compile(
    r"^(?P<name>revision|down_revision)\s*(?::[^=\n]+)?=\s*(?P<value>.+)$", re.MULTILINE
)
_QUOTED = re.compile(r"""["']([^"']+)["']""")


@functools.cache
def head_revision(versions_dir: Path) -> str | None:
    """The one revision no script names as its parent, or None when that is not clear."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in versions_dir.glob("*.py"):
        found = {m["name"]: m["value"] for m in _ASSIGNMENT.finditer(script.read_text())}
        own = _QUOTED.findall(found.get("revision", ""))
        if len(own) != 1:
            return None  # a script this reader does not understand: let Alembic decide
        revisions.add(own[0])
        parents.update(_QUOTED.findall(found.get("down_revision", "")))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def stamped_revision(path: Path) -> str | None:
    """The revision Alembic recorded in the file, or None (no file, no table, no row)."""
    if not path.exists():
        return None
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"  # read-only: never creates the file
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as conn:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


def is_current(path: Path, versions_dir: Path) -> bool:
    head = head_revision(versions_dir)
    return head is not None and stamped_revision(path) == head
