"""The scheduling pass: order, gates, placement, backfill (pure).

Each queued job, in the policy's order (``core.policy.Order``), goes through:

1. the gates (``gates.GATES``): back-off, can never fit here, sweep cap, port budget,
   a free port, in line behind a ``fifo`` head, owner limits;
2. placement (``placement.choose``): the placer picks its GPUs (``placers``), then the
   owner's GPU limit for a sharing job, and reservations; an elastic job its size
   (``elastic.choose_sized``), and one being resized goes before every other;
3. backfill (``backfill.Line``): it starts if it fits and delays no blocked head.

The first stage that stops a job gives the reason it waits; nothing else derives one.
Same inputs, same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ParamSpec

from ddpq.core.limits import NO_LIMITS, Limits, Reservation
from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler import elastic
from ddpq.core.scheduler.backfill import Line
from ddpq.core.scheduler.gates import GATES, Gate
from ddpq.core.scheduler.model import (
    NO_PORT_LIMIT,
    NO_SWEEP_CAPS,
    Placement,
    Plan,
    PortBudget,
    QueuedJob,
    RunningJob,
    SweepCaps,
    World,
)
from ddpq.core.scheduler.placement import HARDWARE_WAIT
from ddpq.core.scheduler.state import Pass
from ddpq.core.sharing import NO_MEMORY, GpuMemory
from ddpq.core.topology import NO_HARDWARE, Hardware

P = ParamSpec("P")


def first_stop(job: QueuedJob, p: Pass, gates: Sequence[Gate] = GATES) -> tuple[str, str] | None:
    """The first gate that stops ``job`` now, and its reason (None: none does)."""
    for gate in gates:
        why = gate(job, p)
        if why is not None:
            return gate.__name__, why
    return None


def decide(queued: Sequence[QueuedJob], world: World, order: Order) -> Plan:
    """What starts now, and why each other queued job waits."""
    p = Pass(world)
    line = Line(order.backfill)
    reasons: dict[int, str] = {}
    stopped_by: dict[int, str] = {}
    for job in sorted(queued, key=elastic.resizing_first(order.key)):
        stop = first_stop(job, p)
        if stop is None:
            # An elastic job takes its size here (``elastic``): what is free, up to its most.
            job, chosen = elastic.choose_sized(job, p, ahead_waits=line.head_named)
            if chosen.stopped_by == HARDWARE_WAIT:
                # It waits for GPUs (linked ones, of its type): the head backfill protects
                # if it is the first such job, told what it waits for in its own words.
                line.admit(job, None, p)
            if chosen.reason is not None:
                assert chosen.stopped_by is not None
                stop = chosen.stopped_by, chosen.reason
            else:
                why = line.admit(job, chosen.gpus, p)
                if why is None:
                    assert chosen.gpus is not None
                    p.place(job, chosen.gpus)
                    continue
                stop = "backfill", why
        stopped_by[job.id], reasons[job.id] = stop
    return Plan(p.placements, reasons, stopped_by)


def plan_explained(
    queued: Sequence[QueuedJob],
    usable_gpus: Sequence[int],
    running: Sequence[RunningJob],
    free_ports: Sequence[int],
    usage: Mapping[str, float],
    now: float,
    port_budget: PortBudget = NO_PORT_LIMIT,
    order: Order | None = None,
    sweep_caps: SweepCaps = NO_SWEEP_CAPS,
    *,
    memory: GpuMemory = NO_MEMORY,
    limits: Limits = NO_LIMITS,
    reservations: Sequence[Reservation] = (),
    hardware: Hardware = NO_HARDWARE,
) -> Plan:
    """``decide`` with the world given piece by piece; ``order`` defaults to
    ``fairshare`` on ``usage`` (recent GPU-seconds per owner, ``rules.recent_usage``)."""
    world = World(
        usable_gpus,
        running,
        free_ports,
        now,
        port_budget,
        sweep_caps,
        memory,
        limits,
        reservations,
        hardware,
    )
    return decide(queued, world, order or Order(Policy.FAIRSHARE, usage))


def _placements_of(decided: Callable[P, Plan]) -> Callable[P, list[Placement]]:
    """``decided`` with only its placements returned: one signature to keep, not two."""

    def placements(*args: P.args, **kwargs: P.kwargs) -> list[Placement]:
        return decided(*args, **kwargs).placements

    return placements


# What starts now: ``plan_explained``'s placements, for callers that need no reasons.
plan = _placements_of(plan_explained)
