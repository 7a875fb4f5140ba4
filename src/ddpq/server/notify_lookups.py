"""A notification URL's check at submission, bounded so that no caller's slow resolver
holds the API.

The check is a courtesy (each delivery checks the URL again, and refuses with the reason
recorded): it tells a user now that a URL leads nowhere allowed, or names nothing. A name's
lookup runs on a thread of its own, and the request waits for it at most
``SUBMISSION_WAIT_S`` (the resolver's own timeouts can add up to half a minute). A lookup
that outlives its wait still counts until it ends: at most ``PER_CALLER`` of a caller's and
``IN_ALL`` of everyone's at once, so a caller who submits names that never answer holds a
few threads of the server's pool for a moment each, never the pool. Beyond those bounds, or
when the answer does not come in time, the URL is taken unchecked: refusing it (or
answering 429) would fail a user whose resolver is merely slow, and gains nothing that
delivery does not check anyway. Only a definite answer refuses: addresses no notification
may go to, or a name that does not exist.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from ddpq import notify_target

log = logging.getLogger("ddpq.notify")

SUBMISSION_WAIT_S = 2.0  # or the daemon's notify_timeout_s, if that is shorter
PER_CALLER = 2
IN_ALL = 8


class NotifyLookups:
    """The lookups under way for submissions' checks: at most ``per_caller`` for each
    caller and ``in_all`` in all, each counted until its thread ends."""

    def __init__(self, *, per_caller: int = PER_CALLER, in_all: int = IN_ALL) -> None:
        self.per_caller = per_caller
        self.in_all = in_all
        self._lock = threading.Lock()
        self._by_caller: Counter[str] = Counter()

    def check(self, url: str, caller: str, *, allow_loopback: bool, timeout: float) -> bool:
        """Whether ``url`` was checked (False: taken unchecked, and logged so, since no
        answer came in time or no lookup could start). Refused (why) where it may not go."""
        wait = min(SUBMISSION_WAIT_S, timeout)

        def lookup(host: str, port: int, _: float) -> list[tuple[Any, ...]]:
            if not self._enter(caller):
                raise notify_target.Unanswered(f"cannot resolve {host} now: lookups all busy")
            return notify_target.resolve(host, port, wait, finished=lambda: self._leave(caller))

        try:
            notify_target.url_destinations(
                url, allow_loopback=allow_loopback, timeout=wait, lookup=lookup
            )
        except notify_target.Unanswered as exc:  # not where it leads: each delivery checks
            log.info("a notification URL of %s taken unchecked at submission: %s", caller, exc)
            return False
        return True

    def in_flight(self, caller: str | None = None) -> int:
        """Lookups under way: the caller's, or everyone's."""
        with self._lock:
            return self._by_caller[caller] if caller is not None else self._by_caller.total()

    def _enter(self, caller: str) -> bool:
        with self._lock:
            if self._by_caller[caller] >= self.per_caller:
                return False
            if self._by_caller.total() >= self.in_all:
                return False
            self._by_caller[caller] += 1
            return True

    def _leave(self, caller: str) -> None:
        with self._lock:
            self._by_caller[caller] -= 1
            if self._by_caller[caller] <= 0:
                del self._by_caller[caller]
