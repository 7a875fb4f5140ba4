"""The notifier: a thread beside the worker that POSTs each ended job's message to its URL.

Apart from the worker's pass, so a slow or dead receiver never delays scheduling: it reads
which ended jobs still owe a message (``store.notifications``), sends them from a few
threads of its own, each attempt bounded in time, and records every attempt. What to send
and when to try again is ``core.notify``'s. The URL may carry a webhook's secret: it is
never logged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ddpq.config import Settings
from ddpq.core.notify import delivered, message, next_attempt_at
from ddpq.daemon import webhook
from ddpq.store import notifications as notification_store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.notify")

POLL_S = 1.0
SENDERS = 4  # deliveries in flight at once: a receiver that hangs holds one of them


class Notifier:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.db = Database(settings.db_path, durable=False)
        self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="ddpq-notify")
        self._in_flight: set[int] = set()
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
            owed = notification_store.owed(s)
        now = self.clock()
        started = 0
        for item in owed:
            due = next_attempt_at(item.attempts, item.last_at, self.settings.notify_retry_s)
            with self._lock:
                if item.job.job_id in self._in_flight or due is None or due > now:
                    continue
                self._in_flight.add(item.job.job_id)
            self._pool.submit(self._deliver, item)
            started += 1
        return started

    def _deliver(self, item: notification_store.Owed) -> None:
        job_id = item.job.job_id
        try:
            status, error = self._post(item)
            attempt, at = item.attempts + 1, self.clock()
            done = delivered(status)
            last = next_attempt_at(attempt, at, self.settings.notify_retry_s) is None
            with self.db.write() as s:
                notification_store.record_attempt(
                    s, job_id, attempt, at, status, error, settled=done or last
                )
            if done:
                log.info("job %s: notification delivered (HTTP %s)", job_id, status)
            else:
                outcome = "given up" if last else "will be tried again"
                log.info("job %s: notification attempt %d: %s; %s", job_id, attempt, error, outcome)
        except Exception:  # the database: this attempt is tried again, unrecorded
            log.exception("job %s: could not record a notification attempt", job_id)
        finally:
            with self._lock:
                self._in_flight.discard(job_id)

    def _post(self, item: notification_store.Owed) -> tuple[int | None, str]:
        try:
            status, error = webhook.post(
                item.url,
                json.dumps(message(item.job)).encode(),
                timeout=self.settings.notify_timeout_s,
                allow_loopback=self.settings.notify_allow_loopback,
            )
        except Exception as exc:  # recorded as a failed attempt, so it cannot loop forever
            log.exception("job %s: notification failed unexpectedly", item.job.job_id)
            return None, f"internal error: {type(exc).__name__}"
        if status is not None and not delivered(status):
            error = f"HTTP {status}"
        return status, error
