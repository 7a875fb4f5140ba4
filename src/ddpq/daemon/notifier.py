"""The notifier: a thread beside the worker that POSTs each ended job's message, and each
ended sweep's one message, to its URL.

Apart from the worker's pass, so a slow or dead receiver never delays scheduling: it reads
which ended jobs and sweeps still owe a message (``store.notifications``), sends them from
a few threads of its own, each attempt bounded in time, and records every attempt. What to
send and when to try again is ``core.notify``'s. The URL may carry a webhook's secret: it
is never logged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from ddpq.config import Settings
from ddpq.core.notify import Ended, delivered, message, next_attempt_at, sweep_message
from ddpq.daemon import webhook
from ddpq.store import notifications as notification_store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.notify")

POLL_S = 1.0
SENDERS = 4  # deliveries in flight at once: a receiver that hangs holds one of them


@dataclass(frozen=True)
class Due:
    """A message owed: of a job (its facts in hand) or of a sweep (read when sent)."""

    kind: Literal["job", "sweep"]
    id: int
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
        self._in_flight: set[tuple[str, int]] = set()
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
        """Start every attempt that is due; how many were started."""
        with self.db.read() as s:
            owed = [
                Due("job", o.job.job_id, o.url, o.attempts, o.last_at, o.job)
                for o in notification_store.owed(s)
            ] + [
                Due("sweep", o.sweep_id, o.url, o.attempts, o.last_at)
                for o in notification_store.owed_sweeps(s)
            ]
        now = self.clock()
        started = 0
        for item in owed:
            due = next_attempt_at(item.attempts, item.last_at, self.settings.notify_retry_s)
            with self._lock:
                if (item.kind, item.id) in self._in_flight or due is None or due > now:
                    continue
                self._in_flight.add((item.kind, item.id))
            self._pool.submit(self._deliver, item)
            started += 1
        return started

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
            if done:
                log.info("%s: notification delivered (HTTP %s)", item, status)
            else:
                outcome = "given up" if last else "will be tried again"
                log.info("%s: notification attempt %d: %s; %s", item, attempt, error, outcome)
        except Exception:  # the database: this attempt is tried again, unrecorded
            log.exception("%s: could not record a notification attempt", item)
        finally:
            with self._lock:
                self._in_flight.discard((item.kind, item.id))

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
