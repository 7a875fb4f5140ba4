"""A thread's pass that keeps failing the same way is logged once, not once per pass."""

from __future__ import annotations

import logging

from ddpq.store.db import storage_fault


class FailureLog:
    """Logs a pass's failure when it differs from the last one logged; a pass that
    succeeds (``cleared``) lets the next failure be said again."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what  # "disk watch", "retention pass": what failed, in the line
        self.failing: str | None = None  # the failure last logged

    def failed(self, exc: Exception) -> None:
        """Say ``exc`` (a traceback only for what is not the state disk's or database's
        known trouble, which ``storage_fault`` puts in words)."""
        known = storage_fault(exc)
        why = known or f"{type(exc).__name__}: {exc}"
        if why != self.failing:
            self.log.error("%s failed: %s", self.what, why, exc_info=known is None)
        self.failing = why

    def cleared(self) -> None:
        self.failing = None
