"""The planner with jobs that share GPUs by memory, per-user limits and reservations.

The invariants are checked by oracles written from the documented rules (core.sharing,
core.limits), not from plan.py: for one pass over random states, and over random
sequences of submissions, ends and outside use, applying each pass's placements.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpq.core.limits import EVERYONE, NO_LIMITS, Limit, Limits, Reservation
from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler import (
    Placement,
    QueuedJob,
    RunningJob,
    plan,
    plan_explained,
)
from ddpq.core.sharing import GpuMemory

G = 1 << 30
NOW = 50_000.0
OWNERS = ("alice", "bob", "carol")
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICIES = st.sampled_from(list(Policy))


# ---------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Holder:
    """A job holding GPUs: whole (mem None) or a share of each."""

    id: int
    owner: str
    gpus: tuple[int, ...]
    mem: int | None
    cap: int | None
    ends: float


def check_gpus(holders: Sequence[Holder], memory: GpuMemory, outside_ok: bool = True) -> list[str]:
    """What is wrong with these holders together (empty: nothing)."""
    wrong = []
    for g in {g for h in holders for g in h.gpus}:
        on = [h for h in holders if g in h.gpus]
        whole = [h for h in on if h.mem is None]
        if whole and len(on) > 1:
            wrong.append(f"GPU {g}: whole-GPU job {whole[0].id} shares it with {len(on) - 1}")
        shared = [h for h in on if h.mem is not None]
        if shared:
            reserved = sum(h.mem for h in shared if h.mem is not None)
            room = memory.total.get(g, 0) - memory.headroom
            if outside_ok:
                room -= memory.outside.get(g, 0)
            if reserved > room:
                wrong.append(f"GPU {g}: {reserved} reserved, room for {room}")
            caps = [h.cap for h in shared if h.cap is not None]
            if caps and len(shared) > min(caps):
                wrong.append(f"GPU {g}: {len(shared)} jobs, a cap of {min(caps)}")
    return wrong


def holders_of(
    running: Sequence[RunningJob], queued: Sequence[QueuedJob], placed: Sequence[Placement]
) -> list[Holder]:
    out = [
        Holder(
            r.id,
            r.owner,
            r.gpus,
            r.mem_bytes,
            r.share_cap,
            math.inf if r.time_limit_s is None else r.started_at + r.time_limit_s,
        )
        for r in running
    ]
    by_id = {q.id: q for q in queued}
    for p in placed:
        q = by_id[p.job_id]
        ends = math.inf if q.time_limit_s is None else NOW + q.time_limit_s
        out.append(Holder(q.id, q.owner, p.gpus, q.mem_bytes, q.share_cap, ends))
    return out


# ---------------------------------------------------------------------------- inputs

mems = st.sampled_from([2 * G, 3 * G, 5 * G, 6 * G, 8 * G, 15 * G, 17 * G])
caps = st.one_of(st.none(), st.none(), st.integers(1, 4))
limits_s = st.one_of(st.none(), st.sampled_from([60.0, 600.0, 3600.0]))
# The strategies a draw uses, made once: Hypothesis validates each new strategy object when
# it is first drawn from, so one made inside a draw costs that on every example (a fifth of
# these tests' CPU). Those made with the example's numbers: one per set of numbers.
owners = st.sampled_from(OWNERS)
gpu_totals = st.sampled_from([16 * G, 16 * G, 24 * G])
outside_uses = st.sampled_from([0, 0, 0, 3 * G, 10 * G])
headrooms = st.sampled_from([0, G])
attained = st.sampled_from([0, 10_000])
ages = st.sampled_from([0, 100, 1000])
maybe_0_to_3 = st.one_of(st.none(), st.integers(0, 3))
owner_sets = st.sets(owners)
maybe_1_to_4 = st.one_of(st.none(), st.integers(1, 4))
reservation_starts = st.sampled_from([-100.0, 0.0, 300.0, 1200.0, 7200.0])
reservation_ends = st.sampled_from([0.0, 5000.0])


@functools.cache
def memories(n: int) -> st.SearchStrategy[GpuMemory]:
    return _memories(n)


@st.composite
def _memories(draw: st.DrawFn, n: int) -> GpuMemory:
    total = {g: draw(gpu_totals) for g in range(n)}
    outside = {g: draw(outside_uses) for g in range(n)}
    return GpuMemory(total, outside, draw(headrooms))


@functools.cache
def queued_jobs(first_id: int, n_gpus: int, count: int) -> st.SearchStrategy[list[QueuedJob]]:
    return _queued_jobs(first_id, n_gpus, count)


@st.composite
def _queued_jobs(draw: st.DrawFn, first_id: int, n_gpus: int, count: int) -> list[QueuedJob]:
    jobs = []
    for i in range(count):
        shares = draw(st.booleans())
        jobs.append(
            QueuedJob(
                id=first_id + i,
                owner=draw(owners),
                gpus=draw(st.integers(1, min(3, n_gpus))) if shares else draw(st.integers(0, 3)),
                priority=draw(st.integers(0, 2)),
                submitted_at=float(draw(st.integers(0, 1000))),
                time_limit_s=draw(limits_s),
                mem_bytes=draw(mems) if shares else None,
                share_cap=draw(caps) if shares else None,
                attained_s=float(draw(attained)),
            )
        )
    return jobs


@dataclass(frozen=True)
class State:
    n: int
    memory: GpuMemory
    usable: tuple[int, ...]
    running: tuple[RunningJob, ...]
    queued: tuple[QueuedJob, ...]
    limits: Limits = NO_LIMITS
    reservations: tuple[Reservation, ...] = ()
    policy: Policy = Policy.LAS

    def plan(self) -> list[Placement]:
        return plan(
            self.queued,
            self.usable,
            self.running,
            list(range(29600, 29700)),
            {},
            NOW,
            order=Order(self.policy, {}),
            memory=self.memory,
            limits=self.limits,
            reservations=self.reservations,
        )


@st.composite
def states(draw: st.DrawFn, with_limits: bool = False, with_reservations: bool = False) -> State:
    n = draw(st.integers(1, 6))
    memory = draw(memories(n))
    # External GPUs (outside use) are not handed out whole, as --external-gpus avoid does.
    usable = tuple(g for g in range(n) if not memory.outside.get(g))
    # Running jobs: some whole (disjoint), some sharing (within the room they found then).
    running: list[RunningJob] = []
    taken: set[int] = set()  # held whole
    shared: set[int] = set()
    pool_gpus = list(range(n))
    for i in range(draw(st.integers(0, 5))):
        owner = draw(owners)
        start = NOW - draw(ages)
        limit = draw(limits_s)
        if draw(st.booleans()):
            free = [g for g in pool_gpus if g not in taken | shared and g in usable]
            if not free:
                continue
            k = draw(st.integers(1, min(2, len(free))))
            gpus = tuple(free[:k])
            taken.update(gpus)
            running.append(RunningJob(i + 1, gpus, start, limit, owner))
        else:
            candidates = [g for g in pool_gpus if g not in taken]
            if not candidates:
                continue
            g = draw(st.sampled_from(candidates))
            mem = draw(mems)
            on = [r for r in running if g in r.gpus]
            room = memory.total[g] - memory.headroom - memory.outside.get(g, 0)
            if sum(r.mem_bytes or 0 for r in on) + mem > room:
                continue
            shared.add(g)
            running.append(RunningJob(i + 1, (g,), start, limit, owner, mem, None))
    queued = draw(queued_jobs(100, n, draw(st.integers(0, 10))))
    limits = Limits()
    if with_limits:
        per = {
            o: Limit(
                draw(maybe_0_to_3),
                draw(maybe_0_to_3),
            )
            for o in draw(owner_sets)
        }
        limits = Limits(per, Limit(draw(maybe_1_to_4), None))
    reservations: tuple[Reservation, ...] = ()
    if with_reservations:
        reservations = tuple(
            Reservation(
                i + 1,
                draw(owners),
                draw(st.integers(1, n)),
                NOW + draw(reservation_starts),
                NOW + 10_000.0 + draw(reservation_ends),
            )
            for i in range(draw(st.integers(1, 2)))
        )
    return State(
        n,
        memory,
        usable,
        tuple(running),
        tuple(queued),
        limits,
        reservations,
        draw(POLICIES),
    )


# ---------------------------------------------------------------------------- one pass


@SETTINGS
@given(states())
def test_memory_is_never_over_committed_and_whole_gpus_never_shared(s: State) -> None:
    placed = s.plan()
    by_id = {q.id: q for q in s.queued}
    assert len({p.job_id for p in placed}) == len(placed)
    before = check_gpus(holders_of(s.running, [], []), s.memory)
    held_whole = {g for r in s.running if r.mem_bytes is None for g in r.gpus}
    shared = {g for r in s.running if r.mem_bytes is not None for g in r.gpus}
    for p in placed:
        job = by_id[p.job_id]
        assert len(set(p.gpus)) == len(p.gpus) == job.gpus
        assert p.mem_bytes == job.mem_bytes
        if job.mem_bytes is None:
            for g in p.gpus:
                assert g in s.usable and g not in held_whole | shared
        else:
            for g in p.gpus:
                assert g in s.memory.total and g not in held_whole
    assert before == []  # as generated
    assert check_gpus(holders_of(s.running, s.queued, placed), s.memory) == []


@SETTINGS
@given(states(), st.randoms(use_true_random=False))
def test_deterministic_with_sharing(s: State, rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    first = s.plan()
    q, r = list(s.queued), list(s.running)
    rnd.shuffle(q)
    rnd.shuffle(r)
    assert replace(s, queued=tuple(q), running=tuple(r)).plan() == first


# ---------------------------------------------------------------------------- over time


@dataclass
class World:
    """A host that runs each pass's placements until the sequence ends them."""

    n: int
    memory: GpuMemory
    limits: Limits = NO_LIMITS
    reservations: tuple[Reservation, ...] = ()
    policy: Policy = Policy.LAS
    running: list[RunningJob] = field(default_factory=list)
    queued: list[QueuedJob] = field(default_factory=list)
    next_id: int = 1

    @property
    def usable(self) -> tuple[int, ...]:
        return tuple(g for g in range(self.n) if not self.memory.outside.get(g))

    def step(self) -> list[Placement]:
        placed = plan(
            self.queued,
            self.usable,
            self.running,
            list(range(29600, 29700)),
            {},
            NOW,
            order=Order(self.policy, {}),
            memory=self.memory,
            limits=self.limits,
            reservations=self.reservations,
        )
        wrong = check_gpus(holders_of(self.running, self.queued, placed), self.memory)
        assert wrong == [], wrong
        by_id = {q.id: q for q in self.queued}
        for p in placed:
            q = by_id.pop(p.job_id)
            self.running.append(
                RunningJob(q.id, p.gpus, NOW, q.time_limit_s, q.owner, q.mem_bytes, q.share_cap)
            )
        self.queued = list(by_id.values())
        return placed


events = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 10_000)),
        st.tuples(st.just("end"), st.integers(0, 10_000)),
        st.tuples(st.just("outside"), st.integers(0, 10_000)),
    ),
    min_size=1,
    max_size=30,
)


@SETTINGS
@given(st.integers(1, 4), POLICIES, events, st.data())
def test_over_any_sequence_of_submissions_and_ends_nothing_is_over_committed(
    n: int, policy: Policy, sequence: list[tuple[str, int]], data: st.DataObject
) -> None:
    world = World(n, GpuMemory({g: 16 * G for g in range(n)}, {}, G), policy=policy)
    for kind, pick in sequence:
        if kind == "submit":
            (job,) = data.draw(queued_jobs(world.next_id, n, 1))
            world.next_id += 1
            world.queued.append(job)
        elif kind == "end" and world.running:
            world.running.pop(pick % len(world.running))
        elif kind == "outside":
            g = pick % n
            used = sum(r.mem_bytes or 0 for r in world.running if g in r.gpus)
            # Outside use grows only into what is free (a process that took more would
            # have made a running job fail; the planner cannot undo that).
            outside = dict(world.memory.outside)
            outside[g] = min(pick % (8 * G), max(0, 15 * G - used))
            if any(r.mem_bytes is None and g in r.gpus for r in world.running):
                outside[g] = 0  # a whole-GPU job's own processes: not outside
            world.memory = replace(world.memory, outside=outside)
        world.step()


# ---------------------------------------------------------------------------- limits


def owner_use(holders: Sequence[Holder]) -> dict[str, tuple[int, set[int]]]:
    out: dict[str, tuple[int, set[int]]] = {}
    for h in holders:
        jobs, gpus = out.get(h.owner, (0, set()))
        out[h.owner] = (jobs + 1, gpus | set(h.gpus))
    return out


@SETTINGS
@given(states(with_limits=True))
def test_no_job_starts_past_its_owners_limit(s: State) -> None:
    placed = s.plan()
    before = owner_use(holders_of(s.running, [], []))
    after = owner_use(holders_of(s.running, s.queued, placed))
    by_id = {q.id: q for q in s.queued}
    for owner in {by_id[p.job_id].owner for p in placed}:
        limit = s.limits.of(owner)
        jobs, gpus = after[owner]
        _, had_gpus = before.get(owner, (0, set()))
        if limit.jobs is not None:
            assert jobs <= limit.jobs, (owner, jobs, limit)
        if limit.gpus is not None and gpus != had_gpus:
            assert len(gpus) <= limit.gpus, (owner, gpus, limit)


def test_the_default_limit_and_a_users_own() -> None:
    limits = Limits({"alice": Limit(gpus=4)}, Limit(gpus=1, jobs=2))
    assert limits.of("alice") == Limit(4, 2)
    assert limits.of("bob") == Limit(1, 2)
    assert EVERYONE == "*"


def q(jid: int, owner: str = "alice", gpus: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(jid, owner, gpus, 0, float(jid), **kw)  # type: ignore[arg-type]


def test_a_user_at_their_limit_waits_and_the_reason_names_it() -> None:
    limits = Limits({"alice": Limit(gpus=2, jobs=10)})
    running = [RunningJob(1, (0, 1), NOW - 10, None, "alice")]
    queued = [q(2), q(3, "bob")]
    result = plan_explained(queued, range(4), running, [29600, 29601], {}, NOW, limits=limits)
    assert [p.job_id for p in result.placements] == [3]
    assert result.reasons == {2: "at alice's limit of 2 GPUs"}
    jobs = Limits(default=Limit(jobs=1))
    result = plan_explained(queued, range(4), running, [29600], {}, NOW, limits=jobs)
    assert result.reasons == {2: "at alice's limit of 1 running job"}
    too_big = plan_explained([q(4, gpus=3)], range(4), [], [29600], {}, NOW, limits=limits)
    assert too_big.reasons == {4: "needs 3 GPUs, more than alice's limit of 2"}


def test_sharing_jobs_count_each_gpu_once_against_the_limit() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G}, {}, 0)
    limits = Limits({"alice": Limit(gpus=1)})
    running = [RunningJob(1, (0,), NOW, None, "alice", 5 * G)]
    queued = [q(2, mem_bytes=5 * G), q(3, mem_bytes=5 * G), q(4, mem_bytes=5 * G)]
    placed = plan(queued, [0, 1], running, [1, 2, 3], {}, NOW, memory=memory, limits=limits)
    # Two more fit on GPU 0, which alice holds already; GPU 1 would be her second.
    assert [(p.job_id, p.gpus) for p in placed] == [(2, (0,)), (3, (0,))]


# ---------------------------------------------------------------------------- reservations


def shortfall(
    holders: Sequence[Holder], usable: Sequence[int], reservations: Sequence[Reservation], at: float
) -> int:
    """Written from core.limits' doc: GPUs the reservations in force at ``at`` lack then."""
    still: dict[int, set[str]] = {g: set() for g in usable}
    for h in holders:
        for g in h.gpus:
            if g in still and h.ends > at:
                still[g].add(h.owner)
    free = sum(1 for owners in still.values() if not owners)
    asked = sum(
        max(0, r.gpus - sum(1 for o in still.values() if o == {r.user}))
        for r in reservations
        if r.start <= at < r.end
    )
    return max(0, asked - free)


@SETTINGS
@given(states(with_reservations=True))
def test_no_start_leaves_a_reservation_shorter_of_gpus(s: State) -> None:
    placed = s.plan()
    by_id = {q.id: q for q in s.queued}
    done: list[Placement] = []
    for p in placed:  # one at a time, as the planner placed them
        for r in s.reservations:
            at = max(NOW, r.start)
            if r.end <= NOW:
                continue
            before = shortfall(holders_of(s.running, s.queued, done), s.usable, s.reservations, at)
            after = shortfall(
                holders_of(s.running, s.queued, [*done, p]), s.usable, s.reservations, at
            )
            assert after <= before, (by_id[p.job_id], r)
        done.append(p)


def test_a_reservation_holds_its_gpus() -> None:
    r = Reservation(7, "alice", 2, NOW + 3600, NOW + 7200)
    queued = [
        q(1, "bob", 1, time_limit_s=600.0),  # ends before the window: may use them
        q(2, "bob", 1),  # no time limit: would run into it
        q(3, "bob", 1, time_limit_s=7200.0),  # would run into it
        q(4, "alice", 1),  # alice's own: counts towards it
    ]
    result = plan_explained(queued, [0, 1], [], list(range(1, 10)), {}, NOW, reservations=[r])
    assert [p.job_id for p in result.placements] == [1, 4]
    assert result.reasons == {
        2: "without a time limit it would run into reservation 7 (2 GPUs for alice)",
        3: "its time limit would run into reservation 7 (2 GPUs for alice)",
    }
    # In force: only alice's jobs get the two it keeps; the third GPU is anyone's.
    active = Reservation(8, "alice", 2, NOW - 1, NOW + 7200)
    queued = [q(1, "bob"), q(2, "bob"), q(3, "alice"), q(4, "alice"), q(5, "alice")]
    result = plan_explained(
        queued, [0, 1, 2], [], list(range(1, 10)), {}, NOW, reservations=[active]
    )
    assert sorted(p.job_id for p in result.placements) == [1, 3, 4]
    assert result.reasons[2] == "the free GPUs are kept for reservation 8 (2 GPUs for alice)"


# ---------------------------------------------------------------------------- done when


def test_three_5g_jobs_share_a_16g_gpu_a_fourth_waits_and_a_whole_gpu_job_never_joins() -> None:
    memory = GpuMemory({0: 16 * G}, {}, G)
    queued = [q(i, mem_bytes=5 * G) for i in (1, 2, 3, 4)] + [q(5)]
    placed = plan(queued, [0], [], list(range(1, 10)), {}, NOW, memory=memory)
    assert [(p.job_id, p.gpus, p.mem_bytes) for p in placed] == [
        (i, (0,), 5 * G) for i in (1, 2, 3)
    ]
    running = [RunningJob(p.job_id, p.gpus, NOW, None, "alice", 5 * G) for p in placed]
    rest = [j for j in queued if j.id in (4, 5)]
    assert plan(rest, [0], running, [1], {}, NOW, memory=memory) == []
    reasons = plan_explained(rest, [0], running, [1], {}, NOW, memory=memory).reasons
    assert reasons[4] == "waiting for 5G of memory free on a GPU (next in line)"
    # Once two have ended, the fourth joins the last; the whole-GPU job still waits.
    assert plan(rest, [0], running[2:], [1], {}, NOW, memory=memory) == [
        Placement(4, (0,), 1, 5 * G)
    ]
    # With the GPU empty, the whole-GPU job takes it whole: no sharing job joins it.
    fifo = Order(Policy.FIFO, {})
    placed = plan(queued[::-1], [0], [], [1, 2, 3], {}, NOW, order=fifo, memory=memory)
    assert [p.job_id for p in placed] == [1, 2, 3]  # FIFO: submission order (job 5 last)
    whole_first = [replace(queued[4], submitted_at=-1.0), *queued[:4]]
    placed = plan(whole_first, [0], [], [1, 2], {}, NOW, memory=memory)
    assert [p.job_id for p in placed] == [5]


def test_an_outside_process_holding_10g_leaves_room_for_one() -> None:
    memory = GpuMemory({0: 16 * G}, {0: 10 * G}, G)
    queued = [q(1, mem_bytes=5 * G), q(2, mem_bytes=5 * G)]
    # GPU 0 is external: not usable whole, but its memory may be shared.
    assert [p.job_id for p in plan(queued, [], [], [1, 2], {}, NOW, memory=memory)] == [1]


def test_a_share_cap_and_a_reservation_too_large_for_any_gpu() -> None:
    memory = GpuMemory({0: 16 * G}, {}, G)
    queued = [q(1, mem_bytes=2 * G, share_cap=2), q(2, mem_bytes=2 * G), q(3, mem_bytes=2 * G)]
    assert [p.job_id for p in plan(queued, [0], [], [1, 2, 3], {}, NOW, memory=memory)] == [1, 2]
    big = [q(9, mem_bytes=20 * G)]
    assert plan(big, [0], [], [1], {}, NOW, memory=memory) == []
    assert plan_explained(big, [0], [], [1], {}, NOW, memory=memory).reasons == {
        9: "asks 20G of GPU memory; the GPUs here have at most 15G to share (1G of each kept free)"
    }


def test_sharing_jobs_fill_shared_gpus_before_idle_ones() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G, 2: 16 * G}, {2: 4 * G}, 0)
    running = [RunningJob(1, (1,), NOW, None, "bob", 8 * G)]
    queued = [q(2, mem_bytes=6 * G), q(3, mem_bytes=6 * G), q(4, mem_bytes=6 * G)]
    placed = plan(queued, [0, 1], running, [1, 2, 3], {}, NOW, memory=memory)
    # GPU 1 (shared already) first; then GPU 2, which no whole-GPU job may have (and then
    # shares); GPU 0, the one whole-GPU jobs could take, stays whole.
    assert [p.gpus for p in placed] == [(1,), (2,), (2,)]


def test_a_sharing_backfill_never_delays_a_blocked_head() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G}, {}, 0)
    running = [RunningJob(1, (0,), NOW - 100, 600.0, "bob")]  # GPU 0 back at NOW + 500
    head = QueuedJob(2, "alice", 2, 5, 0.0, 3600.0)
    short = q(3, "carol", mem_bytes=4 * G, time_limit_s=400.0)  # ends before the shadow
    long = q(4, "carol", mem_bytes=4 * G, time_limit_s=4000.0)
    order = Order(Policy.FAIRSHARE, {})
    placed = plan(
        [head, short, long], [0, 1], running, [1, 2, 3], {}, NOW, order=order, memory=memory
    )
    assert [p.job_id for p in placed] == [3]
