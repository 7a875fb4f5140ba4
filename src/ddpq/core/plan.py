"""Which queued jobs start now, on which GPUs and which rendezvous port.

The ordering rule (documented for users in docs/scheduling.md):

1. higher ``priority`` first;
2. then the owner who used fewer GPU-seconds recently (fair share);
3. then submission order.

The first job in that order that does not fit becomes the *head*. EASY-style
backfill then lets later jobs start on idle GPUs only when that cannot delay
the head: either the job's time limit ends before the head's reserved start
(the *shadow time*), or it uses only GPUs that will still be spare once the
head starts. A job without a time limit never backfills past a blocked head,
and nothing backfills when the head's start cannot be bounded because the
jobs it waits for have no time limit. A job that needs no GPU cannot delay the
head, so it may always start (it only takes a port).

A member of a sweep capped at K (``--array 0-99%10``) never starts while K of its sweep's
members hold leases; like a job over its port budget it then waits without blocking the
jobs behind it (it holds nothing, so it delays nobody). So does a job that its owner's
limit, or a reservation, holds back (``core.limits``).

A job that asks for memory (``mem_bytes``) instead of whole GPUs shares GPUs with other such
jobs as ``core.sharing`` allows; whole-GPU jobs never take a GPU one of them holds, nor the
other way round. As a blocked head it is counted as needing its GPUs whole (a bound: it
may start earlier, on shared ones), and it backfills only where the head's shadow time
does not move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from ddpq.core.limits import NO_LIMITS, Calendar, Limits, OwnerUse, Reservation
from ddpq.core.policy import Backfill, Order, Policy
from ddpq.core.sharing import NO_MEMORY, GpuMemory, MemoryPool, Sharer
from ddpq.core.units import size_for_people


def needs_port(gpus: int, launcher: str) -> bool:
    """Whether a job gets a rendezvous port: torchrun needs one, and so may any job on
    GPUs (a script that starts its own ranks); a plain CPU job does not."""
    return gpus > 0 or launcher == "torchrun"


@dataclass(frozen=True)
class QueuedJob:
    id: int
    owner: str
    gpus: int
    priority: int
    submitted_at: float
    time_limit_s: float | None = None
    not_before: float | None = None  # retry back-off: not eligible before this time
    # Only jobs that rendezvous (torchrun, or any job on GPUs) lease a port: a CPU-only
    # helper job must not use up the range that DDP jobs need.
    needs_port: bool = True
    # GPU-seconds of its earlier attempts (the LAS policy ranks by it).
    attained_s: float = 0.0
    sweep_id: int | None = None  # the sweep it belongs to, if any (see SweepCaps)
    # Sharing: bytes it reserves on each of its ``gpus`` GPUs (None: it takes them whole),
    # and the most jobs it lets a GPU it is on take (``--gpu-share``).
    mem_bytes: int | None = None
    share_cap: int | None = None

    @property
    def sharer(self) -> Sharer | None:
        return None if self.mem_bytes is None else Sharer(self.mem_bytes, self.share_cap)


@dataclass(frozen=True)
class RunningJob:
    id: int
    gpus: tuple[int, ...]
    started_at: float
    time_limit_s: float | None = None
    owner: str = ""
    mem_bytes: int | None = None  # sharing: its reservation on each of its GPUs
    share_cap: int | None = None


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpus: tuple[int, ...]
    port: int | None
    mem_bytes: int | None = None  # sharing: what it reserves on each GPU


@dataclass(frozen=True)
class Plan:
    placements: list[Placement]
    # Jobs an owner's limit or a reservation held back, and why (for explain_waits).
    notes: dict[int, str]


@dataclass(frozen=True)
class PortBudget:
    """Rendezvous ports one owner may hold at once, and how many each holds now."""

    per_owner: int
    held: Mapping[str, int]

    def allows(self, owner: str, placed: Mapping[str, int]) -> bool:
        return self.held.get(owner, 0) + placed.get(owner, 0) < self.per_owner


NO_PORT_LIMIT = PortBudget(per_owner=2**31, held={})


@dataclass(frozen=True)
class SweepCaps:
    """How many members each capped sweep may run at once (``%K``), and how many hold
    leases now. A sweep absent from ``cap`` has no cap."""

    cap: Mapping[int, int]
    running: Mapping[int, int]

    def allows(self, sweep_id: int | None, placed: Mapping[int, int]) -> bool:
        if sweep_id is None or sweep_id not in self.cap:
            return True
        return self.running.get(sweep_id, 0) + placed.get(sweep_id, 0) < self.cap[sweep_id]


NO_SWEEP_CAPS = SweepCaps(cap={}, running={})


def order_key(job: QueuedJob, usage: Mapping[str, float]) -> tuple[float, ...]:
    """The default order (``fairshare``): see ``core.policy``."""
    return Order(Policy.FAIRSHARE, usage).key(job)


def _expected_end(job: RunningJob) -> float:
    if job.time_limit_s is None:
        return math.inf
    return job.started_at + job.time_limit_s


def shadow(
    need: int, free_now: int, running: Sequence[RunningJob], now: float
) -> tuple[float, int]:
    """When the head can start at the latest, and how many GPUs are spare then.

    Returns ``(shadow_time, extra)``: by ``shadow_time`` at least ``need`` GPUs
    are free even if every running job uses its whole time limit; ``extra`` is
    how many more than ``need`` are free at that moment. ``shadow_time`` is
    ``inf`` when the head waits on a job without a time limit.
    """
    free = free_now
    when = now
    # A GPU comes back when the last job on it ends (several share one by memory).
    back: dict[int, float] = {}
    for job in running:
        for g in job.gpus:
            back[g] = max(back.get(g, now), _expected_end(job))

    # GPUs due at the same moment all come back together.
    for end, due in groupby(sorted(back.values())):
        if free >= need:
            break
        when = end
        free += len(list(due))
    if free < need:  # more than exists: the caller refuses such jobs at submit
        return math.inf, 0
    return when, free - need


def plan(
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
) -> list[Placement]:
    """Decide what starts now. Pure: same inputs, same answer (``plan_explained``'s
    placements)."""
    return plan_explained(
        queued,
        usable_gpus,
        running,
        free_ports,
        usage,
        now,
        port_budget,
        order,
        sweep_caps,
        memory=memory,
        limits=limits,
        reservations=reservations,
    ).placements


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
) -> Plan:
    """Decide what starts now, and note the jobs a limit or a reservation held back.

    ``usable_gpus``: every GPU the policy lets ddpq hand out whole (held or not).
    ``running``: jobs holding leases; their GPUs are not free.
    ``free_ports``: unleased ports in the order they should be used.
    ``usage``: recent GPU-seconds per owner (see ``rules.recent_usage``).
    ``port_budget``: how many ports each owner may hold; a job over it waits, and
    (like a job waiting for a port) does not block the jobs behind it.
    ``order``: the policy's ranking and backfill (default: ``fairshare`` on ``usage``).
    ``sweep_caps``: members of a sweep at its cap wait likewise.
    ``memory``: every GPU's memory, for jobs that share GPUs (``core.sharing``); they may
    use any GPU there, external ones too (what outside processes hold is counted).
    ``limits``, ``reservations``: see ``core.limits``; the jobs they hold back wait
    likewise.
    """
    order = order or Order(Policy.FAIRSHARE, usage)
    usable = set(usable_gpus)
    whole_held = {g for job in running if job.mem_bytes is None for g in job.gpus}
    pool = MemoryPool(
        memory,
        [
            (job.gpus, Sharer(job.mem_bytes, job.share_cap))
            for job in running
            if job.mem_bytes is not None
        ],
        whole_held,
    )
    free = sorted(usable - whole_held - pool.shared())
    ports = list(free_ports)
    placements: list[Placement] = []
    notes: dict[int, str] = {}
    # Only usable GPUs come back to the pool when a running job ends: one that
    # holds GPUs the policy has since made external frees none of those.
    live = [
        RunningJob(
            job.id, tuple(g for g in job.gpus if g in usable), job.started_at, job.time_limit_s
        )
        for job in running
    ]
    owners = OwnerUse((job.owner, job.gpus) for job in running)
    calendar = Calendar(
        reservations, usable, ((j.owner, j.gpus, _expected_end(j)) for j in running), now
    )
    head_shadow: float | None = None
    head_need = 0
    head_extra = 0
    ports_placed: dict[str, int] = {}
    sweeps_placed: dict[int, int] = {}

    def choose(job: QueuedJob, only: set[int] | None, idle: bool = True) -> tuple[int, ...] | None:
        if job.sharer is None:
            return tuple(free[: job.gpus]) if job.gpus <= len(free) else None
        return pool.choose(job.sharer, job.gpus, free, only=only, idle=idle)

    def place(job: QueuedJob, gpus: tuple[int, ...]) -> None:
        port = ports.pop(0) if job.needs_port else None
        if port is not None:
            ports_placed[job.owner] = ports_placed.get(job.owner, 0) + 1
        if job.sweep_id is not None:
            sweeps_placed[job.sweep_id] = sweeps_placed.get(job.sweep_id, 0) + 1
        if job.sharer is None:
            pool.block(gpus)
        else:
            pool.take(gpus, job.sharer)
        free[:] = [g for g in free if g not in gpus]
        owners.take(job.owner, gpus)
        end = math.inf if job.time_limit_s is None else now + job.time_limit_s
        calendar.take(job.owner, gpus, end)
        live.append(
            RunningJob(job.id, tuple(g for g in gpus if g in usable), now, job.time_limit_s)
        )
        placements.append(Placement(job.id, gpus, port, job.mem_bytes))

    def never_fits(job: QueuedJob) -> bool:
        if job.mem_bytes is None:
            return job.gpus > len(usable)
        return not memory.can_ever_hold(job.mem_bytes, job.gpus)

    eligible = [j for j in queued if j.not_before is None or j.not_before <= now]
    for job in sorted(eligible, key=order.key):
        if not sweep_caps.allows(job.sweep_id, sweeps_placed):
            continue  # its sweep runs its cap of members; it holds nothing, delays nobody
        if job.needs_port and not (ports and port_budget.allows(job.owner, ports_placed)):
            continue  # waits for a port; it holds nothing, so it delays nobody
        if limits.any:
            why = owners.blocks(job.owner, job.gpus, limits, shares=job.sharer is not None)
            if why is not None:
                notes[job.id] = why  # like the port budget: it delays nobody
                continue
        only = owners.only_own(job.owner, job.gpus, limits) if job.sharer else None
        gpus = choose(job, only)
        if gpus is None and only is not None:
            assert limits.of(job.owner).gpus is not None
            notes[job.id] = owners.gpu_limit_reason(job.owner, limits.of(job.owner).gpus or 0)
            continue
        if gpus is not None and job.gpus > 0 and calendar:
            end = math.inf if job.time_limit_s is None else now + job.time_limit_s
            kept = calendar.blocks(job.owner, gpus, end)
            if kept is not None and job.sharer is not None:
                # On GPUs other jobs share already, it may take none a reservation needs.
                other = choose(job, only, idle=False)
                if other is not None and calendar.blocks(job.owner, other, end) is None:
                    gpus, kept = other, None
            if kept is not None:
                notes[job.id] = calendar.reason(kept, end)
                continue
        if head_shadow is None:
            if gpus is not None:
                place(job, gpus)
                continue
            if never_fits(job):
                continue  # can never fit here (e.g. GPUs became external); do not block others
            if order.backfill is Backfill.NONE:
                break  # first come, first served: nobody passes it
            if order.backfill is Backfill.GREEDY:
                continue  # it reserves nothing; preemption makes room for it instead
            head_need = job.gpus  # a sharing head: as if it needed its GPUs whole
            head_shadow, head_extra = shadow(head_need, len(free), live, now)
            continue
        # Backfill past the head.
        if gpus is None:
            continue
        if job.gpus == 0:
            place(job, gpus)  # holds no GPU the head needs
            continue
        if job.time_limit_s is None or head_shadow == math.inf:
            continue
        if job.sharer is not None:
            # It may hold a GPU the head needs, or keep a shared one busy for longer.
            mine = tuple(g for g in gpus if g in usable)
            trial = [*live, RunningJob(job.id, mine, now, job.time_limit_s)]
            left = len([g for g in free if g not in gpus])
            when, extra = shadow(head_need, left, trial, now)
            if when <= head_shadow:
                place(job, gpus)
                head_extra = extra
        elif now + job.time_limit_s <= head_shadow:
            place(job, gpus)
        elif job.gpus <= head_extra:
            place(job, gpus)
            head_extra -= job.gpus
    return Plan(placements, notes)


def explain_waits(
    queued: Sequence[QueuedJob],
    usable_gpus: Sequence[int],
    placements: Sequence[Placement],
    free_ports: Sequence[int],
    usage: Mapping[str, float],
    now: float,
    port_budget: PortBudget = NO_PORT_LIMIT,
    order: Order | None = None,
    sweep_caps: SweepCaps = NO_SWEEP_CAPS,
    *,
    memory: GpuMemory = NO_MEMORY,
    notes: Mapping[int, str] | None = None,
    port_wait: str = "waiting for a free rendezvous port",
) -> dict[int, str]:
    """Why each queued job that ``plan`` did not place is still waiting, in words.

    Coarse on purpose (no counts that change every pass), so the reasons change, and
    are written, only when a job's situation really does. ``notes``: what
    ``plan_explained`` said held jobs back (a limit, a reservation); ``port_wait``: what
    is said when no port is free (the worker names who holds them).
    """
    notes = notes or {}
    order = order or Order(Policy.FAIRSHARE, usage)
    placed = {p.job_id for p in placements}
    usable = len(set(usable_gpus))
    # Members placed in this very pass count against their sweep's cap already.
    sweeps_placed: dict[int, int] = {}
    for job in queued:
        if job.id in placed and job.sweep_id is not None:
            sweeps_placed[job.sweep_id] = sweeps_placed.get(job.sweep_id, 0) + 1
    reasons: dict[int, str] = {}
    head: QueuedJob | None = None
    for job in sorted(queued, key=order.key):
        if job.id in placed:
            continue
        if job.not_before is not None and job.not_before > now:
            reasons[job.id] = "waiting out its retry back-off"
        elif job.mem_bytes is None and job.gpus > usable:
            reasons[job.id] = f"needs {job.gpus} GPUs; only {usable} can be handed out"
        elif job.mem_bytes is not None and not memory.can_ever_hold(job.mem_bytes, job.gpus):
            reasons[job.id] = _too_big(job, memory)
        elif not sweep_caps.allows(job.sweep_id, sweeps_placed):
            assert job.sweep_id is not None
            cap = sweep_caps.cap[job.sweep_id]
            reasons[job.id] = (
                f"sweep {job.sweep_id} runs {cap} member{'' if cap == 1 else 's'} at once, its cap"
            )
        elif job.needs_port and not port_budget.allows(job.owner, {}):
            reasons[job.id] = (
                f"{job.owner} holds {port_budget.per_owner} rendezvous ports, "
                "the most one user may hold at once"
            )
        elif job.needs_port and not free_ports:
            reasons[job.id] = port_wait
        elif job.id in notes:
            reasons[job.id] = notes[job.id]
        elif head is None:
            head = job
            plural = "" if job.gpus == 1 else "s"
            if job.mem_bytes is None:
                reasons[job.id] = f"waiting for {job.gpus} free GPU{plural} (next in line)"
            else:
                size = size_for_people(job.mem_bytes)
                on = "a GPU" if job.gpus == 1 else f"{job.gpus} GPUs"
                reasons[job.id] = f"waiting for {size} of memory free on {on} (next in line)"
        else:
            # Not "behind job N": the head changes with every start, and a reason that
            # changes for the whole queue on each pass would be a write per queued job.
            reasons[job.id] = "waiting in line"
    return reasons


def _too_big(job: QueuedJob, memory: GpuMemory) -> str:
    assert job.mem_bytes is not None
    asked = size_for_people(job.mem_bytes)
    largest = memory.largest()
    if not largest:
        return f"asks {asked} of GPU memory; no GPU here has memory to share"
    where = "on each of its GPUs" if job.gpus > 1 else "of GPU memory"
    return (
        f"asks {asked} {where}; the GPUs here have at most {size_for_people(largest)} to "
        f"share ({size_for_people(memory.headroom)} of each kept free)"
    )
