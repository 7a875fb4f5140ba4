"""Properties and examples for ``ddpq.core.scheduler.plan``.

The oracle helpers below (ordering, free GPUs at a job's turn, the head's
earliest start) are written from the documented rules, not from plan.py, so
that a bug in the planner cannot hide behind the same bug in the test.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ddpq.core.rules import Run, recent_usage
from ddpq.core.scheduler import (
    NO_SWEEP_CAPS,
    Placement,
    QueuedJob,
    RunningJob,
    SweepCaps,
    plan,
    plan_explained,
    shadow,
)

NOW = 10_000.0
OWNERS = ("alice", "bob", "carol", "dave")

SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Scenario:
    queued: tuple[QueuedJob, ...]
    usable: tuple[int, ...]
    running: tuple[RunningJob, ...]
    ports: tuple[int, ...]
    usage: Mapping[str, float] = field(default_factory=dict)
    now: float = NOW

    def run_plan(self) -> list[Placement]:
        return plan(self.queued, self.usable, self.running, self.ports, self.usage, self.now)


# Whole-second values so that ties (equal end times, a backfill ending exactly at
# the shadow time, equal usage) actually occur.
limited = st.one_of(
    st.sampled_from([60.0, 100.0, 600.0, 1000.0, 3600.0]),
    st.integers(1, 3000).map(float),
)
time_limits = st.one_of(st.none(), limited, limited, limited)  # about 1 in 4 has none
short_limits = st.sampled_from([30.0, 60.0, 90.0, 300.0])
ages = st.one_of(st.sampled_from([0, 40, 500, 1000]), st.integers(0, 2000))
# The strategies a scenario draws from, made once: Hypothesis validates each new strategy
# object when it is first drawn from, so one made inside a draw costs that on every example
# (a third of these tests' CPU). Where a bound depends on the example, one per bound.
owners = st.sampled_from(OWNERS)
seeded_randoms = st.randoms(use_true_random=False)
queued_limits = st.one_of(short_limits, time_limits)
not_befores = st.one_of(st.none(), st.integers(int(NOW) - 100, int(NOW) + 100).map(float))
port_lists = st.lists(st.integers(29500, 29600), unique=True, max_size=16)
usages = st.dictionaries(owners, st.sampled_from([0.0, 10.0, 500.0, 3600.0, 86400.0]))
running_limits = st.one_of(limited, limited, limited, st.none())
backfill_gpus = st.one_of(st.integers(1, 2), st.integers(0, 3))
backfill_limits = st.one_of(short_limits, limited, limited, st.none())
small_usages = st.dictionaries(owners, st.sampled_from([0.0, 10.0, 500.0]))


@functools.cache
def usable_flags_of(n: int) -> st.SearchStrategy[list[bool]]:
    """Most GPUs are usable; some are external (policy keeps them from ddpq)."""
    return st.lists(st.sampled_from([True, True, True, False]), min_size=n, max_size=n)


@functools.cache
def orders_of(n: int) -> st.SearchStrategy[list[int]]:
    return st.permutations(range(n))


@functools.cache
def asked_gpus(n: int) -> st.SearchStrategy[int]:
    """Mostly small, some more than the box has."""
    return st.one_of(st.integers(0, 2), st.integers(0, n + 2))


@st.composite
def scenarios(draw: st.DrawFn, max_gpus: int = 16, max_queued: int = 12) -> Scenario:
    n = draw(st.integers(1, max_gpus))
    all_gpus = list(range(n))
    # Most GPUs are usable; some are external (policy keeps them from ddpq), and a
    # running job may still hold one of those (the policy changed under it).
    usable_flags = draw(usable_flags_of(n))
    usable = [g for g, ok in zip(all_gpus, usable_flags, strict=True) if ok]
    draw(seeded_randoms).shuffle(usable)

    # Running jobs hold disjoint GPU sets: deal a shuffled subset out in chunks.
    held = draw(orders_of(n))
    held = held[: draw(st.integers(0, n))]
    chunks: list[tuple[int, ...]] = []
    i = 0
    while i < len(held):
        size = draw(st.integers(1, min(4, len(held) - i)))
        chunks.append(tuple(held[i : i + size]))
        i += size
    chunks += [()] * draw(st.integers(0, 2))  # CPU-only jobs hold a port, no GPU
    running: list[RunningJob] = []
    next_id = 1
    for gpus in chunks:
        # Some have run past their limit (being stopped), some have none.
        running.append(RunningJob(next_id, gpus, NOW - draw(ages), draw(time_limits)))
        next_id += 1

    queued: list[QueuedJob] = []
    for _ in range(draw(st.integers(0, max_queued))):
        queued.append(
            QueuedJob(
                id=next_id,
                owner=draw(owners),
                gpus=draw(asked_gpus(n)),
                priority=draw(st.integers(0, 3)),
                submitted_at=float(draw(st.integers(0, int(NOW)))),
                time_limit_s=draw(queued_limits),
                not_before=draw(not_befores),
            )
        )
        next_id += 1

    # Often a high-priority job that cannot start now but will once some running
    # jobs end: a blocked head, so that the backfill rules get exercised.
    n_usable, n_free = len(usable), len(set(usable) - set(held))
    if n_free < n_usable and draw(st.booleans()):
        queued.append(
            QueuedJob(
                id=next_id,
                owner=draw(owners),
                gpus=draw(st.integers(n_free + 1, n_usable)),
                priority=4,
                submitted_at=float(draw(st.integers(0, int(NOW)))),
                time_limit_s=draw(time_limits),
            )
        )
    ports = draw(port_lists)
    usage = draw(usages)
    return Scenario(tuple(queued), tuple(usable), tuple(running), tuple(ports), usage)


@st.composite
def blocked_head_scenarios(draw: st.DrawFn) -> Scenario:
    """A box where a high-priority job is blocked and several small jobs compete
    to backfill: the cases where the backfill rules decide what happens."""
    n = draw(st.integers(2, 16))
    usable = list(range(n - draw(st.integers(0, 2))))  # the top one or two may be external
    order = draw(orders_of(n))
    held = order[: draw(st.integers(1, n - 1))]
    running: list[RunningJob] = []
    i = 0
    while i < len(held):
        size = draw(st.integers(1, min(4, len(held) - i)))
        running.append(
            RunningJob(
                len(running) + 1,
                tuple(held[i : i + size]),
                NOW - draw(ages),
                draw(running_limits),
            )
        )
        i += size
    n_free = len(set(usable) - set(held))
    assume(n_free < len(usable))
    next_id = 100
    queued = [
        QueuedJob(
            next_id, "alice", draw(st.integers(n_free + 1, len(usable))), 4, 0.0, draw(limited)
        )
    ]
    for _ in range(draw(st.integers(1, 8))):
        next_id += 1
        queued.append(
            QueuedJob(
                next_id,
                draw(owners),
                draw(backfill_gpus),
                draw(st.integers(0, 4)),
                float(draw(st.integers(0, 100))),
                draw(backfill_limits),
            )
        )
    usage = draw(small_usages)
    return Scenario(tuple(queued), tuple(usable), tuple(running), tuple(range(1, 11)), usage)


any_scenario = st.one_of(scenarios(), blocked_head_scenarios(), blocked_head_scenarios())


# --------------------------------------------------------------------------- oracle


def in_order(jobs: Sequence[QueuedJob], usage: Mapping[str, float]) -> list[QueuedJob]:
    """Documented order: priority, then recent usage of the owner, then submission."""
    return sorted(jobs, key=lambda j: (-j.priority, usage.get(j.owner, 0.0), j.submitted_at, j.id))


def eligible(s: Scenario) -> list[QueuedJob]:
    return [j for j in s.queued if j.not_before is None or j.not_before <= s.now]


def free_now(s: Scenario) -> set[int]:
    held = {g for r in s.running for g in r.gpus}
    return set(s.usable) - held


@dataclass(frozen=True)
class Holder:
    gpus: tuple[int, ...]
    ends: float  # when its GPUs come back at the latest; inf without a time limit


def holders_of(s: Scenario, placed: Sequence[Placement]) -> list[Holder]:
    by_id = {j.id: j for j in s.queued}
    out = [
        Holder(r.gpus, math.inf if r.time_limit_s is None else r.started_at + r.time_limit_s)
        for r in s.running
    ]
    for p in placed:
        tl = by_id[p.job_id].time_limit_s
        out.append(Holder(p.gpus, math.inf if tl is None else s.now + tl))
    return out


def earliest_start(
    need: int, usable: Sequence[int], holders: Sequence[Holder], now: float
) -> float:
    """Event simulation: the first moment ``need`` usable GPUs are free, every holder
    keeping its GPUs for its whole time limit. A GPU that is not usable never comes
    back to the pool; a holder past its limit gives its GPUs back "now" at best."""
    pool = set(usable)
    busy = {g for h in holders for g in h.gpus if g in pool}
    free = len(pool - busy)
    if free >= need:
        return now
    events: dict[float, int] = {}
    for h in holders:
        back = len([g for g in h.gpus if g in pool])
        if back:
            t = max(now, h.ends)
            events[t] = events.get(t, 0) + back
    for t in sorted(events):
        if t == math.inf:
            break
        free += events[t]
        if free >= need:
            return t
    return math.inf


@dataclass
class Analysis:
    order: list[QueuedJob]
    placed: dict[int, Placement]
    head: QueuedJob | None
    free_at_turn: dict[int, int]  # job id -> free GPUs when its turn came


def analyse(s: Scenario, placements: Sequence[Placement]) -> Analysis:
    order = in_order(eligible(s), s.usage)
    placed = {p.job_id: p for p in placements}
    free = len(free_now(s))
    free_at_turn: dict[int, int] = {}
    head: QueuedJob | None = None
    for job in order:
        free_at_turn[job.id] = free
        if job.id in placed:
            free -= job.gpus
        elif head is None and job.gpus <= len(set(s.usable)) and job.gpus > free:
            head = job
    return Analysis(order, placed, head, free_at_turn)


def placed_before(a: Analysis, job: QueuedJob) -> list[Placement]:
    out = []
    for j in a.order:
        if j.id == job.id:
            break
        if j.id in a.placed:
            out.append(a.placed[j.id])
    return out


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(any_scenario)
def test_never_more_gpus_than_exist(s: Scenario) -> None:
    placements = s.run_plan()
    by_id = {j.id: j for j in s.queued}
    held = {g for r in s.running for g in r.gpus}
    seen: set[int] = set()
    for p in placements:
        assert len(p.gpus) == by_id[p.job_id].gpus
        for g in p.gpus:
            assert g in s.usable, f"GPU {g} is not usable"
            assert g not in held, f"GPU {g} is held by a running job"
            assert g not in seen, f"GPU {g} placed twice"
            seen.add(g)
    assert len(seen) <= len(free_now(s))


@SETTINGS
@given(any_scenario)
def test_ports_jobs_and_eligibility(s: Scenario) -> None:
    placements = s.run_plan()
    ports = [p.port for p in placements]
    assert len(ports) == len(set(ports)), "a port was handed out twice"
    assert set(ports) <= set(s.ports)
    # Ports are used in the order given.
    assert ports == list(s.ports[: len(ports)])
    ids = [p.job_id for p in placements]
    assert len(ids) == len(set(ids)), "a job was placed twice"
    ok = {j.id for j in eligible(s)}
    for i in ids:
        assert i in ok, f"job {i} placed before its not_before"
    assert {r.id for r in s.running}.isdisjoint(ids)


@SETTINGS
@given(any_scenario)
def test_order_respected_except_safe_backfill(s: Scenario) -> None:
    """Whenever a job Q earlier in the documented order (in particular, of higher
    priority) waits while a later job P starts, Q could not start: it needs more
    GPUs than are usable, or more than were left when its turn came, or it comes
    after the blocked head and starting it could delay the head (or it has no
    time limit, which rules out backfill). P then starts only as a backfill."""
    placements = s.run_plan()
    a = analyse(s, placements)
    pos = {j.id: i for i, j in enumerate(a.order)}
    head_pos = pos[a.head.id] if a.head is not None else len(a.order)
    n_usable = len(set(s.usable))
    head_start = (
        math.inf
        if a.head is None
        else earliest_start(a.head.gpus, s.usable, holders_of(s, placed_before(a, a.head)), s.now)
    )
    for q in a.order:
        later_placed = [p for p in placements if pos[p.job_id] > pos[q.id]]
        if q.id in a.placed or not later_placed or q.gpus > n_usable:
            continue
        # q waits although a later job started: q must not have fit...
        if q.gpus > a.free_at_turn[q.id]:
            continue
        # ...or it fit, but as a backfill candidate past the head it could delay the head.
        assert a.head is not None and pos[q.id] > head_pos, f"job {q.id} fit but was skipped"
        assert q.gpus > 0, f"0-GPU job {q.id} skipped past the head"
        if q.time_limit_s is None or head_start == math.inf:
            continue  # no bound on q's end, or on the head's start: q may not backfill
        before = placed_before(a, q)
        free = sorted(free_now(s) - {g for p in before for g in p.gpus})
        trial = Placement(q.id, tuple(free[: q.gpus]), -1)
        with_q = earliest_start(a.head.gpus, s.usable, holders_of(s, [*before, trial]), s.now)
        assert with_q > head_start, (
            f"job {q.id} could have backfilled without delaying head {a.head.id}"
        )
    by_id = {j.id: j for j in a.order}
    for p in placements:
        job = by_id[p.job_id]
        # A higher-priority job left waiting (that could ever run here) means p is
        # a backfill past the blocked head.
        if any(
            q.priority > job.priority and q.id not in a.placed and q.gpus <= n_usable
            for q in a.order
        ):
            assert pos[job.id] > head_pos, f"job {job.id} jumped a higher priority"
        if pos[job.id] > head_pos and job.gpus > 0:
            assert job.time_limit_s is not None, f"job {job.id} has no time limit, backfilled"
            assert head_start < math.inf, f"job {job.id} backfilled past an unbounded head"


@SETTINGS
@given(any_scenario)
def test_backfill_never_delays_head(s: Scenario) -> None:
    placements = s.run_plan()
    a = analyse(s, placements)
    assume(a.head is not None)
    assert a.head is not None
    baseline = placed_before(a, a.head)
    without = earliest_start(a.head.gpus, s.usable, holders_of(s, baseline), s.now)
    with_backfill = earliest_start(a.head.gpus, s.usable, holders_of(s, placements), s.now)
    assert with_backfill <= without, (
        f"head {a.head.id} delayed from {without} to {with_backfill} by backfill"
    )
    backfilled = [p for p in placements if p not in baseline]
    if without == math.inf:
        # The head's start cannot be bounded: only jobs holding no GPU may pass it.
        assert all(p.gpus == () for p in backfilled)


@SETTINGS
@given(any_scenario, st.randoms(use_true_random=False))
def test_deterministic(s: Scenario, rnd: random.Random) -> None:
    first = s.run_plan()
    queued, running, usable = list(s.queued), list(s.running), list(s.usable)
    rnd.shuffle(queued)
    rnd.shuffle(running)
    rnd.shuffle(usable)
    again = plan(queued, usable, running, s.ports, dict(s.usage), s.now)
    assert again == first
    assert s.run_plan() == first


# --------------------------------------------------------------------------- fair share


@SETTINGS
@given(
    n_gpus=st.integers(1, 6),
    durations=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    b_round=st.integers(1, 8),
    a_per_round=st.integers(0, 3),
    b_first_in_time=st.booleans(),
)
def test_light_user_starts_at_first_free_gpu(
    n_gpus: int, durations: list[int], b_round: int, a_per_round: int, b_first_in_time: bool
) -> None:
    """A floods the queue with 1-GPU jobs; B submits one. B's job starts in the
    first round after its submission in which a GPU is free."""
    step = 60.0
    window = 7 * 86400.0
    usable = list(range(n_gpus))
    ports = list(range(30000, 30100))
    queued: list[QueuedJob] = []
    running: dict[int, tuple[RunningJob, str, float]] = {}  # id -> job, owner, real end
    runs: dict[int, Run] = {}
    next_id = 1

    def submit(owner: str, at: float, dur: int) -> None:
        nonlocal next_id
        queued.append(QueuedJob(next_id, owner, 1, 0, at, time_limit_s=dur * step))
        next_id += 1

    for k in range(2 * n_gpus + 2):
        submit("a", 0.0, durations[k % len(durations)])
    b_started_round: int | None = None
    expected_round: int | None = None
    for rnd in range(40):
        now = rnd * step
        for jid, (_job, _owner, end) in list(running.items()):
            if end <= now:
                del running[jid]
                runs[jid] = replace(runs[jid], ended_at=end)
        if rnd > 0:
            for k in range(a_per_round):
                submit("a", now - (1.0 if k else 0.5), durations[(rnd + k) % len(durations)])
        if rnd == b_round:
            # B's job may even be submitted after A's latest ones.
            submit("b", now - (2.0 if b_first_in_time else 0.0), durations[0])
        held = {g for job, _, _ in running.values() for g in job.gpus}
        if rnd >= b_round and expected_round is None and len(set(usable) - held) > 0:
            expected_round = rnd
        usage = recent_usage(runs.values(), now, window)
        placements = plan(queued, usable, [j for j, _, _ in running.values()], ports, usage, now)
        by_id = {j.id: j for j in queued}
        for p in placements:
            job = by_id[p.job_id]
            queued.remove(job)
            assert job.time_limit_s is not None
            running[job.id] = (
                RunningJob(job.id, p.gpus, now, job.time_limit_s),
                job.owner,
                now + job.time_limit_s,
            )
            runs[job.id] = Run(job.owner, job.gpus, now, None)
            if job.owner == "b":
                assert b_started_round is None
                b_started_round = rnd
        if expected_round is not None:
            break
    assert expected_round is not None  # A's jobs are short: a GPU frees within 40 rounds
    assert b_started_round == expected_round


@SETTINGS
@given(
    usage_a=st.sampled_from([0.0, 5.0, 100.0, 3600.0]),
    usage_b=st.sampled_from([0.0, 5.0, 100.0, 3600.0]),
    sub_a=st.integers(0, 100).map(float),
    sub_b=st.integers(0, 100).map(float),
    need_a=st.integers(1, 4),
    need_b=st.integers(1, 4),
    prio=st.integers(0, 3),
)
def test_lower_usage_first_when_only_one_fits(
    usage_a: float,
    usage_b: float,
    sub_a: float,
    sub_b: float,
    need_a: int,
    need_b: int,
    prio: int,
) -> None:
    # Free GPUs: enough for either job alone, not both.
    n_free = max(need_a, need_b)
    assume(need_a + need_b > n_free)
    a = QueuedJob(1, "a", need_a, prio, sub_a)  # no time limits: no backfill either
    b = QueuedJob(2, "b", need_b, prio, sub_b)
    usage = {"a": usage_a, "b": usage_b}
    placements = plan([a, b], list(range(n_free)), [], [29500, 29501], usage, NOW)
    assert len(placements) == 1
    if usage_a != usage_b:
        winner = a if usage_a < usage_b else b
    elif sub_a != sub_b:
        winner = a if sub_a < sub_b else b
    else:
        winner = a  # lower id
    assert placements[0].job_id == winner.id


@SETTINGS
@given(
    prio_low=st.integers(0, 5),
    bump=st.integers(1, 5),
    usage_low=st.sampled_from([0.0, 1e6]),
    usage_high=st.sampled_from([0.0, 1e6]),
)
def test_priority_beats_usage_and_submission(
    prio_low: int, bump: int, usage_low: float, usage_high: float
) -> None:
    low = QueuedJob(1, "a", 2, prio_low, 0.0)
    high = QueuedJob(2, "b", 2, prio_low + bump, 50.0)
    placements = plan(
        [low, high], [0, 1], [], [29500, 29501], {"a": usage_low, "b": usage_high}, NOW
    )
    assert [p.job_id for p in placements] == [high.id]


# --------------------------------------------------------------------------- examples


def q(jid: int, gpus: int, **kw: object) -> QueuedJob:
    args: dict[str, object] = {"owner": "alice", "priority": 0, "submitted_at": float(jid)}
    args.update(kw)
    return QueuedJob(jid, gpus=gpus, **args)  # type: ignore[arg-type]


def test_zero_gpu_job_takes_only_a_port() -> None:
    placements = plan([q(1, 0), q(2, 2)], [0, 1], [], [29500, 29501], {}, NOW)
    assert placements == [Placement(1, (), 29500), Placement(2, (0, 1), 29501)]


def test_zero_gpu_job_starts_with_every_gpu_busy() -> None:
    running = [RunningJob(9, (0, 1), NOW - 10, None)]
    assert plan([q(1, 0)], [0, 1], running, [29500], {}, NOW) == [Placement(1, (), 29500)]


def test_no_ports_left_nothing_placed() -> None:
    assert plan([q(1, 0), q(2, 1)], [0, 1, 2, 3], [], [], {}, NOW) == []


def test_ports_run_out_midway() -> None:
    placements = plan([q(1, 1), q(2, 1), q(3, 1)], [0, 1, 2, 3], [], [29600, 29500], {}, NOW)
    assert placements == [Placement(1, (0,), 29600), Placement(2, (1,), 29500)]


def test_not_before_in_the_future_is_skipped() -> None:
    jobs = [q(1, 1, not_before=NOW + 1), q(2, 1, not_before=NOW)]
    assert [p.job_id for p in plan(jobs, [0], [], [29500], {}, NOW)] == [2]


def test_job_bigger_than_all_usable_gpus_does_not_block() -> None:
    # 8 GPUs on the box, only 4 usable: the 6-GPU job can never start here. The
    # small job has no time limit, so it could not backfill past a real head.
    big = q(1, 6, priority=9)
    small = q(2, 1)
    placements = plan([big, small], [0, 1, 2, 3], [], [29500, 29501], {}, NOW)
    assert placements == [Placement(2, (0,), 29500)]


def test_unbounded_head_blocks_all_gpu_backfill() -> None:
    # The head needs all 4 GPUs; two are held by a job without a time limit, so
    # its start cannot be bounded (shadow = inf). No GPU job may pass it, however
    # short; a 0-GPU job may.
    running = [RunningJob(9, (0, 1), NOW - 10, None)]
    assert shadow(4, 2, running, NOW) == (math.inf, 0)
    head = q(1, 4, priority=5)
    short = q(2, 1, time_limit_s=1.0)
    cpu = q(3, 0)
    placements = plan([head, short, cpu], [0, 1, 2, 3], running, [29500, 29501], {}, NOW)
    assert placements == [Placement(3, (), 29500)]


def test_backfill_that_ends_before_shadow() -> None:
    running = [RunningJob(9, (0, 1), NOW - 10, 100.0)]  # ends at NOW + 90
    head = q(1, 4, priority=5, time_limit_s=1000.0)
    fits_in_time = q(2, 2, time_limit_s=90.0)  # ends exactly at the shadow time
    too_long = q(3, 2, time_limit_s=91.0)
    placements = plan(
        [head, too_long, fits_in_time], [0, 1, 2, 3], running, [29500, 29501], {}, NOW
    )
    assert placements == [Placement(2, (2, 3), 29500)]


def test_backfill_on_spare_gpus_at_shadow() -> None:
    # At NOW + 90 all six GPUs are free and the head needs five: one is spare.
    running = [RunningJob(9, (0, 1, 2, 3), NOW - 10, 100.0)]
    head = q(1, 5, priority=5, time_limit_s=10.0)
    no_limit = q(2, 1)  # could hold the spare GPU forever, but never backfills
    long1 = q(3, 1, time_limit_s=5000.0)
    long2 = q(4, 1, time_limit_s=5000.0)
    placements = plan([head, no_limit, long1, long2], list(range(6)), running, [1, 2, 3], {}, NOW)
    assert placements == [Placement(3, (4,), 1)]


def test_running_job_on_external_gpus_does_not_free_usable_ones() -> None:
    # Job 8 holds GPUs 4-5, which are no longer usable; when it ends, they do not
    # come back to ddpq. The head (2 GPUs) must wait for job 9 (GPU 1, NOW + 500).
    running = [
        RunningJob(8, (4, 5), NOW - 10, 20.0),  # ends at NOW + 10
        RunningJob(9, (1,), NOW - 10, 510.0),  # ends at NOW + 500
    ]
    head = q(1, 2, priority=5, time_limit_s=10.0)
    long = q(2, 1, time_limit_s=5000.0)  # would take GPU 0 past NOW + 500
    placements = plan([head, long], [0, 1], running, [29500, 29501], {}, NOW)
    assert placements == []


def test_shadow_of_overdue_jobs_is_now() -> None:
    # Both jobs are past their time limits (being stopped): their GPUs are due now.
    a = RunningJob(8, (0,), NOW - 500, 100.0)
    b = RunningJob(9, (1,), NOW - 300, 100.0)
    assert shadow(2, 1, [a, b], NOW) == (NOW, 1)
    assert shadow(2, 1, [b, a], NOW) == (NOW, 1)


def test_jobs_ending_together_all_count_at_shadow() -> None:
    # Jobs 8 and 9 both end at NOW + 90: all three of their GPUs are back then,
    # whichever order the store lists them in.
    a = RunningJob(8, (0,), NOW - 10, 100.0)
    b = RunningJob(9, (1, 2), NOW - 10, 100.0)
    assert shadow(2, 1, [a, b], NOW) == (NOW + 90, 2)
    assert shadow(2, 1, [b, a], NOW) == (NOW + 90, 2)
    head = q(1, 2, priority=5, time_limit_s=10.0)
    long = q(2, 1, time_limit_s=5000.0)  # on the spare GPU at the shadow time
    for running in ([a, b], [b, a]):
        placements = plan([head, long], [0, 1, 2, 3], running, [29500, 29501], {}, NOW)
        assert placements == [Placement(2, (3,), 29500)]


def test_higher_priority_first_then_usage_then_submission() -> None:
    jobs = [
        q(1, 1, owner="heavy", submitted_at=1.0),
        q(2, 1, owner="light", submitted_at=2.0),
        q(3, 1, owner="heavy", submitted_at=0.0, priority=1),
        q(4, 1, owner="light", submitted_at=3.0),
    ]
    usage = {"heavy": 1000.0, "light": 10.0}
    placements = plan(jobs, [0, 1, 2, 3], [], [1, 2, 3, 4], usage, NOW)
    assert [p.job_id for p in placements] == [3, 2, 4, 1]
    assert [p.gpus for p in placements] == [(0,), (1,), (2,), (3,)]


def test_shadow_counts_jobs_placed_in_this_round() -> None:
    # Job 1 starts now on GPUs 0-1 for 100 s; the head then needs all four, so it
    # can start at NOW + 100 at the latest, and a 50 s job may use GPUs 2-3 now.
    first = q(1, 2, priority=5, time_limit_s=100.0)
    head = q(2, 4, priority=4, time_limit_s=10.0)
    short = q(3, 2, time_limit_s=50.0)
    placements = plan([first, head, short], [0, 1, 2, 3], [], [1, 2, 3], {}, NOW)
    assert placements == [Placement(1, (0, 1), 1), Placement(3, (2, 3), 2)]


def test_the_plan_says_why_each_unplaced_job_waits() -> None:
    now = 100.0
    big = QueuedJob(1, "a", 9, 0, 1.0)
    head = QueuedJob(2, "a", 3, 0, 2.0)
    behind = QueuedJob(3, "b", 1, 0, 3.0)
    backing_off = QueuedJob(4, "a", 1, 0, 4.0, not_before=now + 5)
    placed = QueuedJob(5, "c", 0, 5, 5.0)
    result = plan_explained(
        [big, head, behind, backing_off, placed],
        [0, 1, 2, 3],
        [RunningJob(9, (0, 1), now - 10)],  # two of the four GPUs are taken
        [29600, 29601],
        {},
        now,
    )
    assert result.placements == [Placement(5, (), 29600)]
    assert result.reasons == {
        1: "needs 9 GPUs; only 4 can be handed out",
        2: "waiting for 3 free GPUs (next in line)",
        3: "waiting in line",
        4: "waiting out its back-off",
    }
    no_ports = plan_explained([head], [0, 1, 2, 3], [], [], {}, now).reasons
    assert no_ports == {2: "waiting for a free rendezvous port"}


# --------------------------------------------------------------------------- sweep caps

SWEEPS = (1, 2, 3)
sweep_ids = st.one_of(st.none(), st.sampled_from(SWEEPS))
caps_of_sweeps = st.dictionaries(st.sampled_from(SWEEPS), st.integers(1, 4))
running_of_sweeps = st.dictionaries(st.sampled_from(SWEEPS), st.integers(0, 5))


@dataclass(frozen=True)
class Capped:
    s: Scenario
    caps: SweepCaps

    def run_plan(self, caps: SweepCaps | None = None) -> list[Placement]:
        s = self.s
        return plan(
            s.queued, s.usable, s.running, s.ports, s.usage, s.now, sweep_caps=caps or self.caps
        )


@st.composite
def capped_scenarios(draw: st.DrawFn) -> Capped:
    """Any scenario, its queued jobs dealt into a few sweeps (some capped, some members
    of which already run) or left alone."""
    s = draw(any_scenario)
    queued = tuple(replace(j, sweep_id=draw(sweep_ids)) for j in s.queued)
    cap = draw(caps_of_sweeps)
    running = draw(running_of_sweeps)
    return Capped(replace(s, queued=queued), SweepCaps(cap, running))


def held_back(c: Capped, placements: Sequence[Placement]) -> set[int]:
    """The members the cap holds back, from the rule: a member waits when, at its turn in
    the documented order, its sweep's running members plus those placed before it reach
    the cap (and then so does every later one: the count never goes down in a pass)."""
    placed = {p.job_id for p in placements}
    count = dict(c.caps.running)
    out = set()
    for job in in_order(eligible(c.s), c.s.usage):
        sid = job.sweep_id
        if sid is None or sid not in c.caps.cap:
            continue
        if count.get(sid, 0) >= c.caps.cap[sid]:
            out.add(job.id)
        elif job.id in placed:
            count[sid] = count.get(sid, 0) + 1
    return out


@SETTINGS
@given(capped_scenarios(), st.randoms(use_true_random=False))
def test_a_sweep_never_runs_more_than_its_cap_whatever_the_order(
    c: Capped, rnd: random.Random
) -> None:
    placements = c.run_plan()
    sweep_of = {j.id: j.sweep_id for j in c.s.queued}
    for sid, cap in c.caps.cap.items():
        started = sum(1 for p in placements if sweep_of[p.job_id] == sid)
        assert started <= max(0, cap - c.caps.running.get(sid, 0))
    # The queue's order as given makes no difference.
    queued = list(c.s.queued)
    rnd.shuffle(queued)
    s = c.s
    again = plan(queued, s.usable, s.running, s.ports, s.usage, s.now, sweep_caps=c.caps)
    assert again == placements


@SETTINGS
@given(capped_scenarios())
def test_members_held_back_by_a_cap_delay_nobody(c: Capped) -> None:
    """The plan with caps is the plan without them on a queue that lacks the members the
    cap holds back: they take no GPU, no port, and are never the head."""
    placements = c.run_plan()
    back = held_back(c, placements)
    rest = replace(c.s, queued=tuple(j for j in c.s.queued if j.id not in back))
    assert placements == Capped(rest, NO_SWEEP_CAPS).run_plan()
    s = c.s
    reasons = plan_explained(
        s.queued, s.usable, s.running, s.ports, s.usage, s.now, sweep_caps=c.caps
    ).reasons
    usable = len(set(c.s.usable))
    for job in c.s.queued:
        if job.id in back:
            # Unless it can never run here at all: that is said first, as it is for any job.
            want = "only" if job.gpus > usable else "at once, its cap"
            assert want in reasons[job.id], reasons[job.id]


@SETTINGS
@given(capped_scenarios())
def test_a_cap_that_is_never_reached_changes_nothing(c: Capped) -> None:
    loose = SweepCaps({sid: len(c.s.queued) + 1 for sid in c.caps.cap}, {})
    assert c.run_plan(loose) == c.run_plan(NO_SWEEP_CAPS)


def test_a_capped_sweep_starts_its_first_members_and_says_why_the_rest_wait() -> None:
    members = [QueuedJob(i, "a", 1, 0, float(i), sweep_id=7) for i in range(1, 6)]
    other = QueuedJob(9, "b", 1, 0, 9.0)
    caps = SweepCaps({7: 2}, {7: 0})
    placed = plan([*members, other], [0, 1, 2, 3], [], [1, 2, 3, 4], {}, NOW, sweep_caps=caps)
    assert [p.job_id for p in placed] == [1, 2, 9]
    reasons = plan_explained(
        [*members, other], [0, 1, 2, 3], [], [1, 2, 3, 4], {}, NOW, sweep_caps=caps
    ).reasons
    assert reasons == {i: "sweep 7 runs 2 members at once, its cap" for i in (3, 4, 5)}
    # One already runs: one more may start.
    caps = SweepCaps({7: 2}, {7: 1})
    placed = plan(members, [0, 1, 2, 3], [], [1, 2, 3, 4], {}, NOW, sweep_caps=caps)
    assert [p.job_id for p in placed] == [1]
