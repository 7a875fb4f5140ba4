"""The scheduler as a pipeline of pure stages (see ``pipeline``): which queued jobs start
now, on which GPUs and which rendezvous port, and why each other one waits.

- ``model``: the plain data (jobs, the world of one pass, the plan);
- ``state``: one pass's bookkeeping as jobs are placed;
- ``gates``: each says why a job may not start now, or nothing;
- ``placers``: which GPUs a job gets (first free whole GPUs, or a share by memory);
- ``placement``: the placer's choice and the gates that need it (limits, reservations),
  after the host's CPU cores and memory (``host``);
- ``backfill``: the head, its shadow time, and what may pass it;
- ``pipeline``: the pass itself, in the policy's order;
- ``preemption``: for which waiting jobs running ones may be asked to go (``las``).
"""

from ddpq.core.scheduler.backfill import shadow
from ddpq.core.scheduler.model import (
    NO_HOST,
    NO_PORT_LIMIT,
    NO_SWEEP_CAPS,
    HostUse,
    Placement,
    Plan,
    PortBudget,
    QueuedJob,
    RunningJob,
    SweepCaps,
    World,
    needs_port,
)
from ddpq.core.scheduler.pipeline import decide, plan, plan_explained

__all__ = [
    "NO_HOST",
    "NO_PORT_LIMIT",
    "NO_SWEEP_CAPS",
    "HostUse",
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
