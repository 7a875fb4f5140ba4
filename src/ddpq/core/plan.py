"""Which queued jobs start now: the scheduler's public names under their old address.

The scheduler is the pipeline in ``core.scheduler`` (gates, a placer, ordering by the
policy, backfill), described in docs/architecture.md ("Scheduling"); the store, the
replay and the tests import its names from here.
"""

from __future__ import annotations

from ddpq.core.scheduler import (
    NO_PORT_LIMIT,
    NO_SWEEP_CAPS,
    Placement,
    Plan,
    PortBudget,
    QueuedJob,
    RunningJob,
    SweepCaps,
    World,
    decide,
    needs_port,
    plan,
    plan_explained,
    shadow,
)

__all__ = [
    "NO_PORT_LIMIT",
    "NO_SWEEP_CAPS",
    "Placement",
    "Plan",
    "PortBudget",
    "QueuedJob",
    "RunningJob",
    "SweepCaps",
    "World",
    "decide",
    "needs_port",
    "plan",
    "plan_explained",
    "shadow",
]
