"""Accounting for GPU time: who used which GPU outside the queue, and the usage report.

Pure decisions on plain data: the worker samples (``worker.outside``), the store keeps the
intervals and reads the attempts (``store.usage``), the server and the CLI ask. ``now`` is
always a parameter.

Outside use is sampled: each time the worker looks at the GPUs (every few seconds), every
account with a compute process on a GPU that is in no ddpq job is credited the time since
the previous look, for that GPU. Consecutive sightings of one account on one GPU make one
interval (one row, however long), so what is stored grows with how often use starts and
stops, not with time. An account on a GPU is charged the whole GPU: under the default
``external_gpus = "avoid"`` no job can be given it meanwhile, whoever else is on it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from ddpq.core.gpus import Gpu
from ddpq.core.names import NAME_RE
from ddpq.core.states import TERMINAL, JobState
from ddpq.core.units import parse_duration

# A sighting is credited the time since the previous one, but never more than this: after
# NVML failed for minutes, or the worker was stopped, nobody knows who was on the GPU.
MAX_CREDIT_S = 30.0
# Sightings of one account on one GPU at most this far apart extend one interval (the gap
# is charged): a process restarted in a loop costs one row a minute at most, not one a
# sample, and a worker restart does not split an interval.
MERGE_GAP_S = 60.0
# Distinct accounts credited per GPU and sample; more (a rootless container cycling
# through its sub-uids) are credited to nobody in particular, so that what one sample
# writes stays bounded.
MAX_ACCOUNTS_PER_GPU = 16

# Labels that no Unix account can have (they hold characters no account name may).
UNKNOWN = "(unknown)"  # the process was gone, or /proc would not say whose it was
OTHER = "(other)"  # the accounts beyond a listing's bound, summed

# `--since`: the window a report covers.
DEFAULT_SINCE = "30d"
MAX_SINCE_S = 3650 * 86400.0  # ten years


def account_label(uid: int | None, account: str | None) -> str:
    """How an outside process's owner is named: the account, else its uid, else unknown."""
    if account:
        return account
    if uid is not None:
        return f"uid {uid}"
    return UNKNOWN


@dataclass(frozen=True)
class Sighting:
    """An account (by uid; None: unknown) seen with compute processes on one GPU."""

    uid: int | None
    account: str | None
    gpu: int


def sightings(gpus: Iterable[Gpu]) -> list[Sighting]:
    """Who is on each GPU, once per account, from GPUs that hold only outside processes
    (``Gpu.outside``) with their owners filled in. Bounded: ``MAX_ACCOUNTS_PER_GPU``
    accounts per GPU, the rest as unknown."""
    out: list[Sighting] = []
    for gpu in gpus:
        seen: dict[int | None, str | None] = {}
        for proc in gpu.processes:
            uid = proc.uid
            if uid not in seen and uid is not None and len(seen) >= MAX_ACCOUNTS_PER_GPU:
                uid = None
            if uid not in seen:
                seen[uid] = proc.account if uid is not None else None
        out += [Sighting(uid, account, gpu.index) for uid, account in seen.items()]
    return out


def credit(now: float, previous: float | None, nominal_s: float) -> float:
    """The seconds a sighting at ``now`` stands for: the time since the previous sample
    (``nominal_s``, the sampling interval, for the first one), at most ``MAX_CREDIT_S``."""
    if previous is None or now <= previous:
        return min(nominal_s, MAX_CREDIT_S)
    return min(now - previous, MAX_CREDIT_S)


def attribute(
    accounts: Iterable[str], mapped: Mapping[str, Collection[str]], names_are_users: bool
) -> dict[str, str]:
    """account -> the ddpq user whose use it is, for the accounts that have one.

    ``mapped`` holds, per account, the ddpq users mapped to it (``ddpq admin user map``).
    Exactly one: that user. More than one: nobody (the account cannot say which of them
    it was). None: with ``names_are_users`` (a daemon without --auth, where a user is
    whoever their login name says), the user of the account's own name.
    """
    out: dict[str, str] = {}
    for account in accounts:
        users = mapped.get(account, ())
        if len(users) == 1:
            (out[account],) = users
        elif not users and names_are_users and NAME_RE.match(account):
            out[account] = account
    return out


# ---- the report -------------------------------------------------------------------------


class By(StrEnum):
    USER = "user"
    DAY = "day"  # UTC days, as every time the API gives is UTC
    MONTH = "month"


def parse_since(text: str) -> float:
    """``--since`` (a duration: 30d, 12h, 1d12h) in seconds; ValueError says what is wrong."""
    seconds = parse_duration(text)
    if seconds > MAX_SINCE_S:
        raise ValueError(f"{text!r}: at most {MAX_SINCE_S / 86400:.0f}d")
    return seconds


@dataclass(frozen=True)
class JobSpan:
    """One attempt: its owner, the GPUs it was leased, when it ran (None: running), what it
    reserved on each GPU when it shared them by memory (None: whole GPUs), and its measured
    peak on any one of its GPUs (None: never measured)."""

    owner: str
    gpus: int
    started_at: float
    ended_at: float | None
    mem_bytes: int | None = None
    peak_bytes: int | None = None
    cores: int = 0  # the host's CPU cores it leased (core.hostres)


@dataclass(frozen=True)
class OutsideSpan:
    """One interval of outside use of one GPU by one account."""

    uid: int | None
    account: str | None
    started_at: float
    ended_at: float


@dataclass(frozen=True)
class Finished:
    """A job that ended, in its final state."""

    owner: str
    state: JobState
    ended_at: float


@dataclass(frozen=True)
class FirstStart:
    """A job's first start and how long it had waited for it since its submission."""

    owner: str
    started_at: float
    wait_s: float


@dataclass
class _Sums:
    jobs_s: float = 0.0
    outside_s: float = 0.0
    core_s: float = 0.0  # core-seconds of the CPU cores its attempts leased
    ended: dict[JobState, int] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    # Attempts that shared GPUs by memory: byte-seconds reserved, and of those with a
    # measured peak, byte-seconds of that peak (the same attempts only, so the two compare).
    reserved_bs: float | None = None
    peak_bs: float | None = None
    peak_max: int | None = None  # the highest measured peak of any attempt (bytes)

    def add(self, other: _Sums) -> None:
        self.jobs_s += other.jobs_s
        self.outside_s += other.outside_s
        self.core_s += other.core_s
        self.reserved_bs = _plus(self.reserved_bs, other.reserved_bs)
        self.peak_bs = _plus(self.peak_bs, other.peak_bs)
        self.peak_max = _most(self.peak_max, other.peak_max)
        for state, n in other.ended.items():
            self.ended[state] = self.ended.get(state, 0) + n
        self.waits += other.waits


def _plus(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _memory(s: _Sums, span: JobSpan, seconds: float) -> None:
    """``span``'s memory over ``seconds`` of it, into ``s``."""
    s.peak_max = _most(s.peak_max, span.peak_bytes)
    if span.mem_bytes is None:
        return
    s.reserved_bs = _plus(s.reserved_bs, float(span.mem_bytes) * span.gpus * seconds)
    if span.peak_bytes is not None:
        s.peak_bs = _plus(s.peak_bs, float(span.peak_bytes) * span.gpus * seconds)


@dataclass(frozen=True)
class Row:
    """The figures of one group: a user, an account no user has, a day or a month."""

    key: str
    kind: str  # user | account | day | month | total
    gpu_hours_jobs: float
    gpu_hours_outside: float
    jobs: dict[JobState, int]  # jobs that ended, by final state (every final state listed)
    jobs_started: int  # jobs whose first start the waits are of
    wait_p50_s: float | None
    wait_p90_s: float | None
    # Sharing GPUs by memory: GiB-hours reserved, and GiB-hours of the measured peaks of
    # the same attempts (None: no such attempt / none measured); the highest peak, GiB.
    mem_reserved_gib_h: float | None = None
    mem_used_gib_h: float | None = None
    mem_used_peak_gib: float | None = None
    core_hours: float = 0.0  # of the CPU cores jobs' attempts leased


@dataclass(frozen=True)
class Report:
    since: float
    until: float
    by: By
    rows: list[Row]
    total: Row


GIB = float(1 << 30)
GIB_HOUR = GIB * 3600.0

# At most this many rows of accounts that map to no user; the rest are summed as OTHER.
MAX_ACCOUNT_ROWS = 100


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between the two
    nearest ranks (as numpy's default and spreadsheets' PERCENTILE do); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _bucket(t: float, by: By) -> tuple[str, float]:
    """The UTC day or month ``t`` falls in, and when it ends."""
    d = datetime.fromtimestamp(t, UTC)
    if by is By.DAY:
        start = d.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), (start + timedelta(days=1)).timestamp()
    start = d.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        end = start.replace(year=start.year + 1, month=1)
    else:
        end = start.replace(month=start.month + 1)
    return start.strftime("%Y-%m"), end.timestamp()


def _pieces(start: float, end: float, by: By) -> Iterator[tuple[str, float]]:
    """[start, end) cut at the UTC day or month boundaries: (bucket, seconds in it)."""
    t = start
    while t < end:
        key, edge = _bucket(t, by)
        stop = min(edge, end)
        yield key, stop - t
        t = stop


def report(
    jobs: Iterable[JobSpan],
    outside: Iterable[OutsideSpan],
    finished: Iterable[Finished],
    first_starts: Iterable[FirstStart],
    people: Mapping[str, str],
    since: float,
    now: float,
    by: By,
) -> Report:
    """The usage in [since, now], grouped ``by`` user (outside use under the user its
    account maps to in ``people``, else under the account) or by UTC day or month.

    GPU time (and core time) counts only its part inside the window (a running attempt up
    to ``now``); a 0-GPU job uses no GPU time. Ended jobs count in the group of their end,
    waits in the group of the job's first start, both only inside the window. Rows by
    user: users, then accounts of no user (at most ``MAX_ACCOUNT_ROWS``), each the most
    used first; by day or month: in time order, only those with something in them.
    """
    groups: dict[tuple[str, str], _Sums] = {}

    def sums(kind: str, key: str) -> _Sums:
        return groups.setdefault((kind, key), _Sums())

    def clip(start: float, end: float | None) -> tuple[float, float]:
        return max(start, since), min(now if end is None else end, now)

    for span in jobs:
        start, end = clip(span.started_at, span.ended_at)
        if end <= start or (span.gpus <= 0 and span.cores <= 0):
            continue
        pieces = [(span.owner, end - start)] if by is By.USER else _pieces(start, end, by)
        for key, seconds in pieces:
            group = sums("user" if by is By.USER else by.value, key)
            group.jobs_s += span.gpus * seconds
            group.core_s += span.cores * seconds
            _memory(group, span, seconds)
    for o in outside:
        start, end = clip(o.started_at, o.ended_at)
        if end <= start:
            continue
        if by is By.USER:
            label = account_label(o.uid, o.account)
            user = people.get(label)
            if user is not None:
                sums("user", user).outside_s += end - start
            else:
                sums("account", label).outside_s += end - start
        else:
            for key, seconds in _pieces(start, end, by):
                sums(by.value, key).outside_s += seconds
    for job in finished:
        if since <= job.ended_at <= now and job.state in TERMINAL:
            key = job.owner if by is By.USER else _bucket(job.ended_at, by)[0]
            ended = sums("user" if by is By.USER else by.value, key).ended
            ended[job.state] = ended.get(job.state, 0) + 1
    for first in first_starts:
        if since <= first.started_at <= now:
            key = first.owner if by is By.USER else _bucket(first.started_at, by)[0]
            sums("user" if by is By.USER else by.value, key).waits.append(first.wait_s)

    total = _Sums()
    for group in groups.values():
        total.add(group)
    keyed = _bounded_accounts(groups)
    if by is By.USER:  # users, then accounts of none, each the most used first; OTHER last

        def rank(k: tuple[str, str]) -> tuple[bool, bool, float, str]:
            used = keyed[k].jobs_s + keyed[k].outside_s
            return (k[0] != "user", k[1] == OTHER, -used, k[1])

        order = sorted(keyed, key=rank)
    else:
        order = sorted(keyed, key=lambda k: k[1])
    rows = [_row(key, kind, keyed[(kind, key)]) for kind, key in order]
    return Report(since, now, by, rows, _row("total", "total", total))


def _bounded_accounts(groups: dict[tuple[str, str], _Sums]) -> dict[tuple[str, str], _Sums]:
    """``groups`` with at most ``MAX_ACCOUNT_ROWS`` accounts of their own (those that used
    the most), the rest summed under OTHER."""
    accounts = sorted(
        (k for k in groups if k[0] == "account"), key=lambda k: (-groups[k].outside_s, k[1])
    )
    if len(accounts) <= MAX_ACCOUNT_ROWS:
        return groups
    kept = {k: v for k, v in groups.items() if k not in accounts[MAX_ACCOUNT_ROWS - 1 :]}
    other = _Sums()
    for k in accounts[MAX_ACCOUNT_ROWS - 1 :]:
        other.add(groups[k])
    kept[("account", OTHER)] = other
    return kept


def _row(key: str, kind: str, s: _Sums) -> Row:
    return Row(
        key=key,
        kind=kind,
        gpu_hours_jobs=s.jobs_s / 3600.0,
        gpu_hours_outside=s.outside_s / 3600.0,
        jobs={state: s.ended.get(state, 0) for state in JobState if state in TERMINAL},
        jobs_started=len(s.waits),
        wait_p50_s=percentile(s.waits, 0.5),
        wait_p90_s=percentile(s.waits, 0.9),
        mem_reserved_gib_h=None if s.reserved_bs is None else s.reserved_bs / GIB_HOUR,
        mem_used_gib_h=None if s.peak_bs is None else s.peak_bs / GIB_HOUR,
        mem_used_peak_gib=None if s.peak_max is None else s.peak_max / GIB,
        core_hours=s.core_s / 3600.0,
    )
