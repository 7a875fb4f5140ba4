"""Whose the GPU processes outside the queue are, and their use sampled into the store.

NVML gives a PID and nothing else. The owner is the real uid on the process's ``Uid:``
line in ``/proc/PID/status`` (the account that started it, as ``ps -o ruser`` shows; a
setuid program still counts as whoever ran it), named through the password database. The
PID is hostile input: the process may have ended since NVML listed it (then the PID may
even be another process's by now, which no interface closes: NVML tells no start time),
``/proc`` may be mounted with ``hidepid`` (a daemon that is not root then sees no other
account's processes), the name on the first line is the process's own choice. Whatever
cannot be read is "unknown", never a guess. As for telling ddpq's own processes apart
(``core.gpus``), the PIDs mean something only in the host's PID namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ddpq.core import usage
from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.proc_status import STATUS_LIMIT
from ddpq.procfs import PROC, account_name, process_uid
from ddpq.store import usage as usage_store
from ddpq.store.db import Session

# The look itself is ddpq.procfs's (the API names port holders with it too).
__all__ = ["PROC", "STATUS_LIMIT", "OutsideUse", "account_name", "process_uid"]

# The password database may be LDAP: a name is asked again after this long, not each sample.
NAME_TTL_S = 300.0
NAMES_KEPT = 4096


class OutsideUse:
    """Names the owners of the processes in no job, and samples their use."""

    def __init__(
        self,
        sample_s: float,
        uid_of: Callable[[int], int | None] = process_uid,
        name_of: Callable[[int], str | None] = account_name,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sample_s = sample_s  # how often the worker looks: the first sample's credit
        self.uid_of = uid_of
        self.name_of = name_of
        self.clock = clock
        self._names: dict[int, tuple[str | None, float]] = {}
        self._sampled_at: float | None = None

    def name_owners(self, gpus: list[Gpu]) -> list[Gpu]:
        """``gpus`` (with only their outside processes) with each process's uid and account."""
        return [
            replace(g, processes=tuple(self._named(p) for p in g.processes)) if g.processes else g
            for g in gpus
        ]

    def _named(self, proc: GpuProcess) -> GpuProcess:
        uid = self.uid_of(proc.pid)
        return replace(proc, uid=uid, account=None if uid is None else self._name(uid))

    def _name(self, uid: int) -> str | None:
        now = self.clock()
        cached = self._names.get(uid)
        if cached is not None and now - cached[1] < NAME_TTL_S:
            return cached[0]
        if len(self._names) >= NAMES_KEPT:
            self._names.clear()
        name = self.name_of(uid)
        self._names[uid] = (name, now)
        return name

    def sample(self, session: Session, gpus: list[Gpu], now: float) -> None:
        """Credit every account on each GPU of ``gpus`` (named: ``name_owners``) the time
        since the previous sample, in the caller's transaction."""
        credit = usage.credit(now, self._sampled_at, self.sample_s)
        self._sampled_at = now
        seen = usage.sightings(gpus)
        if seen:
            usage_store.record_sample(session, seen, now, credit)
