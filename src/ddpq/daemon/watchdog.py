"""A daemon whose worker has died does not stay up; and the descriptors the daemon may hold.

The worker is a thread of the daemon (of ``ddpq serve``'s child process, whose end stops
the API in turn: ``daemon.halves``). Were it to die alone, the process would go on
answering the API while nothing is ever scheduled again, and a service manager
(``Restart=on-failure``) would never see a failure. So the thread's death, whatever its
cause, is logged with its traceback and ends the daemon: the API stops (without waiting
for streaming clients) and ``ddpq serve`` exits with status 1, which the unit restarts.
Running jobs are not touched: the next daemon re-adopts them.
"""

from __future__ import annotations

import logging
import resource
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("ddpq")

NR_OPEN = "/proc/sys/fs/nr_open"  # the kernel's ceiling where the hard limit is unlimited
FALLBACK_NR_OPEN = 1 << 20  # Linux's default nr_open


class WorkerDied(Exception):
    """The worker thread ended without being asked to; the message says how."""


class Stoppable(Protocol):
    """What of ``uvicorn.Server`` stopping it needs (it reads both flags on each tick)."""

    should_exit: bool
    force_exit: bool


class Shutdown:
    """How a thread that must not die alone stops the daemon's main thread: the API server
    it serves with (``attach``), or the wait of a daemon without one (``event``)."""

    def __init__(self) -> None:
        self.event = threading.Event()  # set on any stop: a signal, or a death
        self.died: str | None = None  # why the daemon failed, once it has
        self.stopping = False  # the daemon asked its threads to stop: an end is no death
        self._lock = threading.Lock()
        self._server: Stoppable | None = None

    def attach(self, server: Stoppable) -> None:
        with self._lock:
            self._server = server
            if self.died is not None:
                self._stop_server()
            elif self.event.is_set():
                server.should_exit = True

    def stop(self) -> None:
        """Stop as a SIGTERM would (``serve``'s worker half stopped by one): no failure."""
        with self._lock:
            self.event.set()
            if self._server is not None:
                self._server.should_exit = True

    def fail(self, why: str) -> None:
        with self._lock:
            if self.died is None:
                self.died = why
            self.event.set()
            self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            # Now, not once every `logs -f` client hung up: nothing is scheduled meanwhile.
            self._server.should_exit = True
            self._server.force_exit = True


def watched(name: str, run: Callable[[], None], shutdown: Shutdown) -> Callable[[], None]:
    """``run`` for a thread whose end, unless the daemon asked for it, is the daemon's."""

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            why = f"the {name} died ({type(exc).__name__}: {exc})"
            log.critical("%s; stopping the daemon (exit status 1)", why, exc_info=True)
            shutdown.fail(why)
            return
        if not shutdown.stopping:
            why = f"the {name} stopped without being asked to"
            log.critical("%s; stopping the daemon (exit status 1)", why)
            shutdown.fail(why)

    return target


def raise_open_files_limit(*, say: bool = True) -> int:
    """Raise the soft limit on open files to the hard one and say so (``say``: ``serve``'s
    two processes raise it each, one says it); the limit now.

    The worker holds a descriptor per running job (its shim's pidfd), the API one per
    connection: systemd's default soft limit, 1024, runs out at about a thousand jobs.
    The hard limit is the admin's (``LimitNOFILE=``); raising to it needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    level, now = logging.INFO, soft
    if soft == resource.RLIM_INFINITY or soft >= target:
        message = f"open files: at most {soft}"
    else:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            level = logging.WARNING
            message = f"open files: at most {soft} (cannot raise it to {target}: {exc})"
        else:
            now = target
            message = f"open files: at most {target} (the hard limit; the soft limit was {soft})"
    if say:
        log.log(level, "%s", message)
    return now


def _nr_open() -> int:
    try:
        with open(NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return FALLBACK_NR_OPEN
