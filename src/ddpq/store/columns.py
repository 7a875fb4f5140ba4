"""Reads of plain columns on a session's connection, past the ORM's layer.

``Session.execute`` runs a statement that names ORM attributes through the ORM's own
machinery (its compile state, its result wrapping) even when it reads columns only, no
objects: about a third of such a read's CPU here (bench/statement_cost.py), and the
worker's pass makes a dozen of them. ``flushed(session).execute(...)`` runs the same
statement on the session's connection instead, after flushing what the session holds
unwritten, as the session's autoflush would: the read still sees the transaction's own
changes.
"""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.orm import Session


def flushed(session: Session) -> Connection:
    """``session``'s connection, in its transaction, once its pending changes are written."""
    if session.autoflush:  # not inside a ``no_autoflush`` block, which asked otherwise
        session.flush()  # nothing to do, and cheap, when nothing is pending
    return session.connection()
