"""Each gate of the scheduling pipeline alone, on plain data: the job and a pass over a
world built by hand (``core.scheduler.gates``, ``core.scheduler.placement``)."""

from __future__ import annotations

import math

import pytest

from ddpq.core.limits import Limit, Limits, Reservation
from ddpq.core.scheduler.gates import (
    GATES,
    NO_FREE_PORT,
    back_off,
    free_port,
    in_line,
    never_fits,
    owner_limits,
    port_budget,
    sweep_cap,
)
from ddpq.core.scheduler.model import PortBudget, QueuedJob, RunningJob, SweepCaps, World
from ddpq.core.scheduler.placement import choose
from ddpq.core.scheduler.state import Pass
from ddpq.core.sharing import GpuMemory

G = 1 << 30
NOW = 1_000.0


def q(jid: int = 1, owner: str = "alice", gpus: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(jid, owner, gpus, 0, float(jid), **kw)  # type: ignore[arg-type]


def world(**kw: object) -> Pass:
    fields: dict[str, object] = {
        "usable_gpus": [0, 1, 2, 3],
        "running": [],
        "free_ports": [29600, 29601],
        "now": NOW,
    }
    fields.update(kw)
    return Pass(World(**fields))  # type: ignore[arg-type]


def test_the_gates_are_asked_in_the_order_their_reasons_are_worth_saying() -> None:
    assert [g.__name__ for g in GATES] == [
        "back_off",
        "never_fits",
        "no_such_hardware",
        "sweep_cap",
        "port_budget",
        "free_port",
        "in_line",
        "owner_limits",
        "running_cap",
    ]


@pytest.mark.parametrize(
    ("not_before", "waits"),
    [(None, False), (NOW - 5, False), (NOW, False), (NOW + 0.001, True), (NOW + 3600, True)],
)
def test_back_off(not_before: float | None, waits: bool) -> None:
    why = back_off(q(not_before=not_before), world())
    assert why == ("waiting out its back-off" if waits else None)


@pytest.mark.parametrize(
    ("job", "usable", "memory", "said"),
    [
        (q(gpus=4), [0, 1, 2, 3], GpuMemory(), None),
        (q(gpus=0), [], GpuMemory(), None),
        (q(gpus=5), [0, 1, 2, 3], GpuMemory(), "needs 5 GPUs; only 4 can be handed out"),
        (q(gpus=1), [], GpuMemory(), "needs 1 GPU; only 0 can be handed out"),
        # Sharing jobs are measured against the GPUs' memory, external GPUs included.
        (q(gpus=1, mem_bytes=5 * G), [], GpuMemory({0: 16 * G}, {}, G), None),
        (
            q(gpus=1, mem_bytes=20 * G),
            [0],
            GpuMemory({0: 16 * G}, {}, G),
            "asks 20G of GPU memory; the GPUs here have at most 15G to share "
            "(1G of each kept free)",
        ),
        (
            q(gpus=2, mem_bytes=10 * G),
            [0, 1],
            GpuMemory({0: 16 * G, 1: 8 * G}, {}, 0),
            "asks 10G on each of its GPUs; the GPUs here have at most 16G to share "
            "(0 of each kept free)",
        ),
        (
            q(gpus=1, mem_bytes=G),
            [0],
            GpuMemory(),
            "asks 1G of GPU memory; no GPU here has memory to share",
        ),
    ],
)
def test_never_fits(job: QueuedJob, usable: list[int], memory: GpuMemory, said: str | None) -> None:
    assert never_fits(job, world(usable_gpus=usable, memory=memory)) == said


def test_sweep_cap_counts_running_members_and_those_placed_in_the_pass() -> None:
    caps = SweepCaps({7: 2, 8: 1}, {7: 1})
    p = world(sweep_caps=caps)
    assert sweep_cap(q(sweep_id=None), p) is None
    assert sweep_cap(q(sweep_id=9), p) is None  # a sweep without a cap
    assert sweep_cap(q(sweep_id=7), p) is None  # one of two runs
    p.place(q(1, sweep_id=7), (0,))
    assert sweep_cap(q(2, sweep_id=7), p) == "sweep 7 runs 2 members at once, its cap"
    p.place(q(3, sweep_id=8), (1,))
    assert sweep_cap(q(4, sweep_id=8), p) == "sweep 8 runs 1 member at once, its cap"


def test_port_budget_counts_ports_held_and_placed_in_the_pass() -> None:
    p = world(port_budget=PortBudget(2, {"alice": 1, "bob": 2}))
    said = "{} holds 2 rendezvous ports, the most one user may hold at once"
    assert port_budget(q(owner="alice"), p) is None
    assert port_budget(q(owner="bob"), p) == said.format("bob")
    assert port_budget(q(owner="bob", gpus=0, needs_port=False), p) is None  # takes no port
    p.place(q(1, owner="alice"), (0,))
    assert port_budget(q(2, owner="alice"), p) == said.format("alice")


def test_free_port_only_for_jobs_that_rendezvous() -> None:
    p = world(free_ports=[29600])
    assert free_port(q(), p) is None
    p.place(q(1), (0,))  # takes the last one
    assert free_port(q(2), p) == NO_FREE_PORT == "waiting for a free rendezvous port"
    assert free_port(q(3, gpus=0, needs_port=False), p) is None
    assert free_port(q(4), world(free_ports=[])) == NO_FREE_PORT


def test_in_line_once_a_head_stops_the_pass() -> None:
    p = world()
    assert in_line(q(), p) is None
    p.stopped = True
    assert in_line(q(), p) == "waiting in line"


@pytest.mark.parametrize(
    ("limit", "running", "job", "said"),
    [
        (None, [], q(gpus=4), None),
        (Limit(jobs=1), [("alice", (0,))], q(), "at alice's limit of 1 running job"),
        (Limit(jobs=2), [("alice", (0,))], q(), None),
        (Limit(jobs=3), [("alice", ())] * 3, q(), "at alice's limit of 3 running jobs"),
        (Limit(gpus=2), [], q(gpus=3), "needs 3 GPUs, more than alice's limit of 2"),
        (Limit(gpus=2), [("alice", (0, 1))], q(), "at alice's limit of 2 GPUs"),
        (
            Limit(gpus=3),
            [("alice", (0, 1))],
            q(gpus=2),
            "would pass alice's limit of 3 GPUs (alice's jobs hold 2)",
        ),
        (Limit(gpus=2), [("alice", (0, 1))], q(gpus=0), None),  # takes no GPU
        (Limit(gpus=2), [("bob", (0, 1))], q(gpus=2), None),  # bob's jobs do not count
        # A sharing job may still join GPUs its owner holds: left to placement.
        (Limit(gpus=1), [("alice", (0,))], q(mem_bytes=G), None),
    ],
)
def test_owner_limits(
    limit: Limit | None,
    running: list[tuple[str, tuple[int, ...]]],
    job: QueuedJob,
    said: str | None,
) -> None:
    limits = Limits({"alice": limit}) if limit is not None else Limits()
    held = [
        RunningJob(100 + i, gpus, NOW - 1, None, owner) for i, (owner, gpus) in enumerate(running)
    ]
    assert owner_limits(job, world(limits=limits, running=held)) == said


# ---------------------------------------------------------------- the placement stage


def test_a_sharing_job_at_its_owners_gpu_limit_joins_its_own_gpus_or_says_the_limit() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G}, {}, 0)
    limits = Limits({"alice": Limit(gpus=1)})
    own = [RunningJob(9, (0,), NOW, None, "alice", 10 * G)]
    p = world(usable_gpus=[0, 1], running=own, memory=memory, limits=limits)
    assert choose(q(mem_bytes=5 * G), p).gpus == (0,)  # room on her own GPU
    refused = choose(q(mem_bytes=8 * G), p)  # no room there; GPU 1 would be her second
    assert (refused.gpus, refused.stopped_by) == (None, "own_gpus")
    assert refused.reason == "at alice's limit of 1 GPU"


@pytest.mark.parametrize(
    ("reservation", "job", "said"),
    [
        (
            Reservation(7, "alice", 2, NOW + 3600, NOW + 7200),
            q(owner="bob", time_limit_s=600.0),
            None,
        ),
        (
            Reservation(7, "alice", 2, NOW + 3600, NOW + 7200),
            q(owner="bob"),
            "without a time limit it would run into reservation 7 (2 GPUs for alice)",
        ),
        (
            Reservation(7, "alice", 2, NOW + 3600, NOW + 7200),
            q(owner="bob", time_limit_s=7200.0),
            "its time limit would run into reservation 7 (2 GPUs for alice)",
        ),
        (
            Reservation(8, "alice", 2, NOW - 1, NOW + 7200),
            q(owner="bob", time_limit_s=60.0),
            "the free GPUs are kept for reservation 8 (2 GPUs for alice)",
        ),
        (Reservation(8, "alice", 2, NOW - 1, NOW + 7200), q(owner="alice"), None),  # her own
        (Reservation(8, "alice", 2, NOW - 10, NOW - 1), q(owner="bob"), None),  # over
    ],
)
def test_reservations(reservation: Reservation, job: QueuedJob, said: str | None) -> None:
    chosen = choose(job, world(usable_gpus=[0, 1], reservations=[reservation]))
    assert chosen.reason == said
    assert chosen.stopped_by == (None if said is None else "reservations")
    assert (chosen.gpus is None) == (said is not None)


def test_a_sharing_job_refused_idle_gpus_by_a_reservation_joins_a_shared_one() -> None:
    memory = GpuMemory({0: 16 * G, 1: 16 * G}, {}, 0)
    r = Reservation(7, "alice", 1, NOW - 1, NOW + 7200)
    bob = [RunningJob(9, (1,), NOW, None, "bob", 12 * G)]
    p = world(usable_gpus=[0, 1], running=bob, memory=memory, reservations=[r])
    # Tightest fit first would be GPU 1 anyway; with 4G it fits only on the idle GPU 0,
    # which the reservation needs.
    assert choose(q(owner="bob", mem_bytes=2 * G), p).gpus == (1,)
    kept = choose(q(owner="bob", mem_bytes=5 * G), p)
    assert kept.reason == "the free GPUs are kept for reservation 7 (1 GPU for alice)"


def test_a_job_that_does_not_fit_gets_no_gpus_and_no_reason_from_placement() -> None:
    held = [RunningJob(9, (0, 1, 2), NOW, None, "bob")]
    chosen = choose(q(gpus=2), world(running=held))
    assert (chosen.gpus, chosen.stopped_by, chosen.reason) == (None, None, None)
    assert math.isinf(world(running=held).end_of(q()))


def test_a_budget_of_one_port_is_said_in_the_singular() -> None:
    world = World(range(2), [], [29500, 29501], 0.0, port_budget=PortBudget(1, {"ann": 1}))
    said = port_budget(QueuedJob(1, "ann", 1, 0, 0.0), Pass(world))
    assert said == "ann holds 1 rendezvous port, the most one user may hold at once"
