"""Gates: each says why a queued job may not start now, or None where it may (pure).

A gate reads the job and the pass (``Pass``: the world after the jobs placed before it
in this pass) and changes nothing. The pipeline asks them in ``GATES``' order, and the
first that answers is the reason the user sees (``ddpq status``), so the order is the
order in which reasons are worth saying: a job that can never run here says so before
it says it waits for its sweep. A job a gate stops holds nothing, so it delays nobody:
it is never the head that backfill protects.

Dependencies and holds are not here: a job that waits for them is ``held``, not
``queued``, and never reaches the planner (``core.deps``). Placement gates, which need
the GPUs a placer chose (an owner's GPU limit for sharing jobs, reservations), are in
``core.scheduler.placement``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ddpq.core.limits import plural
from ddpq.core.scheduler.model import QueuedJob
from ddpq.core.scheduler.placers import best_set
from ddpq.core.scheduler.state import Pass
from ddpq.core.sharing import GpuMemory
from ddpq.core.topology import CLASSES, Hardware, describe_class
from ddpq.core.units import size_for_people

Gate = Callable[[QueuedJob, Pass], "str | None"]

# What a job that needs a port is told when none is left; the worker says instead who
# holds the ports, where outside programs do (``worker.ports``).
NO_FREE_PORT = "waiting for a free rendezvous port"
IN_LINE = "waiting in line"


def back_off(job: QueuedJob, p: Pass) -> str | None:
    """A retried job, or one whose launch was put off (no room on the disk), waits out its
    back-off."""
    if job.not_before is not None and job.not_before > p.now:
        return "waiting out its back-off"
    return None


def never_fits(job: QueuedJob, p: Pass) -> str | None:
    """A job that needs more than this host could ever give it (say the GPUs became
    external since it was submitted): it waits, and must not block the others."""
    if job.mem_bytes is None:
        usable = len(p.usable)
        if job.gpus > usable:
            return f"needs {plural(job.gpus, 'GPU')}; only {usable} can be handed out"
        return None
    if p.world.memory.can_ever_hold(job.mem_bytes, job.gpus):
        return None
    return too_big(job.mem_bytes, job.gpus, p.world.memory)


def too_big(mem_bytes: int, gpus: int, memory: GpuMemory) -> str:
    asked = size_for_people(mem_bytes)
    largest = memory.largest()
    if not largest:
        return f"asks {asked} of GPU memory; no GPU here has memory to share"
    where = "on each of its GPUs" if gpus > 1 else "of GPU memory"
    return (
        f"asks {asked} {where}; the GPUs here have at most {size_for_people(largest)} to "
        f"share ({size_for_people(memory.headroom)} of each kept free)"
    )


def no_such_hardware(job: QueuedJob, p: Pass) -> str | None:
    """A job that asks for a GPU type or link class this host could never give it."""
    return unavailable_hardware(p.world.hardware, p.usable, job.gpus, job.gpu_type, job.gpu_link)


def unavailable_hardware(
    hw: Hardware, gpus_here: Iterable[int], gpus: int, gpu_type: str | None, gpu_link: str | None
) -> str | None:
    """Why ``gpus`` GPUs of ``gpu_type`` linked by ``gpu_link`` or better can never be had
    of ``gpus_here``, or None: the gate's words, and the API's at submission."""
    if gpu_type is None and gpu_link is None:
        return None
    here = sorted(gpus_here)
    typed = hw.of_type(here, gpu_type, gpus)
    kind = f" of type {gpu_type!r}" if gpu_type else ""
    if len(typed) < gpus:
        models = sorted({hw.names.get(g, "?") for g in here})
        have = ", ".join(models[:6]) or "none"
        mig = " (MIG instances only for one-GPU jobs)" if hw.mig and gpus > 1 else ""
        return (
            f"needs {plural(gpus, 'GPU')}{kind}; this host has {len(typed)}{mig} (models: {have})"
        )
    if gpu_link is None or gpus < 2:
        return None
    if hw.worst(best_set(hw, typed, gpus, typed)) <= CLASSES.index(gpu_link):
        return None
    return (
        f"needs {plural(gpus, 'GPU')}{kind} linked by {describe_class(gpu_link)} or better; "
        "no such set exists on this host (ddpq gpus --topology)"
    )


def sweep_cap(job: QueuedJob, p: Pass) -> str | None:
    """A member of a sweep capped at K (``--array 0-99%10``) waits while K of its members
    hold leases, those placed in this pass included."""
    caps = p.world.sweep_caps
    if caps.allows(job.sweep_id, p.sweeps_placed):
        return None
    assert job.sweep_id is not None
    cap = caps.cap[job.sweep_id]
    return f"sweep {job.sweep_id} runs {cap} member{'' if cap == 1 else 's'} at once, its cap"


def port_budget(job: QueuedJob, p: Pass) -> str | None:
    """An owner holds at most ``ports_per_user`` rendezvous ports at once."""
    budget = p.world.port_budget
    if not job.needs_port or budget.allows(job.owner, p.ports_placed):
        return None
    held = plural(budget.per_owner, "rendezvous port")
    return f"{job.owner} holds {held}, the most one user may hold at once"


def free_port(job: QueuedJob, p: Pass) -> str | None:
    """A job that rendezvous waits while no port is left."""
    return NO_FREE_PORT if job.needs_port and not p.ports else None


def in_line(job: QueuedJob, p: Pass) -> str | None:
    """Behind a head that nobody passes (``fifo``): every later job waits its turn."""
    return IN_LINE if p.stopped else None


def owner_limits(job: QueuedJob, p: Pass) -> str | None:
    """The most jobs and GPUs an owner's jobs hold at once (``core.limits``). A sharing
    job may still fit on GPUs its owner holds already (``placement.own_gpus``)."""
    if not p.limited:
        return None
    return p.owners.blocks(job.owner, job.gpus, p.world.limits, shares=job.sharer is not None)


def running_cap(job: QueuedJob, p: Pass) -> str | None:
    """The daemon's cap on one owner's jobs holding leases at once (``max_running_per_user``),
    those placed in this pass included. An admin's limit on running jobs for the owner, or
    for everyone (``ddpq admin limit --jobs``), replaces it: ``owner_limits`` says that one."""
    cap = p.world.running_cap
    if not cap or p.world.limits.of(job.owner).jobs is not None:
        return None
    runs = p.owners.jobs.get(job.owner, 0)
    if runs < cap:
        return None
    return f"{job.owner} runs {runs} job{'' if runs == 1 else 's'}, the cap per user"


# The order the pipeline asks them in (and so the reason that is said first).
GATES: tuple[Gate, ...] = (
    back_off,
    never_fits,
    no_such_hardware,
    sweep_cap,
    port_budget,
    free_port,
    in_line,
    owner_limits,
    running_cap,
)
