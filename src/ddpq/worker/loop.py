"""The agent loop on the GPU host: reconcile, schedule, launch, watch, release.

One thread, woken by a datagram on the wake socket (submit, cancel), by a
job's shim exiting (pidfd), or by a timer (time limits, back-offs, progress).
It knows processes; the shim knows one job; decisions come from ``ddpq.core``
and every database access goes through ``ddpq.store``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import json
import logging
import math
import os
import re
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ddpq import wake
from ddpq.config import Settings
from ddpq.core import plan as planner
from ddpq.core.rules import (
    ExitRecord,
    StopRequest,
    outcome_of,
    past_time_limit,
    recent_usage,
    retry_backoff_s,
    should_retry,
)
from ddpq.core.states import ACTIVE, JobState
from ddpq.core.untrusted import clean_text, nesting_depth, parse_progress
from ddpq.store import devices as device_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import users as user_store
from ddpq.store.db import Database, Session, storage_fault
from ddpq.store.models import Job
from ddpq.worker import cgroups, gpu_fence, procs
from ddpq.worker.devices import Device, DevicesUnavailable, discover, external_pids
from ddpq.worker.launch import (
    JOB_UMASK,
    LaunchSpec,
    NoAccount,
    account_for,
    job_argv,
    job_env,
    shim_argv,
    threads_per_rank,
)
from ddpq.worker.ports import port_is_free, rotation

log = logging.getLogger("ddpq.worker")

EXIT_RECORD = "exit.json"
PORT_CLASH = ("eaddrinuse", "address already in use")
PORT_COOLDOWN_S = 30.0
PROGRESS_EVERY_S = 1.0
DEVICE_REFRESH_S = 5.0
USAGE_TTL_S = 5.0


@dataclass
class Watched:
    ident: procs.Identity
    job_dir: Path
    fd: int | None
    attempt: int
    child: subprocess.Popen[bytes] | None = None


@dataclass
class Launch:
    job_id: int
    spec: LaunchSpec
    owner: str
    unix_user: str | None  # the owner's mapped account, if a ddpq user maps one


@dataclass
class WorkerState:
    watched: dict[int, Watched] = field(default_factory=dict)
    # Jobs whose shims ended, with their exit records, not yet recorded in the database.
    exits: list[tuple[int, Watched, ExitRecord]] = field(default_factory=list)
    port_cooldown: dict[int, float] = field(default_factory=dict)
    last_port: int | None = None


class Worker:
    def __init__(self, settings: Settings, devices: list[Device] | None = None) -> None:
        self.settings = settings
        self.db = Database(settings.db_path, durable=False)
        # Its mode (0711: jobs pass through, nobody lists) is set by daemon.make_private.
        self.settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        self._sock = wake.listen(settings.wake_socket)
        self._stop = threading.Event()
        self._state = WorkerState()
        self._devices = devices if devices is not None else discover(settings.fake_gpus)
        self._devices_at = time.monotonic()
        self._external: set[int] = set()
        self._progress_at = 0.0
        self._woke_at = time.time()
        self._cpu = os.cpu_count() or 1
        self._usage_cache: tuple[float, dict[str, float]] = (0.0, {})
        self._failing: dict[str, str] = {}  # phase -> the failure last logged for it
        self._tracking = self._detect_tracking()
        self._warned: set[str] = set()

    def _detect_tracking(self) -> cgroups.Tracking:
        """A cgroup per job where cgroup v2 allows it (``DDPQ_TRACKING=session`` says no),
        with a device fence where the kernel allows that too; else the job's session."""
        try:
            tracking = cgroups.detect(self.settings.home)
        except OSError as exc:  # an odd hierarchy must not stop the daemon: fall back
            tracking = cgroups.Tracking("session", why=f"cgroup setup failed: {exc}")
        tree = tracking.tree
        if tree is not None:
            tracking = dataclasses.replace(tracking, fence_error=gpu_fence.probe(tree))
            # Removed when the daemon exits, unless jobs still run in it (they keep
            # running, and a restart finds them there).
            atexit.register(cgroups.remove, tree)
        return tracking

    @property
    def tracking(self) -> cgroups.Tracking:
        return self._tracking

    def _warn_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, *args)

    # ---- life cycle -------------------------------------------------------

    @property
    def devices(self) -> list[Device]:
        return list(self._devices)

    @property
    def external_gpus(self) -> set[int]:
        return set(self._external)

    def run(self) -> None:
        try:
            self.reconcile()
        except Exception:
            log.exception("reconcile failed; serving on")
        while not self._stop.is_set():
            self.step()
            self._wait()
        if self.settings.stop_jobs_on_exit:
            self.stop_all_jobs()
        self.close()

    def stop(self) -> None:
        self._stop.set()
        wake.nudge(self.settings.wake_socket)

    def close(self) -> None:
        for w in self._state.watched.values():
            if w.fd is not None:
                os.close(w.fd)
        self._sock.close()
        self.db.dispose()

    def _wait(self) -> None:
        fds: list[Any] = [self._sock]
        fds += [w.fd for w in self._state.watched.values() if w.fd is not None]
        try:
            ready, _, _ = select.select(fds, [], [], self.settings.poll_s)
        except InterruptedError:
            ready = []
        self._woke_at = time.time()
        if self._sock in ready:
            wake.drain(self._sock)

    def step(self) -> None:
        """One pass. Each phase runs even when another failed: a broken progress file or
        a failing stop must not keep the queue from being scheduled."""
        self._guarded("gathering exits", self._gather_exits)
        self._guarded("enforcing stops", lambda: self._enforce_stops(time.time()))
        self._guarded("refreshing devices", self._refresh_devices)
        # Also records the exits gathered above, in the same transaction.
        self._guarded("scheduling", self._schedule)
        self._guarded("reading progress", self._update_progress)

    def _guarded(self, phase: str, run: Callable[[], None]) -> None:
        """Run one phase; log a failure once per condition, not every pass.

        A full disk or a read-only database fails every pass (twice a second) until
        someone fixes it: the first failure is logged with its traceback, the same
        failure again is not, and the recovery is.
        """
        try:
            run()
        except Exception as exc:
            condition = f"{type(exc).__name__}: {storage_fault(exc) or exc}"
            if self._failing.get(phase) != condition:
                self._failing[phase] = condition
                log.exception("worker: %s failed (%s); retrying every pass", phase, condition)
            return
        if self._failing.pop(phase, None) is not None:
            log.info("worker: %s works again", phase)

    # ---- reconcile: what is really running? --------------------------------

    def reconcile(self) -> None:
        """Adopt the jobs that still run, finalise those that ended while we were down."""
        self._publish_devices()
        with self.db.read() as s:
            active = [
                (j.id, JobState(j.state), j.job_dir, j.shim_pid, j.shim_start_ticks, j.attempt)
                for j in job_store.jobs_in(s, ACTIVE)
            ]
        for job_id, state, job_dir, pid, ticks, attempt in active:
            try:
                self._reconcile_one(job_id, state, job_dir, pid, ticks, attempt)
            except Exception:  # one odd job must not keep the others from being adopted
                log.exception("job %s: could not be reconciled", job_id)
        self._collect_exits()

    def _reconcile_one(
        self,
        job_id: int,
        state: JobState,
        job_dir: str | None,
        pid: int | None,
        ticks: int | None,
        attempt: int,
    ) -> None:
        if job_dir is None:
            self._requeue_unlaunched(job_id, "launch interrupted before the job started")
            return
        if pid is None or ticks is None:
            found = procs.find_shim(job_dir)
            ident = procs.identity(found) if found else None
            if ident is None:
                if read_exit_record(Path(job_dir), attempt) is not None:
                    # It ran and ended while we were down: finalise from its record.
                    self._watch(job_id, procs.Identity(-1, -1), Path(job_dir), attempt)
                    return
                self._requeue_unlaunched(job_id, "launch interrupted before the job started")
                return
            self._mark_running(job_id, ident, Path(job_dir))
        else:
            ident = procs.Identity(pid, ticks)
        self._watch(job_id, ident, Path(job_dir), attempt)
        log.info("job %s: re-adopted (%s, shim pid %s)", job_id, state.value, ident.pid)

    def _requeue_unlaunched(self, job_id: int, reason: str) -> None:
        now = time.time()
        with self.db.write() as s:
            job = job_store.get_job(s, job_id)
            if job.stop_request == StopRequest.CANCEL:  # cancelled before it ever ran
                end_unlaunched(s, job, JobState.CANCELLED, "cancelled before it started", now)
            else:
                end_unlaunched(s, job, JobState.QUEUED, reason, now)

    # ---- watch ---------------------------------------------------------------

    def _watch(
        self,
        job_id: int,
        ident: procs.Identity,
        job_dir: Path,
        attempt: int,
        child: subprocess.Popen[bytes] | None = None,
    ) -> None:
        fd = procs.pidfd(ident.pid) if ident.pid > 0 else None
        # The pidfd pins this process; if it is not the one we mean, it exited already.
        self._state.watched[job_id] = Watched(ident, job_dir, fd, attempt, child)

    def _collect_exits(self) -> None:
        self._gather_exits()
        if self._state.exits:
            with self.db.write() as s:
                self._record_exits(s)
            self._state.exits.clear()  # committed

    def _gather_exits(self) -> None:
        """Move every watched job whose shim has ended to ``exits`` (with its record)."""
        ended = []
        for job_id, w in self._state.watched.items():
            if w.child is not None:
                w.child.poll()  # reap our own child so it does not linger as a zombie
            if not procs.is_alive(w.ident):
                ended.append(job_id)
        if not ended:
            return
        # One look at /proc for all of them: which sessions still have processes.
        occupied = procs.occupied_sessions()
        for job_id in ended:
            w = self._state.watched.pop(job_id)
            if w.fd is not None:
                os.close(w.fd)
            self._state.exits.append((job_id, w, self._exit_record(w, occupied)))

    def _record_exits(self, s: Session) -> None:
        """Finalise the gathered exits in the caller's transaction.

        All the jobs that ended since the last look, and the jobs that start on their
        GPUs, go in one transaction: under a stream of short jobs that is what keeps
        the write lock free for submissions. The caller empties ``exits`` once the
        transaction has committed, so a failed one is retried at the next step.
        """
        now = time.time()
        for job_id, w, record in self._state.exits:
            try:
                with s.begin_nested():  # a savepoint: one bad exit must not undo the others
                    self._apply_exit(s, job_id, w, record, now)
            except Exception:
                log.exception("job %s: could not record its end; marking it failed", job_id)
                broken = ExitRecord(None, None, now, now, error="its end could not be recorded")
                try:
                    with s.begin_nested():
                        # Nothing the job wrote is read this time: that may be what failed.
                        self._apply_exit(s, job_id, w, broken, now, read_files=False)
                except Exception:  # leave it to reconcile at the next start, but go on
                    log.exception("job %s: could not mark it failed either", job_id)

    def _exit_record(self, w: Watched, occupied: set[int]) -> ExitRecord:
        record = read_exit_record(w.job_dir, w.attempt)
        cgroup = self._cgroup_of(w.job_dir, w.attempt)
        if cgroup is not None:
            return self._end_cgroup(cgroup, record)
        # No cgroup (session tracking): find what is left by session and environment.
        marker = f"DDPQ_JOB_DIR={w.job_dir}".encode()

        def stragglers() -> list[int]:
            found = set(procs.session_members(w.ident))
            if record is None and w.ident.start_ticks >= 0:
                found.update(procs.marked_with(marker, w.ident.start_ticks))
            return sorted(found)

        if record is not None:
            # The shim leaves nothing behind, so its session is empty: unless the record
            # was written by the job itself, which then killed its shim.
            if w.ident.pid not in occupied:
                return record
            left = stragglers()
            if not left:
                return record
            procs.kill_all(left)
            record = None
        # The shim vanished without its record (killed -9, OOM killer...): the job is
        # lost. Kill whatever of it survives before its GPUs are handed out again.

        left = stragglers()
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            procs.kill_all(left)
            time.sleep(0.01)
            left = stragglers()
        now = time.time()
        return ExitRecord(
            None, None, now, now, error="lost: the job's shim ended without an exit record"
        )

    def _cgroup_of(self, job_dir: Path, attempt: int) -> Path | None:
        """The job attempt's cgroup, if it has one: named from the job's id and attempt,
        in this run's tree or (re-adopted) an earlier run's."""
        for tree in self._tracking.trees:
            path = cgroups.job_cgroup(tree, job_dir.name, attempt)
            if path.is_dir():
                return path
        return None

    def _end_cgroup(self, cgroup: Path, record: ExitRecord | None) -> ExitRecord:
        """The shim has ended: kill all that is left of the job, then remove its cgroup.

        The shim empties its cgroup before it writes its record, so a process still in
        it means the shim did not get that far (killed, or the record is the job's own
        forgery): the job is lost. Either way nothing of it outlives this call (bounded
        wait), so its GPUs are free when its leases are released.
        """
        if cgroups.populated(cgroup):
            record = None
        if not cgroups.destroy(cgroup, timeout=10):
            log.warning("%s: processes left that even cgroup.kill did not end", cgroup)
        if record is not None:
            return record
        now = time.time()
        return ExitRecord(
            None, None, now, now, error="lost: the job's shim ended without an exit record"
        )

    def _apply_exit(
        self,
        s: Session,
        job_id: int,
        w: Watched,
        record: ExitRecord,
        now: float,
        read_files: bool = True,
    ) -> None:
        job = job_store.get_job(s, job_id)
        if JobState(job.state) not in ACTIVE or job.attempt != w.attempt:
            return
        if JobState(job.state) is JobState.STARTING:
            # It ran and ended while no worker watched (we died right after launching it).
            job_store.set_state(s, job, JobState.RUNNING, "started (found after restart)", now)
        stop = StopRequest(job.stop_request) if job.stop_request else None
        outcome = outcome_of(record, stop, self.settings.grace_s)
        ended_at = record.ended_at or now  # when its processes were gone, not when we noticed
        job_store.end_attempt(
            s,
            job,
            exit_code=record.exit_code,
            exit_signal=record.signal,
            state=outcome.state,
            reason=outcome.reason,
            now=ended_at,
        )
        lease_store.release(s, job_id, now)
        job.shim_pid = None
        job.shim_start_ticks = None
        job.ended_at = ended_at
        progress = read_progress(w.job_dir) if read_files else None
        if progress is not None:
            job.progress = progress
        clash = read_files and self._port_clash(job, w.job_dir)
        if outcome.state is JobState.FAILED and clash:
            job.port_retries += 1
            job_store.set_state(
                s,
                job,
                JobState.QUEUED,
                f"rendezvous port was taken (EADDRINUSE); requeued on another port "
                f"(try {job.port_retries} of {self.settings.max_port_retries})",
                now,
            )
        elif should_retry(outcome.state, job.attempt, job.max_retries):
            delay = retry_backoff_s(job.attempt)
            job.not_before = now + delay
            job_store.set_state(
                s,
                job,
                JobState.QUEUED,
                f"attempt {job.attempt} failed ({outcome.reason}); retry "
                f"{job.attempt} of {job.max_retries} in {delay:g}s",
                now,
            )
        else:
            job_store.finish(s, job, outcome.state, outcome.reason, ended_at)
        log.info("job %s: %s", job_id, outcome.reason)

    def _port_clash(self, job: Job, job_dir: Path) -> bool:
        if job.port_retries >= self.settings.max_port_retries:
            return False
        return rendezvous_port_clash(read_tail(job_dir / "output.log", 64 * 1024))

    # ---- stops: cancel requests and time limits ----------------------------

    def _enforce_stops(self, now: float) -> None:
        to_signal: list[tuple[int, procs.Identity]] = []
        with self.db.read() as s:
            active = job_store.running_for_supervision(s)
            need = [
                j
                for j in active
                if (j.stop_request and j.stop_sent_at is None)
                or (not j.stop_request and past_time_limit(j.started_at, j.time_limit_s, now))
            ]
        if not need:
            return
        with self.db.write() as s:
            for stale in need:
                job = job_store.get_job(s, stale.id)
                if JobState(job.state) is not JobState.RUNNING or job.stop_sent_at is not None:
                    continue
                if not job.stop_request:
                    job.stop_request = StopRequest.TIMEOUT.value
                if job.shim_pid is None or job.shim_start_ticks is None:
                    continue
                job.stop_sent_at = now
                to_signal.append((job.id, procs.Identity(job.shim_pid, job.shim_start_ticks)))
        for job_id, ident in to_signal:
            # The shim forwards SIGTERM to the job's group and SIGKILLs it after the grace.
            if procs.is_alive(ident):
                procs.send(ident.pid, signal.SIGTERM)
                log.info("job %s: stop requested, SIGTERM sent", job_id)

    def stop_all_jobs(self) -> None:
        with self.db.write() as s:
            for job in job_store.jobs_in(s, ACTIVE):
                job_store.request_stop(s, job, StopRequest.CANCEL.value)
        deadline = time.monotonic() + self.settings.grace_s + 30
        while self._state.watched and time.monotonic() < deadline:
            self._enforce_stops(time.time())
            self._collect_exits()
            time.sleep(0.05)

    # ---- devices ---------------------------------------------------------------

    def _refresh_devices(self) -> None:
        if self.settings.fake_gpus is not None:
            return
        if time.monotonic() - self._devices_at < DEVICE_REFRESH_S:
            return
        self._devices_at = time.monotonic()
        try:
            self._devices = discover(None)
        except DevicesUnavailable as exc:
            log.warning("%s", exc)
            return
        ours: set[int] = set()
        for w in self._state.watched.values():
            ours.update(procs.session_members(w.ident))
        self._external = {d.index for d in self._devices if external_pids(d, ours)}
        self._publish_devices(ours)

    def _publish_devices(self, ours: set[int] | None = None) -> None:
        outside = {d.index: set(external_pids(d, ours or set())) for d in self._devices}
        rows = [
            device_store.DeviceRow(
                index=d.index,
                uuid=d.uuid,
                name=d.name,
                fake=d.fake,
                memory_total_mb=d.memory_total_mb,
                memory_used_mb=d.memory_used_mb,
                external=d.index in self._external,
                external_processes=[
                    {"pid": p.pid, "used_memory_mb": p.used_memory_mb}
                    for p in d.processes
                    if p.pid in outside[d.index]
                ],
            )
            for d in self._devices
        ]
        with self.db.write() as s:
            device_store.replace_all(s, rows, time.time())

    def usable_gpus(self) -> list[int]:
        indices = [d.index for d in self._devices]
        if self.settings.external_policy == "avoid":
            return [i for i in indices if i not in self._external]
        return indices

    # ---- schedule and launch ---------------------------------------------------

    def _schedule(self) -> None:
        launches = self._lease_next()
        if not launches:
            return
        started: list[tuple[Launch, procs.Identity, subprocess.Popen[bytes]]] = []
        failed: list[tuple[int, str]] = []
        for launch in launches:
            try:
                child = self._spawn(launch)
            except Exception as exc:  # whatever it is, it fails this job, not the others
                failed.append((launch.job_id, launch_error(exc)))
                continue
            ident = procs.identity(child.pid)
            if ident is None:  # exited already and was reaped? Not possible before poll().
                ident = procs.Identity(child.pid, 0)
            started.append((launch, ident, child))
        now = time.time()
        with self.db.write() as s:
            for launch, ident, _ in started:
                job_store.mark_running(
                    s, launch.job_id, ident.pid, ident.start_ticks, "started", now
                )
            for job_id, reason in failed:
                end_unlaunched(s, job_store.get_job(s, job_id), JobState.FAILED, reason, now)
        for launch, ident, child in started:
            self._watch(launch.job_id, ident, launch.spec.job_dir, launch.spec.attempt, child)

    def _lease_next(self) -> list[Launch]:
        """Record the gathered exits, then plan and lease, in one BEGIN IMMEDIATE transaction."""
        with self.db.write() as s:
            self._record_exits(s)
            launches = self._plan_and_lease(s)
        self._state.exits.clear()  # committed
        return launches

    def _plan_and_lease(self, s: Session) -> list[Launch]:
        """Decide what starts now and lease it GPUs and a port; those jobs move to starting."""
        now = time.time()
        cfg = self.settings
        lo, hi = cfg.port_range
        waiting = job_store.queued_for_planning(s)
        if not waiting:
            return []
        candidates = [job for job, _ in waiting]
        active = job_store.running_for_supervision(s, ACTIVE)
        held = lease_store.by_job(lease_store.live(s))
        running = [
            planner.RunningJob(
                j.id, tuple(held.get(j.id, ([], None))[0]), j.started_at or now, j.time_limit_s
            )
            for j in active
        ]
        leased_ports = {port for _, port in held.values() if port is not None}
        ports_held: dict[str, int] = {}
        for j in active:
            if held.get(j.id, ([], None))[1] is not None:
                ports_held[j.owner] = ports_held.get(j.owner, 0) + 1
        budget = planner.PortBudget(cfg.ports_per_user, ports_held)
        if self._state.last_port is None:
            self._state.last_port = lease_store.last_port(s)
        usage = self._usage(s, now)
        usable = self.usable_gpus()
        placements: list[planner.Placement] = []
        for _ in range(8):  # re-plan when a chosen port turns out to be taken
            free_ports = [
                p
                for p in rotation(lo, hi, self._state.last_port)
                if p not in leased_ports and self._state.port_cooldown.get(p, 0.0) <= now
            ]
            placements = planner.plan(candidates, usable, running, free_ports, usage, now, budget)
            busy = [p.port for p in placements if p.port is not None and not port_is_free(p.port)]
            if not busy:
                break
            for port in busy:
                log.info("port %s is in use by another program; skipping it", port)
                self._state.port_cooldown[port] = now + PORT_COOLDOWN_S
        reasons = planner.explain_waits(
            candidates, usable, placements, free_ports, usage, now, budget
        )
        job_store.set_waiting_reasons(s, reasons, {job.id: why for job, why in waiting})
        launches = []
        owners = {c.id: c.owner for c in candidates}
        mapped = user_store.unix_accounts(s, {owners[p.job_id] for p in placements})
        for p in placements:
            job = job_store.get_job(s, p.job_id)
            lease_store.acquire(s, job.id, p.gpus, p.port, now)
            job_store.start_attempt(s, job, p.gpus, p.port, now)
            job.job_dir = str(cfg.jobs_dir / str(job.id))
            job.not_before = None
            job.sched_latency_s = max(0.0, now - max(self._woke_at, job.submitted_at))
            job_store.set_state(s, job, JobState.STARTING, f"leased {lease_text(p)}", now)
            if p.port is not None:
                self._state.last_port = p.port
            launches.append(self._launch_of(job, p, mapped.get(job.owner)))
        return launches

    def _usage(self, s: Session, now: float) -> dict[str, float]:
        """Recent GPU-seconds per owner, recomputed at most every few seconds.

        Fair share needs no millisecond precision, and the query reads a week of
        attempts, which under a stream of short jobs would dominate each pass.
        """
        cached_at, usage = self._usage_cache
        if now - cached_at >= USAGE_TTL_S:
            window = self.settings.usage_window_s
            usage = recent_usage(job_store.recent_runs(s, now - window), now, window)
            self._usage_cache = (now, usage)
        return usage

    def _launch_of(self, job: Job, p: planner.Placement, unix_user: str | None) -> Launch:
        spec = LaunchSpec(
            job_id=job.id,
            job_dir=self.settings.jobs_dir / str(job.id),
            command=list(job.command),
            launcher=job.launcher,
            gpus=p.gpus,
            port=p.port,
            nproc=max(1, job.gpus),
            cwd=job.cwd,
            env=dict(job.env or {}),
            attempt=job.attempt,
        )
        return Launch(job.id, spec, job.owner, unix_user)

    def _spawn(self, launch: Launch) -> subprocess.Popen[bytes]:
        spec = launch.spec
        # Only a token says who the owner really is; without --auth jobs run as the daemon.
        account = account_for(launch.owner, launch.unix_user) if self.settings.auth else None
        # Switching to the account we already are is a no-op, and asking Popen for it
        # would stop it from using vfork: a full fork of the daemon per job.
        switch = account is not None and account.uid != os.geteuid()
        spec.job_dir.mkdir(parents=True, exist_ok=True)
        spec.job_dir.chmod(0o700)  # its owner's (and the daemon's) alone
        (spec.job_dir / EXIT_RECORD).unlink(missing_ok=True)
        if account is not None:
            os.chown(spec.job_dir, account.uid, account.gid)
        omp = threads_per_rank(self._cpu, max(1, len(self._devices)))
        env = job_env(spec, os.environ, omp)
        if account is not None:
            env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        argv = job_argv(spec, self.settings.python)
        header = f"{HEADER}{time.strftime('%Y-%m-%d %H:%M:%S')}: {lease_text(spec)}\n"
        owner = (account.uid, account.gid) if account is not None and switch else None
        with open_job_file(spec.job_dir / "output.log", owner) as out:
            out.write(header.encode())
        cgroup = self._new_cgroup(spec)
        # The shim waits on this pipe before it starts the job, so the job is in its
        # cgroup (and fenced to its GPUs) before it can fork anything.
        gate_r, gate_w = os.pipe()
        try:
            with open_job_file(spec.job_dir / "shim.err", owner) as err:
                child = subprocess.Popen(
                    gated(
                        shim_argv(
                            self.settings.python,
                            spec.job_dir,
                            spec.cwd,
                            self.settings.grace_s,
                            self.settings.log_cap_bytes,
                            argv,
                        ),
                        gate_r,
                        cgroup,
                    ),
                    # No cwd here: the shim enters it once it runs as the job's account.
                    cwd="/",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(gate_r,),
                    umask=JOB_UMASK,
                    user=account.uid if account and switch else None,
                    group=account.gid if account and switch else None,
                    extra_groups=[] if account and switch else None,
                )
        except BaseException:
            os.close(gate_w)
            if cgroup is not None:
                cgroups.remove(cgroup)
            raise
        finally:
            os.close(gate_r)
        self._admit(child, spec, cgroup, gate_w)
        return child

    def _new_cgroup(self, spec: LaunchSpec) -> Path | None:
        tree = self._tracking.tree
        if tree is None:
            return None
        path = cgroups.job_cgroup(tree, spec.job_dir.name, spec.attempt)
        try:
            cgroups.create(path)
        except OSError as exc:
            self._warn_once("cgroup", "cannot create job cgroups (%s): tracking by session", exc)
            return None
        return path

    def _admit(
        self, child: subprocess.Popen[bytes], spec: LaunchSpec, cgroup: Path | None, gate: int
    ) -> None:
        """Move the shim into the job's cgroup, fence its GPUs, then let it start the job."""
        word = b"s"
        try:
            if cgroup is not None:
                try:
                    cgroups.add(cgroup, child.pid)
                    word = b"c"
                except OSError as exc:
                    if exc.errno != errno.ESRCH:  # not "the shim has exited already"
                        self._warn_once("cgroup-add", "cannot move a shim into %s: %s", cgroup, exc)
                    cgroups.remove(cgroup)
            if cgroup is not None and word == b"c" and self._tracking.fence_error is None:
                try:
                    gpu_fence.attach(cgroup, spec.gpus)
                    # Real GPUs: CUDA now sees only the leased ones, numbered from 0; the
                    # shim renumbers CUDA_VISIBLE_DEVICES to match.
                    word = b"c" if self.settings.fake_gpus is not None else b"f"
                except gpu_fence.FenceUnavailable as exc:
                    self._warn_once("fence", "jobs run without a GPU fence: %s", exc)
            with contextlib.suppress(OSError):  # the shim is gone already: gathered as lost
                os.write(gate, word)
        finally:
            os.close(gate)

    def _mark_running(self, job_id: int, ident: procs.Identity, job_dir: Path) -> None:
        with self.db.write() as s:
            job = job_store.get_job(s, job_id)
            job.shim_pid, job.shim_start_ticks = ident.pid, ident.start_ticks
            if JobState(job.state) is JobState.STARTING:
                job_store.set_state(s, job, JobState.RUNNING, "started (adopted)", time.time())

    # ---- progress ----------------------------------------------------------------

    def _update_progress(self) -> None:
        if time.monotonic() - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = time.monotonic()
        fresh: dict[int, dict[str, Any]] = {}
        for job_id, w in self._state.watched.items():
            try:
                progress = read_progress(w.job_dir)
            except OSError:  # its folder is unreadable: that job shows no progress
                continue
            if progress is not None:
                fresh[job_id] = progress
        if not fresh:
            return
        with self.db.write() as s:
            for job_id, progress in fresh.items():
                job = job_store.get_job(s, job_id)
                if job.progress != progress:
                    job_store.set_progress(s, job, progress)


HEADER = "[ddpq] attempt started "
_HEADER_PORT = re.compile(r"port (\d+)$")


def rendezvous_port_clash(log_tail: str) -> bool:
    """Did this attempt fail because its leased port was taken (EADDRINUSE)?

    Only the output of the latest attempt counts (after its "[ddpq] attempt started
    ... port N" line), and only a line that names that port: an unrelated "address
    already in use" (a TensorBoard, say) is a plain failure, not a reason to requeue.
    """
    start = log_tail.rfind(HEADER)
    if start < 0:
        return False
    header, _, output = log_tail[start:].partition("\n")
    match = _HEADER_PORT.search(header.strip())
    if match is None:
        return False
    port = match.group(1)
    return any(
        port in line and any(m in line.lower() for m in PORT_CLASH) for line in output.splitlines()
    )


def lease_text(lease: planner.Placement | LaunchSpec) -> str:
    """'GPUs [0, 1], port 29601': the log header's words, which ``rendezvous_port_clash``
    reads back. A job without a port has no port clash to detect."""
    text = f"GPUs {list(lease.gpus)}"
    return text if lease.port is None else f"{text}, port {lease.port}"


def open_job_file(path: Path, owner: tuple[int, int] | None) -> BinaryIO:
    """Open a file of the job's folder for appending, handed to the job's account.

    The job owns its folder and may have put a link where its log was: O_NOFOLLOW and
    fchown on the opened file keep a root worker from writing to or giving away whatever
    such a link points at.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        if owner is not None:
            os.fchown(fd, *owner)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def gated(shim: list[str], gate: int, cgroup: Path | None) -> list[str]:
    """The shim's command line plus the handshake: wait on ``gate`` before starting the
    job; ``cgroup`` is where the worker puts it (when it says so on the pipe)."""
    at = shim.index("--job-dir")
    extra = ["--wait-fd", str(gate)] + (["--cgroup", str(cgroup)] if cgroup is not None else [])
    return shim[:at] + extra + shim[at:]


def end_unlaunched(s: Session, job: Job, state: JobState, reason: str, now: float) -> None:
    """End an attempt whose shim never ran: free its leases; requeue or finish the job."""
    job_store.end_attempt(
        s, job, exit_code=None, exit_signal=None, state=state, reason=reason, now=now
    )
    lease_store.release(s, job.id, now)
    if state is JobState.QUEUED:
        job_store.set_state(s, job, state, reason, now)
    else:
        job_store.finish(s, job, state, reason, now)


def launch_error(exc: BaseException) -> str:
    if isinstance(exc, NoAccount):
        return str(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot start the job: {exc.filename} does not exist"
    if isinstance(exc, PermissionError):
        return f"cannot start the job: permission denied ({exc.filename or exc})"
    if isinstance(exc, OSError) and exc.errno == 28:
        return "cannot start the job: no space left on device"
    return f"cannot start the job: {exc}"


def read_exit_record(job_dir: Path, attempt: int) -> ExitRecord | None:
    """The shim's record of how ``attempt`` ended; None if there is none (yet).

    The job can write its own folder, so the record is checked like any input: a
    record of the wrong shape counts as none (the job is then lost), never as a crash
    of the worker.
    """
    raw = read_regular(job_dir / EXIT_RECORD, 64 * 1024).decode(errors="replace")
    if not raw or nesting_depth(raw) > 2:  # the shim writes one flat object
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or str(data.get("attempt")) != str(attempt):
        return None  # missing, malformed, or left over from an earlier attempt
    code, sig, error = data.get("exit_code"), data.get("signal"), data.get("error")
    started, ended = data.get("started_at"), data.get("ended_at")
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (code, sig)):
        return None
    times = [v for v in (started, ended) if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(times) != 2 or (error is not None and not isinstance(error, str)):
        return None
    if not all(math.isfinite(t) for t in times) or not all(
        v is None or abs(v) < 2**31 for v in (code, sig)
    ):
        return None
    return ExitRecord(
        code, sig, float(times[0]), float(times[1]), clean_text(error, 500) if error else None
    )


def read_regular(path: Path, size: int, tail: bool = False) -> bytes:
    """Up to ``size`` bytes of ``path`` (its end with ``tail``), only if it is a regular file.

    O_NOFOLLOW and the file-type check: a job that swaps a file of its folder for a link
    must not get a root daemon to read something else.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        if tail:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
        return f.read(size)


def read_tail(path: Path, size: int) -> str:
    return read_regular(path, size, tail=True).decode(errors="replace")


def read_progress(job_dir: Path) -> dict[str, Any] | None:
    """The newest well-formed record of the job's metrics.jsonl, cleaned; None if none.

    Only the file's last 16 KiB are read, and each line goes through
    ``core.untrusted.parse_progress``: a job writes this file, so a hostile line is
    skipped, never raised.
    """
    for line in reversed(read_tail(job_dir / "metrics.jsonl", 16 * 1024).splitlines()):
        record = parse_progress(line)
        if record is not None:
            return record
    return None
