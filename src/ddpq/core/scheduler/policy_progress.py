"""What ``srpt-progress`` ranks jobs by: each job's remaining GPU-time, estimated from what
the daemon sees (pure).

- A job that reports progress (``done`` of ``total`` steps, at a time) is estimated from its
  own measured rate over its recent records, never from its claim (``eta_s``) once a rate
  can be measured: a job whose claimed end keeps slipping is ranked by what it does.
- A job without a usable rate is ranked by its Gittins index (Gittins, 1979; as in
  Aalo and Tiresias's discussion of it): from the GPU-time that finished jobs of its class
  (owner / command / workload) took, the best ratio of the chance to finish within the
  next ``d`` GPU-seconds to the GPU-time that costs, over all ``d``, given the service it
  has had. Its inverse is in GPU-seconds, and equals the remaining GPU-time of a job whose
  remaining time is known, so both kinds of job share one SRPT-like order.
- Owners whose recent use is above the other active owners' mean by more than a band
  are ranked after everyone else's jobs (``over_band``).

Nothing here reads a job's true length: the replay (``ddpq.sim``) and the daemon call it on
the same observations.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

# Pairs of consecutive records of one attempt the rate is measured over (the most recent).
RATE_WINDOW = 5
# A class needs this many finished jobs before its own history is used, else a wider one.
MIN_HISTORY = 5
# The most finished jobs kept per class (the newest): the index follows a changing workload.
MAX_HISTORY = 500
# With no history at all: the rank of a job that has had no service (one GPU-hour), and
# like LAS, a job that has had more service ranks later.
PRIOR_S = 3600.0
# An owner is over the band when their recent use exceeds (1 + band) × the others' mean.
DEFAULT_BAND = 1.0


@dataclass(frozen=True)
class Record:
    """One progress record: ``done`` of ``total`` (steps, or a fraction of 1) at ``at``
    (seconds, the daemon's clock) in attempt ``attempt``; ``eta_s`` the job's own claim."""

    at: float
    done: float
    total: float
    attempt: int = 0
    eta_s: float | None = None


def measured_rate(records: Sequence[Record]) -> float | None:
    """Units of ``done`` per second over the last ``RATE_WINDOW`` pairs of consecutive
    records of the same attempt (a restart's pause is not counted); None when no pair."""
    worked = elapsed = 0.0
    pairs = 0
    for before, after in zip(reversed(records[:-1]), reversed(records[1:]), strict=True):
        if pairs == RATE_WINDOW:
            break
        if before.attempt != after.attempt or after.at <= before.at:
            continue
        worked += after.done - before.done
        elapsed += after.at - before.at
        pairs += 1
    if pairs == 0 or worked <= 0:
        return None
    return worked / elapsed


def remaining_s(records: Sequence[Record], now: float, running: bool) -> float | None:
    """Seconds of work left: what the newest record leaves at the measured rate, less the
    time it has run since (``running``), never below zero; None without a rate (a claim
    alone, ``eta_s``, is not trusted: only a job's own pace is)."""
    rate = measured_rate(records)
    if rate is None:
        return None
    last = records[-1]
    left = max(0.0, last.total - last.done) / rate
    if running:
        left -= max(0.0, now - last.at)
    return max(0.0, left)


@dataclass
class History:
    """The GPU-seconds finished jobs took, per class and per owner, newest last."""

    by_class: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    by_owner: dict[str, list[float]] = field(default_factory=dict)
    everyone: list[float] = field(default_factory=list)
    _sorted: dict[object, tuple[list[float], list[float]]] = field(default_factory=dict)

    def add(self, owner: str, workload: str, gpu_s: float) -> None:
        for key, bucket in (
            ((owner, workload), self.by_class.setdefault((owner, workload), [])),
            (owner, self.by_owner.setdefault(owner, [])),
            ("", self.everyone),
        ):
            bucket.append(gpu_s)
            del bucket[:-MAX_HISTORY]
            self._sorted.pop(key, None)

    def samples(self, owner: str, workload: str) -> tuple[list[float], list[float]]:
        """The narrowest history with ``MIN_HISTORY`` jobs: sorted, and its prefix sums."""
        for key, bucket in (
            ((owner, workload), self.by_class.get((owner, workload), [])),
            (owner, self.by_owner.get(owner, [])),
            ("", self.everyone),
        ):
            if len(bucket) >= MIN_HISTORY or key == "":
                if key not in self._sorted:
                    ordered = sorted(bucket)
                    self._sorted[key] = (ordered, [0.0, *accumulate(ordered)])
                return self._sorted[key]
        raise AssertionError("unreachable: the last history is always chosen")


def gittins_rank(ordered: Sequence[float], sums: Sequence[float], attained: float) -> float:
    """The inverse of the Gittins index of a job that has had ``attained`` GPU-seconds,
    whose total is distributed as ``ordered`` (sorted; ``sums`` its prefix sums): the
    least, over quanta ``d``, of E[min(S - a, d)] / P(S - a <= d) given S > a. In
    GPU-seconds; smaller runs first. A job older than all its history ranks by its age;
    with no history, ``PRIOR_S`` plus its age."""
    if not ordered:
        return PRIOR_S + attained
    first = bisect_right(ordered, attained)
    n = len(ordered) - first
    if n == 0:
        return max(attained, ordered[-1])
    best = float("inf")
    for j in range(first, len(ordered)):
        finished = j - first + 1  # survivors that end within d = ordered[j] - attained
        d = ordered[j] - attained
        cost = (sums[j + 1] - sums[first]) - attained * finished + d * (len(ordered) - 1 - j)
        best = min(best, cost / finished)
    return best


@dataclass(frozen=True)
class Seen:
    """A job as the policy sees it: no true length, only what it reported and had."""

    id: int
    owner: str
    workload: str  # its command or workload, the history's class with its owner
    gpus: int
    attained_s: float  # GPU-seconds held so far
    running: bool
    records: Sequence[Record] = ()


def estimate(
    job: Seen,
    history: History,
    now: float,
    ranks: dict[tuple[str, str, float], float] | None = None,
) -> float:
    """``job``'s rank in GPU-seconds: its remaining GPU-time from its measured progress,
    else its Gittins rank from its class's history (kept in ``ranks`` by owner, workload
    and service, when given, for the next job of the same)."""
    left = remaining_s(job.records, now, job.running) if job.records else None
    if left is not None:
        return left * max(1, job.gpus)
    key = (job.owner, job.workload, job.attained_s)
    if ranks is not None and key in ranks:
        return ranks[key]
    rank = gittins_rank(*history.samples(job.owner, job.workload), job.attained_s)
    if ranks is not None:
        ranks[key] = rank
    return rank


def estimates(jobs: Iterable[Seen], history: History, now: float) -> dict[int, float]:
    """``estimate`` of each job; the Gittins rank computed once per owner, workload and
    service (a queue of thousands of new jobs of a few commands costs a few ranks)."""
    ranks: dict[tuple[str, str, float], float] = {}
    return {job.id: estimate(job, history, now, ranks) for job in jobs}


def over_band(
    usage: Mapping[str, float], active: Iterable[str], band: float = DEFAULT_BAND
) -> frozenset[str]:
    """The ``active`` owners (with jobs queued or running) whose recent use exceeds the mean
    of the other active owners' by more than ``band`` of it: with the default band, more
    than twice what the others used on average.

    Measured against the others, not against a fair share of the total: a share of the
    total can never exceed ``(1 + band) / owners`` when there are two owners and band is
    1, so a user flooding the queue with short jobs ranked ahead of another's new job
    indefinitely (their estimates near zero, hers unknown)."""
    owners = sorted(set(active))
    used = {o: usage.get(o, 0.0) for o in owners}
    total = sum(used.values())
    if len(owners) < 2 or total <= 0:
        return frozenset()
    others = len(owners) - 1
    return frozenset(o for o in owners if used[o] > (1.0 + band) * (total - used[o]) / others)
