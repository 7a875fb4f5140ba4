"""Clients that stay through a daemon restart: `ddpq logs -f`, `ddpq watch`, `ddpq attach`.

Jobs run on through a restart of the daemon (the new worker adopts them), so a command
that follows one should not end with it. ``Staying`` retries a call that found the daemon
unreachable (``Unreachable``, exit 3) until the daemon answers again, for at most
``RECONNECT_S``; it says so in one line when the daemon goes ("daemon restarting;
reconnecting...") and in one when it is back ("reconnected"), then the command goes on
where it was. Only a daemon that answered once is waited for: one that is not there at
all is the same one-line failure as for any command. After the bound it gives up with
exit status 3 and a line that says how long it waited.

Standard library only (the client's hot-path rule: ``tests/test_cli_speed.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ddpq.client.errors import Unreachable

T = TypeVar("T")

RECONNECT_S = 60.0  # the restart of a daemon with many jobs to adopt is seconds, not minutes
RETRY_S = 0.25  # between tries: a restarted daemon answers ~2 s after it was stopped


def to_stderr(line: str) -> None:
    """One line of ours on stderr (a followed log is on stdout)."""
    sys.stderr.write(f"ddpq: {line}\n")
    sys.stderr.flush()


class Staying:
    """Calls to the daemon that outlast its restart; ``say`` prints one line of ours."""

    def __init__(
        self,
        say: Callable[[str], None] = to_stderr,
        bound_s: float = RECONNECT_S,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        self.say = say
        self.bound_s = bound_s
        self.clock = clock
        self.pause = pause
        self.answered = False  # the daemon answered once: a later loss is a restart
        self.lost_at: float | None = None  # since when it has not answered

    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)``, tried again while the daemon is away (at most the bound)."""
        while True:
            try:
                result = fn(*args, **kw)
            except Unreachable as exc:
                self.lost(exc)
                continue
            self.back()
            return result

    def back(self) -> None:
        """The daemon answered: say so if it had been away."""
        self.answered = True
        if self.lost_at is not None:
            self.lost_at = None
            self.say("reconnected")

    def lost(self, exc: Unreachable) -> None:
        """The daemon did not answer: wait a moment to try again, or give up (raise) when
        it never answered or has been away for the bound."""
        if not self.answered:
            raise exc
        now = self.clock()
        if self.lost_at is None:
            self.lost_at = now
            self.say("daemon restarting; reconnecting...")
        elif now - self.lost_at >= self.bound_s:
            raise Unreachable(
                f"the daemon did not come back within {self.bound_s:.0f} s; gave up ({exc})",
                exit_code=3,
            ) from None
        self.pause(RETRY_S)


class StayingApi:
    """A ``JsonApi`` (or any client) whose every method is called through ``Staying``."""

    def __init__(self, api: Any, staying: Staying) -> None:
        self._api = api
        self._staying = staying

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method

        def stays(*args: Any, **kw: Any) -> Any:
            return self._staying.call(method, *args, **kw)

        return stays


def follow_log(api: Any, job_id: int, write: Callable[[bytes], None], staying: Staying) -> None:
    """Write job ``job_id``'s log as it grows until the job ends, through restarts: each
    new stream starts at the byte after the last one written, so nothing is shown twice
    and nothing is skipped."""
    from ddpq.core.states import TERMINAL, JobState

    offset = 0
    while True:
        try:
            for chunk in api.follow_log(job_id, offset):
                staying.back()
                write(chunk)
                offset += len(chunk)
        except Unreachable as exc:  # the stream broke off (or could not start)
            staying.lost(exc)
            continue
        # The stream ended: the job has, or the daemon stopping closed it cleanly. Its
        # state says which; a job that ended may have written past what the stream sent.
        job = staying.call(api.show, job_id)
        if JobState(job["state"]) in TERMINAL:
            while True:
                data, offset = staying.call(api.log, job_id, offset)
                if not data:
                    return
                write(data)
