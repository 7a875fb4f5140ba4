"""The agent loop on the GPU host: reconcile, then passes of gather, stop, schedule, watch.

One thread, woken by a datagram on the wake socket (submit, cancel), by the executor
(a job's shim exiting: a pidfd), or by a timer (time limits, back-offs, progress). The
worker decides; decisions come from ``ddpq.core``, every row it changes is written by
``ddpq.store``, and the executor (``ddpq.executors``) runs the jobs and says when they
have ended. The worker itself starts no process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpq import wake
from ddpq.config import Settings
from ddpq.core.disposition import INTERRUPTED
from ddpq.core.gpus import Gpu
from ddpq.core.rules import StopRequest
from ddpq.core.sharing import peaks
from ddpq.executors.base import Ended, Executor, Launch, LaunchFailed
from ddpq.executors.capabilities import capabilities
from ddpq.executors.local.freeze import pauser
from ddpq.jobdir import JobDir
from ddpq.store import attempts as attempt_store
from ddpq.store import unlaunched as unlaunched_store
from ddpq.store import users as user_store
from ddpq.store import waits as wait_store
from ddpq.store.db import Database, Session, storage_fault
from ddpq.store.headroom import Reserve
from ddpq.worker.devices import discover
from ddpq.worker.exits import record_exits
from ddpq.worker.gpu_use import GpuSampler
from ddpq.worker.host import host_setup
from ddpq.worker.idle import IdleWatch, Sampler
from ddpq.worker.inventory import Inventory
from ddpq.worker.scheduling import Scheduler
from ddpq.worker.stopping import Stopping
from ddpq.worker.unlaunched import Unlaunched

log = logging.getLogger("ddpq.worker")

PROGRESS_EVERY_S = 1.0
# A wake within this long of the last pass's end waits for the rest of it: under a stream
# of submissions and short jobs every wake took a pass of its own, each reading the queue
# and taking the write lock the next submission waits for, and two passes of one job (its
# start, its end) cost more CPU than the job. Waiting, the wakes of that time share a pass.
# A wake after a quiet spell, or with no job running (no end to gather: a lone submission
# on an idle host), is answered at once. bench/RESULTS.md: "Passes that wait".
PASS_GAP_S = 0.01
# --stop-jobs: how long past the grace period the worker waits for jobs to end.
STOP_ALL_SLACK_S = 30.0


class Worker:
    def __init__(
        self,
        settings: Settings,
        executor: Executor | None = None,
        *,
        devices: list[Gpu] | None = None,
        clock: Callable[[], float] = time.time,
        listen: bool = True,
        look: Callable[[], list[Gpu]] | None = None,
        gpu_use: Sampler | None = None,
    ) -> None:
        """``executor`` defaults to the local shim executor; ``clock`` is the time every
        decision is made at; ``listen`` opens the wake socket (off in in-process tests,
        which call ``step`` themselves); ``look`` looks at the GPUs again (default: NVML,
        unless ``fake_gpus``); ``gpu_use`` samples the GPUs' use (default: NVML's, none
        with fake GPUs)."""
        self.settings = settings
        self.clock = clock
        reserve = Reserve(
            settings.reserve_path, settings.state_reserve_bytes, pause_jobs=pauser(settings)
        )
        self.db = Database(settings.db_path, durable=False, reserve=reserve)
        # Its mode (0711: jobs pass through, nobody lists) is set by daemon.make_private.
        settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.inventory = Inventory(
            settings,
            devices
            if devices is not None
            else discover(settings.fake_gpus, settings.fake_topology),
            look,
        )
        if executor is None:
            from ddpq.executors.local import LocalExecutor

            executor = LocalExecutor(settings, gpu_count=len(self.inventory.devices))
        self.executor = executor
        # On Slurm a job's "GPUs" are slots of a budget, not this host's devices: NVML here
        # says nothing of them, so no job there is judged idle.
        here = capabilities(settings.executor).on_this_host
        self._sampler = (
            GpuSampler(settings.fake_gpus is not None) if gpu_use is None and here else None
        )
        self.idle = IdleWatch(settings, executor, gpu_use or self._sampler or (lambda _: None))
        gpu_count = len(self.inventory.devices)
        # A clock of its own (the tests' hand-moved one) measures the forecast's work too:
        # no decision of a pass then depends on how fast the machine ran the last one.
        timer = None if clock is time.time else clock
        host = host_setup(settings, gpu_count, here)
        self.scheduler = Scheduler(settings, host=host, timer=timer)
        self._sock = wake.listen(settings.wake_socket) if listen else None
        self._stop = threading.Event()
        # Set once the jobs of the last run are adopted or finalised (or that failed): until
        # then the store may still say "running" of a job that ended while we were down.
        self.reconciled = threading.Event()
        self._running: dict[int, JobDir] = {}  # the jobs the executor runs for us
        # Attempts the executor reported ended, kept until their recording has committed.
        self._exits: list[Ended] = []
        self._unlaunched = Unlaunched()  # launches that failed, until recorded
        self._progress: dict[int, dict[str, Any]] = {}  # as last written, per job
        self._peaks: dict[int, int] = {}  # each running attempt's peak, as last written
        self._progress_at = float("-inf")
        self._waits: dict[int, str] = {}  # started jobs waiting in a cluster, as written
        self._woke_at = clock()
        # A pass started a whole planning window of one shape: more may start at once.
        self._pass_again = False
        self._passed_at = float("-inf")  # when the last pass ended (time.monotonic)
        self._failing: dict[str, str] = {}  # phase -> the failure last logged for it
        self.stopping = Stopping(self.db, lambda: self.executor, clock)

    @property
    def devices(self) -> list[Gpu]:
        return list(self.inventory.devices)

    def running(self) -> list[int]:
        """The jobs this worker watches (started or adopted, not yet ended)."""
        return sorted(self._running)

    # ---- life cycle -------------------------------------------------------

    def run(self) -> None:
        try:
            self.reconcile()
        except Exception:
            log.exception("reconcile failed; serving on")
        finally:
            self.reconciled.set()
        while not self._stop.is_set():
            self.step()
            self._passed_at = time.monotonic()
            self._wait()
        if self.settings.stop_jobs_on_exit:
            self.stop_all_jobs()
        self.close()

    def stop(self) -> None:
        self._stop.set()
        wake.nudge(self.settings.wake_socket)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
        self.executor.close()
        if self._sock is not None:
            self._sock.close()
        self.db.dispose()

    def _wait(self) -> None:
        fds = [self._sock.fileno()] if self._sock is not None else []
        fds += self.executor.wait_fds()  # one per running job: no ceiling (wake.wait_readable)
        ready = wake.wait_readable(fds, 0.0 if self._pass_again else self.settings.poll_s)
        # Woken here: the gap below is part of the wait a job's start reports.
        self._woke_at = self.clock()
        if ready and self._running and not self._pass_again:
            left = self._passed_at + PASS_GAP_S - time.monotonic()
            if left > 0:
                self._stop.wait(left)  # what else comes meanwhile shares the pass
        if self._sock is not None:
            wake.drain(self._sock)  # non-blocking: the wakes before this pass, gap included

    def step(self) -> None:
        """One pass. Each phase runs even when another failed: a broken progress file or
        a failing stop must not keep the queue from being scheduled."""
        self._guarded("gathering exits", self._gather)
        # Before the stops: a session found idle through its grace is stopped this pass.
        self._guarded("watching idle GPUs", lambda: self.idle.look(self.db, self.clock()))
        self._guarded("enforcing stops", lambda: self.stopping.enforce(self._waits))
        self._guarded("refreshing devices", self._refresh_devices)
        # Also records the exits gathered above, in the same transaction.
        self._guarded("scheduling", self._schedule)
        self._guarded("reading progress", self._read_progress)
        self._guarded("reading waits", self._read_waits)

    def _guarded(self, phase: str, run: Callable[[], None]) -> None:
        """Run one phase; log a failure once per condition, not every pass.

        A full disk or a read-only database fails every pass (twice a second) until
        someone fixes it: the first failure is logged with its traceback, the same
        failure again is not, and the recovery is.
        """
        try:
            # Recording ends and sending stops must work on a full disk (store.headroom).
            self.db.making_room(run)
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
        with self.db.read() as s:
            active = attempt_store.active_attempts(s)
        for attempt in active:
            try:
                self._reconcile_one(attempt)
            except Exception:  # one odd job must not keep the others from being adopted
                log.exception("job %s: could not be reconciled", attempt.job_id)
        try:
            self.stopping.resend(self._running)
        except Exception:  # the adopted jobs are gathered and recorded all the same
            log.exception("could not send again the stops sent before the restart")
        self._gather()
        if self._exits:
            with self.db.write() as s:
                record_exits(s, self._exits, self.settings, self.clock())
            self._exits.clear()  # committed
        # Only now are the adopted jobs' processes known: none of them is "outside" use.
        self._refresh_devices(force=True)

    def _reconcile_one(self, a: attempt_store.ActiveAttempt) -> None:
        now = self.clock()
        if a.job_dir is None:
            with self.db.write() as s:
                unlaunched_store.requeue_unlaunched(s, a.job_id, INTERRUPTED, now)
            return
        name = self.executor.name
        if a.executor is not None and a.executor != name:
            log.warning(
                "job %s: was started by the %s executor, not %s", a.job_id, a.executor, name
            )
        mine = a.handle if a.executor == name else None
        handle = self.executor.adopt(a.job_id, a.attempt, Path(a.job_dir), mine)
        if handle is None:
            with self.db.write() as s:
                unlaunched_store.requeue_unlaunched(s, a.job_id, INTERRUPTED, now)
            return
        self._running[a.job_id] = JobDir(Path(a.job_dir))
        if a.handle != handle or a.executor != name:
            with self.db.write() as s:
                if not attempt_store.mark_running(
                    s, a.job_id, name, handle, "started (adopted)", now
                ):
                    attempt_store.set_handle(s, a.job_id, name, handle)
        log.info("job %s: re-adopted (%s, %s)", a.job_id, a.state.value, handle)

    # ---- the pass's phases ----------------------------------------------------

    def _gather(self) -> None:
        ended = self.executor.ended()
        for e in ended:
            self._running.pop(e.job_id, None)
            self._progress.pop(e.job_id, None)
            self._peaks.pop(e.job_id, None)
            self.stopping.forget(e.job_id)
        self._exits += ended

    def _refresh_devices(self, force: bool = False) -> None:
        """NVML again: which GPUs run outside processes, and how much memory each running
        job's processes hold (the peak of each attempt, per GPU, is kept)."""
        if not (force or self.inventory.due()):
            return
        by_job = self.executor.pids_by_job()
        ours = {pid for pids in by_job.values() for pid in pids}
        if self.inventory.look is not None and not self.inventory.refresh(by_job):
            return  # NVML failed (and said why): the last view stands
        risen = {
            job_id: peak
            for job_id, peak in peaks(self.inventory.measured.use).items()
            if job_id in self._running and peak > self._peaks.get(job_id, 0)
        }
        self.inventory.publish(self.db, ours, self.clock(), risen)
        self._peaks.update(risen)  # committed

    def _schedule(self) -> None:
        now = self.clock()
        with self.db.write() as s:
            record_exits(s, self._exits, self.settings, now)
            self._unlaunched.record(s, now)
            leased = self._lease(s, now)
            mapped = user_store.unix_accounts(s, {job.spec.owner for job in leased})
        self._exits.clear()  # committed
        self._unlaunched.committed()
        window = self.scheduler.window
        self._pass_again = window is not None and len(leased) >= window
        if not leased:
            return
        launches = [self._launch(job, mapped) for job in leased]
        started: list[tuple[int, str]] = []
        for launch, handle in zip(launches, self.executor.start_many(launches), strict=True):
            if isinstance(handle, LaunchFailed):
                self._unlaunched.add(launch.job_id, launch.attempt, handle)
                continue
            started.append((launch.job_id, handle))
            self._running[launch.job_id] = JobDir(launch.job_dir)
        now = self.clock()
        try:
            with self.db.write() as s:
                attempt_store.mark_running_many(s, started, self.executor.name, "started", now)
                self._unlaunched.record(s, now)
            self._unlaunched.committed()
        except BaseException:
            # Their handles are not stored, so nothing of them may run: each is reported
            # ended as never launched, and requeued once the database works again.
            self.executor.abandon([job_id for job_id, _ in started])
            raise
        self.executor.proceed([job_id for job_id, _ in started])

    def _lease(self, s: Session, now: float) -> list[attempt_store.Leased]:
        """What this pass starts: none for a while after a launch found the job folders'
        disk full (``Unlaunched.paused_until``)."""
        if now < self._unlaunched.paused_until:
            return []
        inv = self.inventory
        return self.scheduler.lease_next(
            s, inv.usable(), self._woke_at, now, inv.measured, inv.hardware
        )

    def _launch(self, job: attempt_store.Leased, mapped: dict[str, str]) -> Launch:
        """What the executor is given to start a leased job."""
        visible, device_gpus = self.inventory.naming(job.gpus)
        return Launch(
            job_id=job.job_id,
            attempt=job.attempt,
            job_dir=Path(job.job_dir),
            spec=job.spec,
            gpus=job.gpus,
            port=job.port,
            # The account the submission proved (the socket's caller) comes first.
            unix_account=job.spec.run_as or mapped.get(job.spec.owner),
            reserved_mem_bytes=job.reserved_mem_bytes,
            visible=visible,
            device_gpus=device_gpus,
            cores=job.cores,
            ram_bytes=job.ram_bytes,
        )

    def _read_progress(self) -> None:
        """The newest progress line of every running job, written when it changed."""
        now = self.clock()
        if now - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = now
        fresh: dict[int, dict[str, Any]] = {}
        for job_id, folder in self._running.items():
            try:
                progress = folder.read_progress()
            except OSError:  # its folder is unreadable: that job shows no progress
                continue
            if progress is not None and progress != self._progress.get(job_id):
                fresh[job_id] = progress
        if fresh:
            with self.db.write() as s:
                attempt_store.record_progress(s, fresh, now)
            self._progress.update(fresh)

    def _read_waits(self) -> None:
        """Jobs that wait where their executor runs them (Slurm's queue): their reason
        while they wait, and their start (which their time limit counts from) when they
        stop waiting. Written when it changes."""
        now = self.clock()
        waits = {i: why for i, why in self.executor.waiting().items() if i in self._running}
        changed = {i: why for i, why in waits.items() if self._waits.get(i) != why}
        began = [i for i in self._waits if i not in waits and i in self._running]
        if changed or began:
            with self.db.write() as s:
                wait_store.record_waits(s, changed, began, now)
        self._waits = waits

    def stop_all_jobs(self) -> None:
        """``--stop-jobs``: cancel every running job and wait (bounded) for them to end."""
        with self.db.write() as s:
            attempt_store.request_stop_all(s, StopRequest.CANCEL)
        deadline = time.monotonic() + self.settings.grace_s + STOP_ALL_SLACK_S
        while self._running and time.monotonic() < deadline:
            self.stopping.enforce(self._waits)
            self._gather()
            if self._exits:
                with self.db.write() as s:
                    record_exits(s, self._exits, self.settings, self.clock())
                self._exits.clear()
            time.sleep(0.05)
