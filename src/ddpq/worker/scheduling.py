"""Planning and leasing in the worker's transaction: what starts now, on which GPUs and port.

The decision is ``core.plan``'s; this gathers its inputs from the store (the queue, the
leases held, recent use per owner, limits, reservations, what ``auto`` jobs were measured
to use) and from this host (which ports are really free, what the GPUs' memory holds),
writes why each waiting job waits, and leases the chosen jobs their resources.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from ddpq.config import Settings
from ddpq.core import plan as planner
from ddpq.core.policy import Order, Policy
from ddpq.core.preempt import Guards, Running, Waiting, victims
from ddpq.core.rules import recent_usage
from ddpq.core.sharing import GpuMemory, Measured, auto_reservation, gpu_memory
from ddpq.core.states import ACTIVE
from ddpq.store import attempts as attempt_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import limits as limit_store
from ddpq.store import memory as memory_store
from ddpq.store import sweeps as sweep_store
from ddpq.store import usage as usage_store
from ddpq.store.db import Session
from ddpq.worker.ports import PortGate

log = logging.getLogger("ddpq.worker")

# Fair share needs no millisecond precision, and its query reads a week of attempts,
# which under a stream of short jobs would dominate each pass.
USAGE_TTL_S = 5.0


class Scheduler:
    """The worker's planning state between passes: port rotation, cool-downs, usage."""

    def __init__(self, settings: Settings, ports: PortGate | None = None) -> None:
        self.settings = settings
        self.ports = ports or PortGate()
        self.last_port: int | None = None
        self._usage: tuple[float, dict[str, float]] = (float("-inf"), {})

    def lease_next(
        self,
        s: Session,
        usable_gpus: Sequence[int],
        woke_at: float,
        now: float,
        measured: Measured | None = None,
    ) -> list[attempt_store.Leased]:
        """Plan, write the waiting reasons, and lease what starts: those jobs are now
        ``starting``, in the caller's transaction. ``measured``: the GPUs' memory as last
        sampled (None: GPUs of 16 GiB with nothing on them, as ``--fake-gpus``)."""
        cfg = self.settings
        waiting = job_store.queued_for_planning(s)
        if not waiting:
            return []
        candidates = self._learned([job for job, _ in waiting], s)
        active = job_store.running_for_supervision(s, ACTIVE)
        live = lease_store.live(s)
        held = lease_store.by_job(live)
        shares = lease_store.shares(live)
        running = [
            planner.RunningJob(
                j.id,
                tuple(held.get(j.id, ([], None))[0]),
                j.started_at or now,
                j.time_limit_s,
                j.owner,
                *shares.get(j.id, (None, None)),
            )
            for j in active
        ]
        memory = self._memory(measured or Measured.idle(usable_gpus), running)
        limits = limit_store.limits(s)
        reserved = limit_store.open_reservations(s, now)
        leased_ports = {port for _, port in held.values() if port is not None}
        ports_held: dict[str, int] = {}
        for j in active:
            if held.get(j.id, ([], None))[1] is not None:
                ports_held[j.owner] = ports_held.get(j.owner, 0) + 1
        budget = planner.PortBudget(cfg.ports_per_user, ports_held)
        caps = sweep_store.caps(s, {c.sweep_id for c in candidates if c.sweep_id is not None})
        if self.last_port is None:
            self.last_port = lease_store.last_port(s)
        usage = self._recent_usage(s, now)
        order = Order(cfg.policy, usage)
        served: dict[int, float] = {}
        if cfg.policy is Policy.LAS:  # ranked by the service each job has had so far
            served = attempt_store.attained(s, [c.id for c in candidates], now)
            candidates = [replace(c, attained_s=served.get(c.id, 0.0)) for c in candidates]
        free_ports = self.ports.candidates(*cfg.port_range, self.last_port, leased_ports, now)
        decided = planner.plan_explained(
            candidates,
            usable_gpus,
            running,
            free_ports,
            usage,
            now,
            budget,
            order,
            caps,
            memory=memory,
            limits=limits,
            reservations=reserved,
        )
        notes = decided.notes
        # Never launched on a port that fails its test-bind: swapped for a spare one that
        # passes, or the job waits (and its reason says who holds the ports).
        placements = self.ports.confirm(decided.placements, free_ports, now)
        port_wait = self.ports.waiting_reason(now)
        reasons = planner.explain_waits(
            candidates,
            usable_gpus,
            placements,
            [p for p in free_ports if p not in self.ports.cooldown],
            usage,
            now,
            budget,
            order,
            caps,
            memory=memory,
            notes=notes,
            port_wait=port_wait,
        )
        dropped = {p.job_id for p in decided.placements} - {p.job_id for p in placements}
        reasons.update(dict.fromkeys(dropped, port_wait))  # it fit, but for a port
        if cfg.policy is Policy.LAS:
            held_back = dropped | {c.id for c in candidates if c.id in notes}
            self._preempt_for(
                s,
                candidates,
                placements,
                active,
                held,
                shares,
                usable_gpus,
                order,
                caps,
                now,
                held_back,
            )
        job_store.set_waiting_reasons(s, reasons, {job.id: why for job, why in waiting})
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
            )
            for p in placements
        ]
        for p in placements:
            if p.port is not None:
                self.last_port = p.port
        return attempt_store.lease_and_start(s, placed, now)

    def _preempt_for(
        self,
        s: Session,
        candidates: Sequence[planner.QueuedJob],
        placements: Sequence[planner.Placement],
        active: Sequence[job_store.RunningView],
        held: dict[int, tuple[list[int], int | None]],
        shares: dict[int, tuple[int, int | None]],
        usable_gpus: Sequence[int],
        order: Order,
        caps: planner.SweepCaps,
        now: float,
        held_back: set[int],
    ) -> None:
        """Under LAS: ask running jobs of worse queues to checkpoint and go, so that waiting
        jobs of better ones can start (``core.preempt``); their GPUs come back when they do.

        ``core.preempt`` counts whole GPUs: no job is preempted for a job that shares GPUs
        by memory, nor is one that shares them preempted (its GPU would stay shared), and a
        shared GPU is not free. Nor for a job a limit or a reservation holds back
        (``held_back``): freed GPUs would not let it start."""
        placed = {p.job_id for p in placements}
        sweeps_placed: dict[int, int] = {}
        for c in candidates:
            if c.id in placed and c.sweep_id is not None:
                sweeps_placed[c.sweep_id] = sweeps_placed.get(c.sweep_id, 0) + 1
        # A member its sweep's cap holds back could not start on freed GPUs: no one is
        # preempted for it.
        waiting = [
            Waiting(c.id, c.owner, c.priority, c.submitted_at, c.attained_s, c.gpus)
            for c in candidates
            if c.id not in placed
            and c.id not in held_back
            and c.mem_bytes is None
            and (c.not_before is None or c.not_before <= now)
            and caps.allows(c.sweep_id, sweeps_placed)
        ]
        if not waiting:
            return
        whole = [j for j in active if j.id not in shares]
        gpus_of = {j.id: len(held.get(j.id, ([], None))[0]) for j in whole}
        # GPUs of jobs already being stopped are as good as free: do not preempt twice.
        leaving = sum(gpus_of[j.id] for j in whole if j.stop_request)
        taken = {g for gpus, _ in held.values() for g in gpus}
        taken.update(g for p in placements for g in p.gpus)
        free = len(set(usable_gpus) - taken)
        served = attempt_store.attained(s, [j.id for j in active], now)
        running = [
            Running(
                j.id,
                j.owner,
                j.priority,
                j.submitted_at,
                served.get(j.id, 0.0),
                gpus_of[j.id],
                j.started_at or now,
                j.preemptible,
                j.preemptions,
            )
            for j in whole
            if not j.stop_request
        ]
        guards = Guards(self.settings.preempt_min_run_s, self.settings.max_preemptions)
        wanted = victims(waiting, running, free + leaving, order, now, guards)
        if wanted:
            why = {p.victim: f"preempted for job {p.for_job}" for p in wanted}
            for job_id in attempt_store.request_preemptions(s, why):
                log.info("job %s: %s (it has had more service)", job_id, why[job_id])

    def _learned(
        self, candidates: Sequence[planner.QueuedJob], s: Session
    ) -> list[planner.QueuedJob]:
        """The queue with each ``auto`` job's reservation learned from what earlier runs of
        it were measured to use (``core.sharing.auto_reservation``); one without such a
        run asks for its GPUs whole, and its peak is learned."""
        auto = job_store.auto_memory_jobs(s)
        if not auto:
            return list(candidates)
        measured = memory_store.measured_for(s, auto)
        margin = self.settings.gpu_mem_margin
        learned = {job_id: auto_reservation(measured.get(job_id), margin) for job_id in auto}
        return [replace(c, mem_bytes=learned[c.id]) if c.id in learned else c for c in candidates]

    def _memory(self, measured: Measured, running: Sequence[planner.RunningJob]) -> GpuMemory:
        """Each GPU's memory as the planner counts it: what no live reservation covers is
        outside use, whoever holds it."""
        sharers: dict[int, dict[int, int]] = {}
        for job in running:
            if job.mem_bytes is not None:
                for g in job.gpus:
                    sharers.setdefault(g, {})[job.id] = job.mem_bytes
        return gpu_memory(measured, sharers, self.settings.gpu_mem_headroom_bytes)

    def _recent_usage(self, s: Session, now: float) -> dict[str, float]:
        """Recent GPU-seconds per owner, recomputed at most every USAGE_TTL_S: their jobs',
        and (``Settings.counts_outside_use``) what their accounts used outside the queue."""
        cached_at, usage = self._usage
        if now - cached_at >= USAGE_TTL_S:
            cfg = self.settings
            since = now - cfg.usage_window_s
            runs = job_store.recent_runs(s, since)
            if cfg.counts_outside_use:
                runs += usage_store.outside_runs(s, since, names_are_users=not cfg.auth)
            usage = recent_usage(runs, now, cfg.usage_window_s)
            self._usage = (now, usage)
        return usage
