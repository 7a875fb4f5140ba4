"""The placers, the backfill stage, the preemption stage, and the pipeline's promise: the
reason a waiting job shows is the one from the stage that stopped it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpq.core.limits import Limit, Limits
from ddpq.core.policy import Backfill, Order, Policy
from ddpq.core.scheduler import decide, plan
from ddpq.core.scheduler.backfill import Line
from ddpq.core.scheduler.gates import GATES
from ddpq.core.scheduler.model import (
    Placement,
    PortBudget,
    QueuedJob,
    RunningJob,
    SweepCaps,
    World,
)
from ddpq.core.scheduler.placers import (
    FIRST_FREE,
    MEMORY_SHARING,
    FirstFree,
    MemorySharing,
    placer_for,
)
from ddpq.core.scheduler.preemption import free_after, waiting_for_gpus
from ddpq.core.scheduler.state import Pass
from ddpq.core.sharing import GpuMemory, MemoryPool, Sharer
from tests.core.test_plan_sharing import NOW, State, states

G = 1 << 30
FAIR = Order(Policy.FAIRSHARE, {})


def q(jid: int, owner: str = "alice", gpus: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(jid, owner, gpus, 0, float(jid), **kw)  # type: ignore[arg-type]


def world(**kw: object) -> World:
    fields: dict[str, object] = {
        "usable_gpus": [0, 1, 2, 3],
        "running": [],
        "free_ports": list(range(29600, 29610)),
        "now": NOW,
    }
    fields.update(kw)
    return World(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ placers


def test_placer_for_picks_whole_gpus_or_a_share_by_memory() -> None:
    assert placer_for(q(1)) is FIRST_FREE and isinstance(FIRST_FREE, FirstFree)
    assert placer_for(q(1, mem_bytes=G)) is MEMORY_SHARING
    assert isinstance(MEMORY_SHARING, MemorySharing)


@pytest.mark.parametrize(
    ("free", "gpus", "chosen"),
    [([0, 1, 2, 3], 2, (0, 1)), ([3, 5], 2, (3, 5)), ([1], 2, None), ([4], 0, ()), ([], 0, ())],
)
def test_first_free_takes_the_first_free_gpus(
    free: list[int], gpus: int, chosen: tuple[int, ...] | None
) -> None:
    pool = MemoryPool(GpuMemory(), [], [])
    assert FIRST_FREE.choose(q(1, gpus=gpus), free, pool) == chosen


def test_first_free_blocks_what_it_takes_for_sharing_jobs() -> None:
    pool = MemoryPool(GpuMemory({0: 16 * G, 1: 16 * G}, {}, 0), [], [])
    FIRST_FREE.take(q(1), (0,), pool)
    assert not pool.fits(0, Sharer(G, None)) and pool.fits(1, Sharer(G, None))


def test_memory_sharing_fills_shared_gpus_tightest_first_then_idle_ones() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G, 2: 16 * G, 3: 16 * G}, {3: 2 * G}, 0)
    pool = MemoryPool(memory, [((1,), Sharer(8 * G, None)), ((2,), Sharer(4 * G, None))], [])
    job = q(1, mem_bytes=6 * G)
    assert MEMORY_SHARING.choose(job, [0], pool) == (1,)  # shared, tightest fit
    assert MEMORY_SHARING.choose(replace(job, gpus=3), [0], pool) == (1, 2, 3)
    assert MEMORY_SHARING.choose(job, [0], pool, only={0}) == (0,)
    assert MEMORY_SHARING.choose(job, [0], pool, only={0}, idle=False) is None
    assert MEMORY_SHARING.choose(replace(job, mem_bytes=15 * G), [0], pool) == (0,)
    assert MEMORY_SHARING.choose(replace(job, mem_bytes=17 * G), [0], pool) is None
    MEMORY_SHARING.take(job, (1,), pool)
    assert pool.left(1) == 2 * G


# ----------------------------------------------------------------------------- backfill


def test_backfill_none_stops_the_pass_at_the_head() -> None:
    p = Pass(world())
    line = Line(Backfill.NONE)
    assert line.admit(q(1, gpus=9), None, p) == "waiting for 9 free GPUs (next in line)"
    assert p.stopped


def test_backfill_greedy_names_one_head_and_lets_anything_that_fits_start() -> None:
    p = Pass(world())
    line = Line(Backfill.GREEDY)
    assert line.admit(q(1, gpus=9), None, p) == "waiting for 9 free GPUs (next in line)"
    assert line.admit(q(2, mem_bytes=G), None, p) == "waiting in line"
    assert line.admit(q(3), (0,), p) is None
    assert not p.stopped and line.shadow is None


def test_backfill_easy_passes_the_head_only_where_it_cannot_be_delayed() -> None:
    running = [RunningJob(9, (0, 1), NOW - 10, 100.0, "bob")]  # GPUs 0-1 back at NOW + 90
    p = Pass(world(running=running))
    line = Line(Backfill.EASY)
    assert line.admit(q(1, gpus=3), None, p) == "waiting for 3 free GPUs (next in line)"
    assert (line.shadow, line.extra) == (NOW + 90, 1)
    assert line.admit(q(2), (2,), p) == "waiting in line"  # no time limit
    assert line.admit(q(3, time_limit_s=60.0), (2,), p) is None  # ends before the shadow
    assert line.admit(q(4, time_limit_s=600.0), (2,), p) is None  # the spare GPU
    assert line.admit(q(5, time_limit_s=600.0), (3,), p) == "waiting in line"  # no spare left
    assert line.admit(q(6, gpus=0), (), p) is None  # takes no GPU
    assert line.admit(q(7), None, p) == "waiting in line"


def test_a_sharing_head_is_told_how_much_memory_it_waits_for() -> None:
    for gpus, on in ((1, "a GPU"), (2, "2 GPUs")):
        line = Line(Backfill.EASY)
        said = line.admit(q(1, gpus=gpus, mem_bytes=5 * G), None, Pass(world()))
        assert said == f"waiting for 5G of memory free on {on} (next in line)"


# --------------------------------------------------------------- the pipeline's reasons


def blocked_by_every_stage() -> list[tuple[str, QueuedJob, World]]:
    """For each stage, a job that that stage alone stops, and the world it is stopped in."""
    busy = [RunningJob(9, (0, 1, 2, 3), NOW, None, "bob")]
    return [
        ("back_off", q(1, not_before=NOW + 1), world()),
        ("never_fits", q(1, gpus=5), world()),
        ("sweep_cap", q(1, sweep_id=7), world(sweep_caps=SweepCaps({7: 1}, {7: 1}))),
        ("port_budget", q(1), world(port_budget=PortBudget(1, {"alice": 1}))),
        ("free_port", q(1), world(free_ports=[])),
        ("owner_limits", q(1), world(limits=Limits({"alice": Limit(jobs=0)}))),
        ("backfill", q(1), world(running=busy)),
    ]


@pytest.mark.parametrize(("stage", "job", "w"), blocked_by_every_stage())
def test_the_reason_shown_is_the_one_from_the_stage_that_stopped_the_job(
    stage: str, job: QueuedJob, w: World
) -> None:
    result = decide([job], w, FAIR)
    assert result.placements == []
    assert result.stopped_by == {job.id: stage}
    gate = {g.__name__: g for g in GATES}.get(stage)
    if gate is not None:
        assert result.reasons[job.id] == gate(job, Pass(w))


def test_a_job_two_gates_stop_shows_the_first_in_pipeline_order() -> None:
    # Each pair: the same job, stopped by an earlier gate and by the one after it.
    both = [
        (q(1, gpus=5, not_before=NOW + 1), world(), "back_off"),
        (q(1, gpus=5, sweep_id=7), world(sweep_caps=SweepCaps({7: 1}, {7: 1})), "never_fits"),
        (
            q(1, sweep_id=7),
            world(sweep_caps=SweepCaps({7: 1}, {7: 1}), port_budget=PortBudget(1, {"alice": 1})),
            "sweep_cap",
        ),
        (q(1), world(free_ports=[], port_budget=PortBudget(1, {"alice": 1})), "port_budget"),
        (q(1), world(free_ports=[], limits=Limits({"alice": Limit(jobs=0)})), "free_port"),
    ]
    for job, w, first in both:
        assert decide([job], w, FAIR).stopped_by == {1: first}


def test_the_port_budget_spent_in_this_pass_is_said_in_this_pass() -> None:
    """The budget a pass's own placements use up is the reason at once (a second
    derivation after the plan, blind to them, called the third job next in line)."""
    queued = [q(1), q(2), q(3), q(4, "bob", gpus=4)]
    result = decide(queued, world(port_budget=PortBudget(2, {})), FAIR)
    assert [p.job_id for p in result.placements] == [1, 2]
    assert result.reasons == {
        3: "alice holds 2 rendezvous ports, the most one user may hold at once",
        4: "waiting for 4 free GPUs (next in line)",
    }
    # Ports running out in the pass, likewise.
    result = decide(queued[:3], world(free_ports=[29600]), FAIR)
    assert result.reasons == {
        2: "waiting for a free rendezvous port",
        3: "waiting for a free rendezvous port",
    }


def test_behind_a_fifo_head_jobs_wait_in_line_unless_their_own_gate_says_more() -> None:
    queued = [q(1, gpus=9), q(2, gpus=2), q(3, not_before=NOW + 5), q(4, gpus=0)]
    busy = [RunningJob(9, (0,), NOW, None, "bob")]
    result = decide(queued, world(usable_gpus=[0, 1], running=busy), Order(Policy.FIFO, {}))
    assert result.placements == []
    assert result.reasons == {
        1: "needs 9 GPUs; only 2 can be handed out",  # never the head
        2: "waiting for 2 free GPUs (next in line)",
        3: "waiting out its back-off",
        4: "waiting in line",
    }


SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(states(with_limits=True, with_reservations=True), st.sampled_from(list(Policy)))
def test_every_waiting_job_has_one_reason_and_a_gated_job_delays_nobody(
    s: State, policy: Policy
) -> None:
    """Each queued job is placed or has a reason; and a job a gate stopped (not the
    backfill stage, which protects a head) holds nothing: without it, the plan is the same."""
    w = world(
        usable_gpus=s.usable,
        running=s.running,
        memory=s.memory,
        limits=s.limits,
        reservations=s.reservations,
        free_ports=list(range(29600, 29604)),
        port_budget=PortBudget(2, {}),
    )
    order = Order(policy, {})
    result = decide(s.queued, w, order)
    placed = {p.job_id for p in result.placements}
    assert placed.isdisjoint(result.reasons)
    assert placed | set(result.reasons) == {j.id for j in s.queued}
    assert set(result.reasons) == set(result.stopped_by)
    gated = {i for i, stage in result.stopped_by.items() if stage != "backfill"}
    rest = [j for j in s.queued if j.id not in gated]
    assert decide(rest, w, order).placements == result.placements


# ------------------------------------------------------------------------- preemption


def test_preemption_is_asked_only_for_jobs_freed_gpus_could_start() -> None:
    queued = [
        q(1, gpus=2),  # waits for GPUs: yes
        q(2, not_before=NOW + 5),  # backing off
        q(3, gpus=9),  # can never fit
        q(4, owner="bob"),  # at bob's job limit
        q(5, mem_bytes=G),  # shares by memory
        q(6, gpus=2, sweep_id=7),  # waits for GPUs, but its sweep is at its cap once 7 starts
        q(7, gpus=0, sweep_id=7),
        q(8),  # fit, but its port failed its test-bind
    ]
    busy = [RunningJob(9, (0, 1, 2), NOW, None, "carol", None)]
    w = world(
        running=busy,
        limits=Limits({"bob": Limit(jobs=0)}),
        sweep_caps=SweepCaps({7: 1}, {}),
        memory=GpuMemory({g: 16 * G for g in range(3)}, {}, 0),  # none on GPU 3
    )
    result = decide(queued, w, Order(Policy.LAS, {}))
    assert [p.job_id for p in result.placements] == [7, 8]
    assert result.stopped_by[6] == "backfill"
    started = [p for p in result.placements if p.job_id != 8]
    waiting = waiting_for_gpus(queued, result, started, w.sweep_caps, dropped={8})
    assert [job.id for job in waiting] == [1]
    assert free_after([0, 1, 2, 3], [(0, 1, 2)], result.placements) == 0
    assert free_after([0, 1, 2, 3], [(0,)], [Placement(1, (1,), None)]) == 2


def test_plan_is_decide_on_the_same_world() -> None:
    queued = [q(1), q(2, gpus=3), q(3, time_limit_s=5.0)]
    w = world(running=[RunningJob(9, (0,), NOW, 60.0, "bob")])
    assert plan(queued, w.usable_gpus, w.running, w.free_ports, {}, NOW) == (
        decide(queued, w, FAIR).placements
    )
