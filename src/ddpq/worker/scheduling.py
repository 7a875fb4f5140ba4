"""Planning and leasing in the worker's transaction: what starts now, on which GPUs and port.

The decision is ``core.scheduler``'s (one pass of its pipeline, which also says why each
other job waits); this gathers the world it decides in from the store (the queue, the
leases held, recent use per owner, limits, reservations, what ``auto`` jobs were measured
to use) and from this host (which ports are really free, what the GPUs' memory holds),
writes the waiting reasons, asks for preemptions under ``las`` and ``srpt-progress``
(whose estimates, and every queued job's predicted start, are ``worker.forecast``'s), and
leases the chosen jobs their resources.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ddpq.config import Settings
from ddpq.core import scheduler
from ddpq.core.policy import PREEMPTING, Order, Policy
from ddpq.core.preempt import Running, Waiting
from ddpq.core.rules import recent_usage
from ddpq.core.scheduler import elastic, preemption
from ddpq.core.scheduler.gates import NO_FREE_PORT
from ddpq.core.sharing import GpuMemory, Measured, auto_reservation, gpu_memory
from ddpq.core.states import ACTIVE
from ddpq.core.topology import NO_HARDWARE, Hardware
from ddpq.store import attempts as attempt_store
from ddpq.store import host as host_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import limits as limit_store
from ddpq.store import memory as memory_store
from ddpq.store import resizes as resize_store
from ddpq.store import supervision
from ddpq.store import sweeps as sweep_store
from ddpq.store import usage as usage_store
from ddpq.store.db import Session
from ddpq.worker import resize
from ddpq.worker.forecast import Foresight
from ddpq.worker.host import HostSetup, host_setup
from ddpq.worker.ports import PortGate

log = logging.getLogger("ddpq.worker")

# Fair share needs no millisecond precision, and its query reads a week of attempts,
# which under a stream of short jobs would dominate each pass.
USAGE_TTL_S = 5.0
# Of each shape of job that never ran, the most one pass reads (``queued_for_planning``):
# a pass over a flood of 10,000 alike jobs reads this many, not 10,000, and the rest,
# which a pass that cannot start the first cannot start either, wait behind them. Above
# what one pass could start of one shape on a large host (the worker passes again at
# once when a pass started this many).
PLAN_WINDOW = 256
# Policies that rank two alike jobs by submission alone, and so may plan a window. Every
# one does: ``srpt-progress`` ranks a job that never ran by the history of its owner and
# ``mem_key`` and by its GPUs and time limit, all part of its shape, so alike jobs tie
# and submission decides between them as the window's index order does. A policy that
# ranked alike jobs apart would be left out here (the pass then reads the whole queue).
WINDOWED = frozenset({Policy.FIFO, Policy.FAIRSHARE, Policy.LAS, Policy.SRPT_PROGRESS})
BEHIND_ALIKE = "waiting behind earlier queued jobs like it"
# Stages that stop a job for what the forecast does not model: the host's cores and
# memory, rendezvous ports, an owner's caps.
NOT_FORECAST = frozenset(
    {"cpu_cores", "host_memory", "port_budget", "free_port", "owner_limits", "running_cap"}
)
AUTO_BY_ID = 2000  # the most queued ids asked about by id (learned)


@dataclass(frozen=True)
class Holding:
    """The jobs that hold leases now: their rows, GPUs and port, and shares by memory."""

    active: list[supervision.RunningView]
    held: dict[int, tuple[list[int], int | None]]  # job -> (GPUs, port)
    shares: dict[int, tuple[int, int | None]]  # sharing job -> (bytes per GPU, share cap)
    slots: frozenset[int] = frozenset()  # CPU core slots leased (core.hostres)
    ram: int = 0  # host memory held

    @classmethod
    def read(cls, s: Session) -> Holding:
        active = supervision.running_for_supervision(s, ACTIVE)
        live = lease_store.live(s)
        slots = frozenset(c for cores in lease_store.core_slots(live).values() for c in cores)
        return cls(
            active,
            lease_store.by_job(live),
            lease_store.shares(live),
            slots,
            host_store.ram_held(s),
        )

    def running(self, now: float) -> list[scheduler.RunningJob]:
        return [
            scheduler.RunningJob(
                j.id,
                tuple(self.held.get(j.id, ([], None))[0]),
                j.started_at or now,
                j.time_limit_s,
                j.owner,
                *self.shares.get(j.id, (None, None)),
            )
            for j in self.active
        ]

    def with_gpus(self) -> list[tuple[supervision.RunningView, int]]:
        """Each lease holder and how many GPUs it holds."""
        return [(j, len(self.held.get(j.id, ([], None))[0])) for j in self.active]

    def gpus(self) -> list[list[int]]:
        """Each lease holder's GPUs."""
        return [gpus for gpus, _ in self.held.values()]

    def ports(self) -> set[int]:
        """The ports leased now."""
        return {port for _, port in self.held.values() if port is not None}

    def ports_held(self) -> dict[str, int]:
        """Rendezvous ports each owner's jobs hold."""
        out: dict[str, int] = {}
        for j in self.active:
            if self.held.get(j.id, ([], None))[1] is not None:
                out[j.owner] = out.get(j.owner, 0) + 1
        return out


class RecentUsage:
    """Recent GPU-seconds per owner, recomputed at most every USAGE_TTL_S: their jobs',
    and (``Settings.counts_outside_use``) what their accounts used outside the queue."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._usage: tuple[float, dict[str, float]] = (float("-inf"), {})

    def get(self, s: Session, now: float, gpus_per_core: float = 0.0) -> dict[str, float]:
        """``gpus_per_core``: what a leased core weighs (``core.rules.recent_usage``)."""
        cached_at, usage = self._usage
        if now - cached_at >= USAGE_TTL_S:
            cfg = self.settings
            since = now - cfg.usage_window_s
            runs = job_store.recent_runs(s, since)
            if cfg.counts_outside_use:
                runs += usage_store.outside_runs(s, since, names_are_users=not cfg.auth)
            usage = recent_usage(runs, now, cfg.usage_window_s, gpus_per_core)
            self._usage = (now, usage)
        return usage


class Scheduler:
    """The worker's planning state between passes: port rotation, cool-downs, usage."""

    def __init__(
        self,
        settings: Settings,
        ports: PortGate | None = None,
        host: HostSetup | None = None,
        timer: Callable[[], float] | None = None,
    ) -> None:
        """``timer`` measures the forecast's work (``Foresight``)."""
        self.settings = settings
        self.host = host or host_setup(settings, 0)
        self.ports = ports or PortGate()
        self.last_port: int | None = None
        self.usage = RecentUsage(settings)
        self.window = PLAN_WINDOW if settings.policy in WINDOWED else None
        self.foresight = Foresight(timer)  # srpt-progress's estimates, the predicted starts

    def lease_next(
        self,
        s: Session,
        usable_gpus: Sequence[int],
        woke_at: float,
        now: float,
        measured: Measured | None = None,
        hardware: Hardware = NO_HARDWARE,
    ) -> list[attempt_store.Leased]:
        """Plan, write the waiting reasons, and lease what starts: those jobs are now
        ``starting``, in the caller's transaction. ``measured``: the GPUs' memory as last
        sampled (None: GPUs of 16 GiB with nothing on them, as ``--fake-gpus``)."""
        cfg = self.settings
        window = self.window
        waiting = job_store.queued_for_planning(s, self.host.defaults, window)
        if not waiting:
            if resize_store.any_elastic_running(s):
                holding = Holding.read(s)  # nobody waits: elastic jobs may grow
                free = preemption.free_after(usable_gpus, holding.gpus(), [])
                resize.ask_grows(s, cfg, False, holding.active, holding.held, free, now)
            return []
        candidates = learned(s, cfg, [job for job, _ in waiting])
        holding = Holding.read(s)
        if self.last_port is None:
            self.last_port = lease_store.last_port(s)
        ports = self.ports.candidates(*cfg.port_range, self.last_port, holding.ports(), now)
        world = read_world(s, cfg, candidates, holding, usable_gpus, ports, now, measured)
        world = replace(world, hardware=hardware, host=self.host.use(holding.slots, holding.ram))
        # A core weighs the host's GPUs over its cores (one GPU's worth where it has none).
        cores = self.host.capacity
        per_core = max(len(usable_gpus), 1) / cores if cores else 0.0
        order = Order(cfg.policy, self.usage.get(s, now, per_core))
        if cfg.policy is Policy.LAS:  # ranked by the service each job has had so far
            served = attempt_store.attained(s, [c.id for c in candidates], now)
            candidates = [replace(c, attained_s=served.get(c.id, 0.0)) for c in candidates]
        holders = holding.with_gpus()
        if cfg.policy is Policy.SRPT_PROGRESS:  # by estimated remaining GPU-time
            order = self.foresight.srpt_order(s, order, candidates, holders, now)
        decided = scheduler.decide(candidates, world, order)
        # Never launched on a port that fails its test-bind: swapped for a spare one that
        # passes, or the job waits (and its reason says who holds the ports).
        placements = self.ports.confirm(decided.placements, ports, now)
        dropped = {p.job_id for p in decided.placements} - {p.job_id for p in placements}
        port_wait = self.ports.waiting_reason(now)
        reasons = {
            job_id: port_wait if why == NO_FREE_PORT else why
            for job_id, why in decided.reasons.items()
        }
        reasons.update(dict.fromkeys(dropped, port_wait))  # it fit, but for a port
        # Elastic jobs grow and give back what they were lent under every policy.
        if cfg.policy in PREEMPTING or resize.least(holding.active):
            ready = preemption.waiting_for_gpus(
                candidates, decided, placements, world.sweep_caps, dropped
            )
            free = preemption.free_after(usable_gpus, holding.gpus(), placements)
            preempt_for(s, cfg, ready, holding, free, order, now)
            # Waiting for GPUs: those freed GPUs could start, and those sharing by memory.
            blocked = bool(ready) or "backfill" in decided.stopped_by.values()
            resize.ask_grows(s, cfg, blocked, holding.active, holding.held, free, now)
        reasons = resize.with_note(reasons, decided.stopped_by, holding.active, holding.held, now)
        job_store.set_waiting_reasons(s, reasons, {job.id: why for job, why in waiting})
        total = len(usable_gpus)
        # The forecast models GPUs only: a job held back by something else has no start
        # it could tell ("?" rather than a "now" that is not so).
        unknown = dropped | {i for i, stage in decided.stopped_by.items() if stage in NOT_FORECAST}
        self.foresight.forecast(s, order, total, candidates, placements, holders, now, unknown)
        for p in placements:
            if p.port is not None:
                self.last_port = p.port  # the next pass starts its rotation after it
        leased = lease(s, cfg, placements, candidates, woke_at, now, self.host)
        resized = {c.id: c.resize_to for c in candidates if c.resize_to is not None}
        resize.note_resized(s, resized, {job.job_id: len(job.gpus) for job in leased}, now)
        if window is not None and len(waiting) >= window:  # some may be past the window
            job_store.say_unplanned(s, BEHIND_ALIKE)
        return leased


def read_world(
    s: Session,
    cfg: Settings,
    candidates: Sequence[scheduler.QueuedJob],
    holding: Holding,
    usable_gpus: Sequence[int],
    free_ports: Sequence[int],
    now: float,
    measured: Measured | None,
) -> scheduler.World:
    """What this pass decides in, read from the store and this host."""
    running = holding.running(now)
    sweeps = {c.sweep_id for c in candidates if c.sweep_id is not None}
    return scheduler.World(
        usable_gpus,
        running,
        free_ports,
        now,
        scheduler.PortBudget(cfg.ports_per_user, holding.ports_held()),
        sweep_store.caps(s, sweeps),
        memory_now(cfg, measured or Measured.idle(usable_gpus), running),
        limit_store.limits(s),
        limit_store.open_reservations(s, now),
        running_cap=cfg.max_running_per_user,
    )


def lease(
    s: Session,
    cfg: Settings,
    placements: Sequence[scheduler.Placement],
    candidates: Sequence[scheduler.QueuedJob],
    woke_at: float,
    now: float,
    host: HostSetup | None = None,
) -> list[attempt_store.Leased]:
    """Lease each placed job its GPUs, port and CPU cores: it is ``starting`` now."""
    by_id = {c.id: c for c in candidates}
    placed = [
        attempt_store.Placed(
            p.job_id,
            p.gpus,
            p.port,
            str(cfg.jobs_dir / str(p.job_id)),
            # From when it could have been placed: woken, or submitted if later.
            max(0.0, now - max(woke_at, by_id[p.job_id].submitted_at)),
            p.mem_bytes,
            by_id[p.job_id].share_cap if p.mem_bytes is not None else None,
            p.cores,
            host.cores_of(p.cores) if host is not None else (),
            p.ram_bytes,
        )
        for p in placements
    ]
    return attempt_store.lease_and_start(s, placed, now)


def preempt_for(
    s: Session,
    cfg: Settings,
    waiting: Sequence[Waiting],
    holding: Holding,
    free: int,
    order: Order,
    now: float,
) -> None:
    """Under LAS: ask running jobs of worse queues to checkpoint and go, so that waiting
    jobs of better ones can start (``core.preempt``); their GPUs come back when they do.
    Elastic jobs shrink instead where they can (under every policy for what they were
    lent, ``core.scheduler.elastic``; whole preemptions only under a preempting one).
    ``waiting``: those freed GPUs could start (``scheduler.preemption``); ``free``: the
    usable GPUs nobody holds once this pass's placements start. A job that shares GPUs by
    memory is never preempted (its GPU would stay shared)."""
    if not waiting:
        return
    whole = [j for j in holding.active if j.id not in holding.shares]
    gpus_of = {j.id: len(holding.held.get(j.id, ([], None))[0]) for j in whole}
    # GPUs of jobs already being stopped are as good as free: do not preempt twice.
    leaving = sum(resize.leaving(j, gpus_of[j.id]) for j in whole if j.stop_request)
    running = [
        Running(
            j.id,
            j.owner,
            j.priority,
            j.submitted_at,
            0.0,  # the service each has had: read below, if anyone may give at all
            gpus_of[j.id],
            j.started_at or now,
            j.preemptible,
            j.preemptions,
        )
        for j in whole
        if not j.stop_request
    ]
    least, guards, preempt = resize.least(whole), resize.guards(cfg), cfg.policy in PREEMPTING
    if not elastic.anyone_may_give(running, least, now, guards, preempt):
        return
    served = attempt_store.attained(s, [j.id for j in holding.active], now)
    running = [replace(r, attained_s=served.get(r.id, 0.0)) for r in running]
    # An elastic job the rule picks gives up only what is lacking (core.scheduler.elastic).
    shrinks, wanted = elastic.shrink_or_preempt(
        waiting, running, least, free + leaving, order, now, guards, preempt=preempt
    )
    resize.ask_shrinks(s, shrinks)
    if wanted:
        why = {p.victim: f"preempted for job {p.for_job}" for p in wanted}
        for job_id in attempt_store.request_preemptions(s, why):
            log.info("job %s: %s (it has had more service)", job_id, why[job_id])


def learned(
    s: Session, cfg: Settings, candidates: Sequence[scheduler.QueuedJob]
) -> list[scheduler.QueuedJob]:
    """The queue with each ``auto`` job's reservation learned from what earlier runs of it
    were measured to use (``core.sharing.auto_reservation``); one without such a run asks
    for its GPUs whole, and its peak is learned."""
    ids = [c.id for c in candidates]
    # By id for a window's worth; the whole queue (no window) by a walk, not an IN list of
    # tens of thousands of parameters (older SQLite builds take 999).
    among = ids if len(ids) <= AUTO_BY_ID else None
    planned = set(ids)
    auto = [i for i in job_store.auto_memory_jobs(s, among) if i in planned]
    if not auto:
        return list(candidates)
    measured = memory_store.measured_for(s, auto)
    margin = cfg.gpu_mem_margin
    found = {job_id: auto_reservation(measured.get(job_id), margin) for job_id in auto}
    return [replace(c, mem_bytes=found[c.id]) if c.id in found else c for c in candidates]


def memory_now(
    cfg: Settings, measured: Measured, running: Sequence[scheduler.RunningJob]
) -> GpuMemory:
    """Each GPU's memory as the planner counts it: what no live reservation covers is
    outside use, whoever holds it."""
    sharers: dict[int, dict[int, int]] = {}
    for job in running:
        if job.mem_bytes is not None:
            for g in job.gpus:
                sharers.setdefault(g, {})[job.id] = job.mem_bytes
    return gpu_memory(measured, sharers, cfg.gpu_mem_headroom_bytes)
