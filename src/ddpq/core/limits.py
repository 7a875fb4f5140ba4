"""Per-user limits and GPU reservations, as the planner checks them (pure).

**Limits** (``ddpq admin limit alice --gpus 4 --jobs 10``, and ``--default`` for everyone):
the most GPUs a user's jobs hold at once, and the most jobs of theirs that hold leases
(starting or running) at once. A GPU counts once however many of the user's jobs share it.
A user's own figure wins over the default, field by field.

**Reservations** (``ddpq admin reserve --gpus 4 --user alice --start ... --end ...``): that
many GPUs are kept for the user's jobs in the window. A job may start only where it makes no
reservation shorter of GPUs than it already is: at the reservation's start (or now, once it
has started), the GPUs free then (every job keeping its GPUs for its whole time limit; a job
without one, for ever) and those the user's own jobs hold then must cover what the
reservations in force at that moment ask. So before a reservation starts, other jobs may use
its GPUs only when their time limit ends before it does (the shape of EASY backfill's shadow
time in ``core.scheduler``), and the user's own jobs may always use them: they count towards it.
Jobs already running when a window opens are not stopped for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# The name under which the limit for everyone is stored (no user name can be it).
EVERYONE = "*"


@dataclass(frozen=True)
class Limit:
    gpus: int | None = None  # None: no limit
    jobs: int | None = None


@dataclass(frozen=True)
class Limits:
    per_owner: Mapping[str, Limit] = field(default_factory=dict)
    default: Limit = Limit()

    def of(self, owner: str) -> Limit:
        own = self.per_owner.get(owner, Limit())
        return Limit(
            self.default.gpus if own.gpus is None else own.gpus,
            self.default.jobs if own.jobs is None else own.jobs,
        )

    @property
    def any(self) -> bool:
        return bool(self.per_owner) or self.default != Limit()


NO_LIMITS = Limits()


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class OwnerUse:
    """What each owner's jobs hold during a planning pass: jobs, and distinct GPUs."""

    def __init__(self, running: Iterable[tuple[str, Sequence[int]]]) -> None:
        self.jobs: dict[str, int] = {}
        self.gpus: dict[str, set[int]] = {}
        for owner, gpus in running:
            self.take(owner, gpus)

    def take(self, owner: str, gpus: Iterable[int]) -> None:
        self.jobs[owner] = self.jobs.get(owner, 0) + 1
        self.gpus.setdefault(owner, set()).update(gpus)

    def held(self, owner: str) -> set[int]:
        return self.gpus.get(owner, set())

    def blocks(self, owner: str, gpus: int, limits: Limits, shares: bool) -> str | None:
        """Why a job of ``owner`` needing ``gpus`` GPUs may not start now (None: it may).
        A sharing job may still fit on GPUs its owner holds already (``room_in_own``)."""
        limit = limits.of(owner)
        if limit.jobs is not None and self.jobs.get(owner, 0) >= limit.jobs:
            return f"at {owner}'s limit of {plural(limit.jobs, 'running job')}"
        if limit.gpus is None or gpus == 0:
            return None
        if gpus > limit.gpus:
            return f"needs {plural(gpus, 'GPU')}, more than {owner}'s limit of {limit.gpus}"
        held = len(self.held(owner))
        if not shares and held + gpus > limit.gpus:
            return self.gpu_limit_reason(owner, limit.gpus)
        return None

    def only_own(self, owner: str, gpus: int, limits: Limits) -> set[int] | None:
        """For a sharing job: the GPUs it must stay on to keep within its owner's GPU limit
        (those its owner holds already), or None where any GPU will do."""
        limit = limits.of(owner).gpus
        held = self.held(owner)
        if limit is None or len(held) + gpus <= limit:
            return None
        return set(held)

    def gpu_limit_reason(self, owner: str, limit: int) -> str:
        held = len(self.held(owner))
        if held >= limit:
            return f"at {owner}'s limit of {plural(limit, 'GPU')}"
        return f"would pass {owner}'s limit of {plural(limit, 'GPU')} ({owner}'s jobs hold {held})"


@dataclass(frozen=True)
class Reservation:
    id: int
    user: str
    gpus: int
    start: float
    end: float

    def describe(self) -> str:
        return f"reservation {self.id} ({plural(self.gpus, 'GPU')} for {self.user})"


def peak_reserved(reservations: Iterable[Reservation], extra: Reservation | None = None) -> int:
    """The most GPUs these reservations (and ``extra``) keep at any one moment."""
    rows = [*reservations, *([extra] if extra is not None else [])]
    if extra is not None:
        rows = [r for r in rows if r.start < extra.end and extra.start < r.end]
    # At equal times an end comes before a start: [a, b) windows that only touch never overlap.
    events = sorted([(r.start, 1, r.gpus) for r in rows] + [(r.end, 0, -r.gpus) for r in rows])
    most = now = 0
    for _, _, delta in events:
        now += delta
        most = max(most, now)
    return most


class Calendar:
    """The reservations that have not ended, and when each usable GPU comes back (its jobs'
    time limits), as jobs are placed in a planning pass."""

    def __init__(
        self,
        reservations: Iterable[Reservation],
        usable: Iterable[int],
        running: Iterable[tuple[str, Sequence[int], float]],
        now: float,
    ) -> None:
        """``running``: (owner, GPUs, when its time limit ends: inf without one)."""
        self.now = now
        self.pool = set(usable)
        self.open = sorted((r for r in reservations if r.end > now), key=lambda r: (r.start, r.id))
        # usable GPU -> owner -> when that owner's last job on it ends at the latest
        self.ends: dict[int, dict[str, float]] = {}
        for owner, gpus, end in running:
            self._add(self.ends, owner, gpus, end)

    def __bool__(self) -> bool:
        return bool(self.open)

    def _add(
        self, ends: dict[int, dict[str, float]], owner: str, gpus: Iterable[int], end: float
    ) -> None:
        for g in gpus:
            if g in self.pool:
                holders = ends.setdefault(g, {})
                holders[owner] = max(holders.get(owner, -math.inf), end)

    def _shortfall(self, at: float, ends: Mapping[int, Mapping[str, float]]) -> int:
        """GPUs the reservations in force at ``at`` lack then."""
        still = {g: {o for o, end in ends.get(g, {}).items() if end > at} for g in self.pool}
        free = sum(1 for owners in still.values() if not owners)
        asked = 0
        for r in self.open:
            if r.start <= at < r.end:
                own = sum(1 for owners in still.values() if owners == {r.user})
                asked += max(0, r.gpus - own)
        return max(0, asked - free)

    def blocks(self, owner: str, gpus: Sequence[int], end: float) -> Reservation | None:
        """The reservation that placing this job (until ``end``) would leave shorter of
        GPUs than it is, if any."""
        if not self.open or not any(g in self.pool for g in gpus):
            return None
        trial = {g: dict(holders) for g, holders in self.ends.items()}
        self._add(trial, owner, gpus, end)
        for r in self.open:
            at = max(self.now, r.start)
            if self._shortfall(at, trial) > self._shortfall(at, self.ends):
                return r
        return None

    def take(self, owner: str, gpus: Sequence[int], end: float) -> None:
        self._add(self.ends, owner, gpus, end)

    def reason(self, r: Reservation, end: float) -> str:
        if r.start <= self.now:
            return f"the free GPUs are kept for {r.describe()}"
        if end == math.inf:
            return f"without a time limit it would run into {r.describe()}"
        return f"its time limit would run into {r.describe()}"
