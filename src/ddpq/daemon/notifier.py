"""The notifier: a thread beside the worker that POSTs each ended job's message, and each
ended sweep's one message, to its URL.

Apart from the worker's pass, so a slow or dead receiver never delays scheduling: it reads
which ended jobs and sweeps still owe a message (``store.notifications``), sends them from
a few threads of its own, each attempt bounded in time as a whole, and records every
attempt. The senders are shared fairly: an owner has at most ``core.notify.PER_OWNER``
messages in flight, so one user's receivers that hang or drip hold at most that many of
them, and the others' messages go meanwhile. What to send, when to try again and which
message goes first is ``core.notify``'s. The URL may carry a webhook's secret: it is never
logged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from ddpq.config import Settings
from ddpq.core.notify import (
    Ended,
    delivered,
    message,
    next_attempt_at,
    sweep_message,
    take_fairly,
)
from ddpq.daemon import webhook
from ddpq.store import notifications as notification_store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.notify")

POLL_S = 1.0
SENDERS = 4  # deliveries in flight at once, all owners together


@dataclass(frozen=True)
class Due:
    """A message owed: of a job (its facts in hand) or of a sweep (read when sent)."""

    kind: Literal["job", "sweep"]
    id: int
    owner: str
    url: str
    attempts: int
    last_at: float | None
    job: Ended | None = None

    def __str__(self) -> str:
        return f"job {self.id}" if self.kind == "job" else f"sweep s{self.id}"


class Notifier:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.db = Database(settings.db_path, durable=False)
        self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="ddpq-notify")
        self._in_flight: dict[tuple[str, int], str] = {}  # (kind, id): its owner
        # (kind, id): the attempts recorded so far, so that a pass which read the store
        # before an attempt was recorded does not start that attempt again.
        self._recorded: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.send_due()
            except Exception:  # a storage fault: logged, and tried again next second
                log.exception("notifier: could not read the notifications owed")

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.db.dispose()

    def send_due(self) -> int:
        """Start the attempts that are due, as far as senders are free and each owner's
        share allows (the longest due first); how many were started."""
        with self.db.read() as s:
            owed = [
                Due("job", o.job.job_id, o.job.owner, o.url, o.attempts, o.last_at, o.job)
                for o in notification_store.owed(s)
            ] + [
                Due("sweep", o.sweep_id, o.owner, o.url, o.attempts, o.last_at)
                for o in notification_store.owed_sweeps(s)
            ]
        now = self.clock()
        due = []
        for item in owed:
            at = next_attempt_at(item.attempts, item.last_at, self.settings.notify_retry_s)
            if at is not None and at <= now:
                due.append((at, item))
        due.sort(key=lambda at_item: at_item[0])
        with self._lock:
            owed_keys = {(item.kind, item.id) for item in owed}
            self._recorded = {k: n for k, n in self._recorded.items() if k in owed_keys}
            waiting = [
                item
                for _, item in due
                if (item.kind, item.id) not in self._in_flight
                and item.attempts >= self._recorded.get((item.kind, item.id), 0)
            ]
            busy = Counter(self._in_flight.values())
            chosen = take_fairly(waiting, _owner_of, busy, SENDERS - len(self._in_flight))
            for item in chosen:
                self._in_flight[(item.kind, item.id)] = item.owner
        for item in chosen:
            self._pool.submit(self._deliver, item)
        return len(chosen)

    def _deliver(self, item: Due) -> None:
        try:
            status, error = self._post(item)
            attempt, at = item.attempts + 1, self.clock()
            done = delivered(status)
            last = next_attempt_at(attempt, at, self.settings.notify_retry_s) is None
            with self.db.write() as s:
                notification_store.record_attempt(
                    s, item.kind, item.id, attempt, at, status, error, settled=done or last
                )
            with self._lock:
                self._recorded[(item.kind, item.id)] = attempt
            if done:
                log.info("%s: notification delivered (HTTP %s)", item, status)
            else:
                outcome = "given up" if last else "will be tried again"
                log.info("%s: notification attempt %d: %s; %s", item, attempt, error, outcome)
        except Exception:  # the database: this attempt is tried again, unrecorded
            log.exception("%s: could not record a notification attempt", item)
        finally:
            with self._lock:
                self._in_flight.pop((item.kind, item.id), None)

    def _message(self, item: Due) -> dict[str, Any]:
        if item.job is not None:
            return message(item.job)
        # A sweep's members are read only now, when an attempt is due (there may be 10,000).
        with self.db.read() as s:
            return sweep_message(notification_store.sweep_ended(s, item.id))

    def _post(self, item: Due) -> tuple[int | None, str]:
        try:
            status, error = webhook.post(
                item.url,
                json.dumps(self._message(item)).encode(),
                timeout=self.settings.notify_timeout_s,
                allow_loopback=self.settings.notify_allow_loopback,
            )
        except Exception as exc:  # recorded as a failed attempt, so it cannot loop forever
            log.exception("%s: notification failed unexpectedly", item)
            return None, f"internal error: {type(exc).__name__}"
        if status is not None and not delivered(status):
            error = f"HTTP {status}"
        return status, error


def _owner_of(item: Due) -> str:
    return item.owner
