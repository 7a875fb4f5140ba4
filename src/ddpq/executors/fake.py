"""An executor that runs nothing: tests (and replays) say when each attempt ends.

``FakeHost`` is the machine: the attempts that "run" there, which outlive any one
executor, as processes outlive a crashed worker. ``FakeExecutor`` is one worker's view
of it; a new one on the same host is what a restarted worker sees. In-process worker
tests drive the real worker loop and the real store with it and assert on plain data,
in milliseconds, without starting a process.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpq.core.rules import ExitRecord
from ddpq.executors.base import LOST, Ended, Launch, LaunchFailed, one_by_one


@dataclass
class FakeAttempt:
    launch: Launch
    handle: str
    proceeded: bool = False  # let run by the worker (its handle stored)
    record: ExitRecord | None = None  # set once it has ended
    stops: int = 0  # how often the worker asked it to stop
    preempts: int = 0  # how often the worker asked it to checkpoint and go
    told: list[str] = field(default_factory=list)  # lines written into its terminal


@dataclass
class FakeHost:
    """Every attempt ever started here, by handle; what fails to start, by job id."""

    attempts: dict[str, FakeAttempt] = field(default_factory=dict)
    refuse: dict[int, str] = field(default_factory=dict)
    # Launches the executor itself loses, by job id, each once (``LaunchFailed.interrupted``).
    lose_launch: dict[int, str] = field(default_factory=dict)
    # Launches the host had no room for, by job id, each once (``LaunchFailed.put_off``).
    no_room: dict[int, str] = field(default_factory=dict)
    # When set, an attempt asked to stop ends at once, killed by this signal.
    stop_ends_with_signal: int | None = 15
    # When set, an attempt asked to preempt itself exits at once with this status.
    preempt_ends_with: int | None = 75
    # Started jobs still waiting where they run (a cluster's queue), with the reason.
    waiting: dict[int, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.time  # the time an exit record says the attempt ended
    pids: dict[int, set[int]] = field(default_factory=dict)  # job id -> its "processes"
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def attempt_of(self, job_id: int) -> FakeAttempt:
        """The newest attempt of ``job_id``."""
        found = [a for a in self.attempts.values() if a.launch.job_id == job_id]
        if not found:
            raise LookupError(f"job {job_id} was never started here")
        return max(found, key=lambda a: a.launch.attempt)

    def running(self) -> list[int]:
        return sorted(a.launch.job_id for a in self.attempts.values() if a.record is None)

    def finish(
        self,
        job_id: int,
        exit_code: int | None = 0,
        signal: int | None = None,
        error: str | None = None,
        peak_ram_bytes: int | None = None,
    ) -> None:
        """The newest attempt of ``job_id`` ends now, as an exit record would say (and, as
        the local executor adds it, the most memory its cgroup held)."""
        attempt = self.attempt_of(job_id)
        if attempt.record is not None:
            raise ValueError(f"job {job_id}'s attempt {attempt.launch.attempt} has ended already")
        at = self.clock()
        attempt.record = ExitRecord(exit_code, signal, at, at, error, peak_ram_bytes=peak_ram_bytes)

    def lose(self, job_id: int) -> None:
        """Its shim vanishes without a record (kill -9, the OOM killer)."""
        self.finish(job_id, None, None, LOST)


class FakeExecutor:
    name = "fake"

    def __init__(self, host: FakeHost | None = None) -> None:
        self.host = host if host is not None else FakeHost()
        self.watched: dict[int, str] = {}  # job id -> handle

    def describe(self) -> str:
        return "fake executor: nothing runs"

    def start(self, launch: Launch) -> str:
        reason = self.host.refuse.pop(launch.job_id, None)
        if reason is not None:
            raise LaunchFailed(reason)
        lost = self.host.lose_launch.pop(launch.job_id, None)
        if lost is not None:
            raise LaunchFailed(lost, interrupted=True)
        if launch.job_id in self.host.no_room:
            raise LaunchFailed(self.host.no_room.pop(launch.job_id), put_off=True)
        handle = f"fake-{next(self.host._numbers)}"
        self.host.attempts[handle] = FakeAttempt(launch, handle)
        self.watched[launch.job_id] = handle
        return handle

    def start_many(self, launches: Sequence[Launch]) -> list[str | LaunchFailed]:
        return one_by_one(self.start, launches)

    def proceed(self, job_ids: Sequence[int]) -> None:
        for job_id in job_ids:
            self.host.attempts[self.watched[job_id]].proceeded = True

    def abandon(self, job_ids: Sequence[int]) -> None:
        for job_id in job_ids:
            attempt = self.host.attempts[self.watched[job_id]]
            at = self.host.clock()
            attempt.record = ExitRecord(None, None, at, at, "abandoned", launched=False)

    def adopt(self, job_id: int, attempt: int, job_dir: Path, handle: str | None) -> str | None:
        found = self.host.attempts.get(handle) if handle is not None else None
        if found is None:
            # No handle stored (the worker died mid-launch): look for it as the local
            # executor looks for a shim by its folder.
            matches = [
                a
                for a in self.host.attempts.values()
                if a.launch.job_id == job_id and a.launch.attempt == attempt
            ]
            found = matches[0] if matches else None
        if found is None:
            return None
        self.watched[job_id] = found.handle
        return found.handle

    def ended(self) -> list[Ended]:
        out = []
        for job_id, handle in list(self.watched.items()):
            attempt = self.host.attempts[handle]
            if attempt.record is not None:
                del self.watched[job_id]
                out.append(Ended(job_id, attempt.launch.attempt, attempt.record))
        return out

    def stop(self, job_id: int, preempt: bool = False) -> bool:
        handle = self.watched.get(job_id)
        if handle is None:
            return False
        attempt = self.host.attempts[handle]
        if preempt:
            attempt.preempts += 1
            if self.host.preempt_ends_with is not None and attempt.record is None:
                self.host.finish(job_id, self.host.preempt_ends_with)
            return True
        attempt.stops += 1
        if self.host.stop_ends_with_signal is not None and attempt.record is None:
            self.host.finish(job_id, None, self.host.stop_ends_with_signal)
        return True

    def tell(self, job_id: int, message: str) -> bool:
        handle = self.watched.get(job_id)
        if handle is None or not self.host.attempts[handle].launch.spec.interactive:
            return False
        self.host.attempts[handle].told.append(message)
        return True

    def waiting(self) -> dict[int, str]:
        return {i: why for i, why in self.host.waiting.items() if i in self.watched}

    def job_pids(self) -> set[int]:
        return {pid for pids in self.pids_by_job().values() for pid in pids}

    def pids_by_job(self) -> dict[int, set[int]]:
        return {job: set(self.host.pids.get(job, ())) for job in self.watched}

    def wait_fds(self) -> list[int]:
        return []

    def close(self) -> None:
        self.watched.clear()
