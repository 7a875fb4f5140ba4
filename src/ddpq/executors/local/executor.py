"""The local executor: each attempt a shim on this host, tracked by cgroup or session.

Its handle for an attempt is the shim's identity, ``"PID:START_TICKS"`` (field 22 of
``/proc/PID/stat``): a reused PID is never taken for the job. The shim writes the exit
record once the job's processes are all gone; this executor reads it (validated, through
``ddpq.jobdir``) and, before it reports an attempt ended, makes sure nothing of the job is
left: its cgroup emptied with ``cgroup.kill`` and removed, or, tracking by session, its
session and any process carrying its ``DDPQ_JOB_DIR`` killed. Only then may its leases go.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.enforcement import Control
from ddpq.core.rules import ExitRecord
from ddpq.executors.base import KILL_SLACK_S, LOST, Ended, Launch, LaunchFailed, only_one
from ddpq.executors.contract import threads_per_rank
from ddpq.executors.local import cgroups, gpu_fence, limits, procs, shim_procs
from ddpq.executors.local.spawn import Spawned, Spawner, abandon, let_run
from ddpq.jobdir import JobDir

log = logging.getLogger("ddpq.executor")

# The handle of an attempt that had ended before it could be adopted (no shim is left).
GONE = "gone"
STRAGGLER_TIMEOUT_S = 10.0
# How an attempt ends whose shim had not ended it when its stop was overdue: the shim runs
# as the job's account, so the job may stop it (SIGSTOP) or hang it, and would then outlive
# its time limit and every cancel or preemption, holding its GPUs.
OVERDUE = "killed by ddpq, its shim included: the shim had not ended the job after the stop"


@dataclass
class Watched:
    ident: procs.Identity
    folder: JobDir
    attempt: int
    fd: int | None  # a pidfd: readable once the shim has exited
    child: subprocess.Popen[bytes] | None = None  # ours to reap, if we started it
    kill_at: float | None = None  # stopped: when to end it by force if its shim has not
    patient: bool = False  # its shim was at work at kill_at: given its own time to finish
    killed: bool = False  # it was (its end says so)


def handle_of(ident: procs.Identity) -> str:
    return f"{ident.pid}:{ident.start_ticks}"


def identity_of(handle: str) -> procs.Identity | None:
    pid, sep, ticks = handle.partition(":")
    if not sep or not pid.isdigit() or not ticks.isdigit():
        return None
    return procs.Identity(int(pid), int(ticks))


class LocalExecutor:
    name = "local"

    def __init__(self, settings: Settings, gpu_count: int) -> None:
        self.settings = settings
        self._watched: dict[int, Watched] = {}
        self._held: dict[int, Spawned] = {}  # started, waiting for proceed()
        self._warned: set[str] = set()
        self.tracking = self._detect_tracking()
        try:
            self.limits = limits.detect(settings.home, self.tracking, settings.job_pids_max)
        except OSError as exc:  # as with tracking: said, and the daemon runs on
            why = f"cgroup setup failed: {exc}"
            self.limits = limits.Limits(missing=dict.fromkeys(limits.CONTROLLERS, why))
        for tree in self.limits.v1.values():
            atexit.register(cgroups.remove, tree)  # as the v2 tree: unless jobs run in it
        omp = threads_per_rank(os.cpu_count() or 1, gpu_count)
        self._spawner = Spawner(settings, self.tracking, omp, self._warn_once, self.limits)

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

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)

    def describe(self) -> str:
        return f"{self.tracking.describe()}; {self._spawner.describe()}"

    def controls(self) -> list[Control]:
        """What jobs' limits are enforced with here (``executors.base.Enforcing``)."""
        return self.limits.controls()

    # ---- start, adopt --------------------------------------------------------------

    def start(self, launch: Launch) -> str:
        """One launch alone (the tests' way): its handle, or LaunchFailed raised."""
        return only_one(self.start_many([launch]))

    def start_many(self, launches: Sequence[Launch]) -> list[str | LaunchFailed]:
        started: list[str | LaunchFailed] = []
        for launch, spawned in zip(launches, self._spawner.spawn_many(launches), strict=True):
            if isinstance(spawned, LaunchFailed):
                started.append(spawned)
                continue
            self._watch(launch.job_id, spawned.ident, JobDir(launch.job_dir), launch.attempt)
            self._watched[launch.job_id].child = spawned.child
            self._held[launch.job_id] = spawned
            started.append(handle_of(spawned.ident))
        return started

    def proceed(self, job_ids: Sequence[int]) -> None:
        for job_id in job_ids:
            held = self._held.pop(job_id, None)
            if held is not None:
                let_run(held)

    def abandon(self, job_ids: Sequence[int]) -> None:
        for job_id in job_ids:
            held = self._held.pop(job_id, None)
            if held is not None:
                abandon(held)

    def adopt(self, job_id: int, attempt: int, job_dir: Path, handle: str | None) -> str | None:
        folder = JobDir(job_dir)
        ident = identity_of(handle) if handle is not None and handle != GONE else None
        if ident is None:
            # The worker died between starting the shim and storing its identity (or the
            # handle is not one of ours): find the shim by its command line.
            found = procs.find_shim(str(job_dir))
            ident = procs.identity(found) if found else None
        if ident is None:
            if folder.read_exit_record(attempt) is None:
                return None  # it never ran
            # It ran and ended while we were down: reported by ended(), from its record.
            self._watch(job_id, procs.Identity(-1, -1), folder, attempt)
            return GONE
        self._watch(job_id, ident, folder, attempt)
        return handle_of(ident)

    def _watch(self, job_id: int, ident: procs.Identity, folder: JobDir, attempt: int) -> None:
        fd = procs.pidfd(ident.pid) if ident.pid > 0 else None
        # The pidfd pins this process; if it is not the one we mean, it exited already.
        self._watched[job_id] = Watched(ident, folder, attempt, fd)

    # ---- ended ---------------------------------------------------------------------

    def ended(self) -> list[Ended]:
        self._kill_overdue()
        gone = []
        for job_id, w in self._watched.items():
            if w.child is not None:
                w.child.poll()  # reap our own child so it does not linger as a zombie
            if not procs.is_alive(w.ident):
                gone.append(job_id)
        if not gone:
            return []
        out = []
        occupied: set[int] | None = None
        for job_id in gone:
            w = self._watched.pop(job_id)
            if w.fd is not None:
                os.close(w.fd)
            try:
                record = w.folder.read_exit_record(w.attempt)
            except Exception:  # the job can write its record: a bug reading it loses that
                # job (its processes still end below), never this pass's other ends
                log.exception("job %s: its exit record could not be read", job_id)
                record = None
            cgroup = self._cgroup_of(job_id, w.attempt)
            # Looked up once: each is a few stats in every v1 tree, three uses below.
            v1 = limits.v1_cgroups(self.limits, job_id, w.attempt)
            # Before its cgroup goes: the kernel's count of OOM kills in it.
            oom_limit = limits.oom_limit(self.limits, v1, cgroup)
            peak = limits.peak_ram(self.limits, v1, cgroup)
            if cgroup is not None:
                ending = self._end_cgroup(cgroup, record)
            else:
                if occupied is None:  # one look at /proc for all of them
                    occupied = procs.occupied_sessions()
                ending = self._end_session(w, record, occupied)
            limits.remove(v1)
            if oom_limit is not None or peak is not None:
                ending = dataclasses.replace(ending, oom_limit_bytes=oom_limit, peak_ram_bytes=peak)
            if w.killed and ending.error == LOST:
                ending = dataclasses.replace(ending, error=OVERDUE)
            out.append(Ended(job_id, w.attempt, ending))
        return out

    def _kill_overdue(self) -> None:
        """SIGKILL the shims of attempts whose stop is overdue (even a stopped process
        dies of it); each is then gathered as a shim that left no record, and nothing of
        its job outlives that (its cgroup, or its session and marker).

        At the first deadline only a shim that is stopped (or stopped by a tracer) is
        killed: one at work may be waiting for the job's last processes to go (a GPU's
        teardown), and is given the time it allows itself for that, twice, before it is
        taken for hung."""
        now = time.monotonic()
        for job_id, w in self._watched.items():
            if w.kill_at is None or now < w.kill_at:
                continue
            seen = procs.live_stat(w.ident)  # one look: still this shim, and is it stopped
            if seen is None:
                w.kill_at = None
                continue  # ended meanwhile: gathered below
            if not w.patient and seen.state not in ("T", "t"):
                w.patient = True
                w.kill_at = now + 2 * shim_procs.KILL_WAIT_S + KILL_SLACK_S
                continue
            w.kill_at = None
            if w.fd is not None:
                try:
                    signal.pidfd_send_signal(w.fd, signal.SIGKILL)  # never a reused pid
                except ProcessLookupError:
                    continue
            elif not procs.send(w.ident.pid, signal.SIGKILL):  # no pidfds: checked just above
                continue
            w.killed = True
            log.warning("job %s: its shim had not ended it after the stop: killed", job_id)

    def _end_session(self, w: Watched, record: ExitRecord | None, occupied: set[int]) -> ExitRecord:
        """Tracked by session: the record once nothing of the job is left (a "lost" one if
        the shim wrote none, or the record cannot be the shim's)."""
        # Find what is left by session and environment.
        marker = f"DDPQ_JOB_DIR={w.folder.path}".encode()

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
        deadline = time.monotonic() + STRAGGLER_TIMEOUT_S
        while left and time.monotonic() < deadline:
            procs.kill_all(left)
            time.sleep(0.01)
            left = stragglers()
        now = time.time()
        return ExitRecord(None, None, now, now, error=LOST)

    def _cgroup_of(self, job_id: int, attempt: int) -> Path | None:
        """The attempt's cgroup, if it has one: named from the job's id and attempt, in
        this run's tree or (re-adopted) an earlier run's."""
        for tree in self.tracking.trees:
            path = cgroups.job_cgroup(tree, job_id, attempt)
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
        if not cgroups.destroy(cgroup, timeout=STRAGGLER_TIMEOUT_S):
            log.warning("%s: processes left that even cgroup.kill did not end", cgroup)
        if record is not None:
            return record
        now = time.time()
        return ExitRecord(None, None, now, now, error=LOST)

    # ---- stop, processes, descriptors -----------------------------------------------

    def stop(self, job_id: int, preempt: bool = False) -> bool:
        w = self._watched.get(job_id)
        if w is None or not procs.is_alive(w.ident):
            return False
        # The shim forwards SIGTERM to the job's group and SIGKILLs it after the grace; on
        # SIGUSR1 it sends the job its preemption signal first and waits its checkpoint grace.
        if not procs.send(w.ident.pid, signal.SIGUSR1 if preempt else signal.SIGTERM):
            return False
        # Past those, and a little more, the shim is killed with its job (_kill_overdue).
        checkpoint = self.settings.preempt_grace_s if preempt else 0.0
        due = time.monotonic() + checkpoint + self.settings.grace_s + KILL_SLACK_S
        if w.kill_at is None or (not w.patient and due < w.kill_at):
            w.kill_at = due  # a cancel during a preemption: the sooner; a shim given time keeps it
        return True

    def tell(self, job_id: int, message: str) -> bool:
        """A line into a session's terminal: left in its folder, then its shim is told with
        SIGUSR2 (only a session's shim is: a batch shim of an older release would die of it)."""
        w = self._watched.get(job_id)
        if w is None or not procs.is_alive(w.ident):
            return False
        try:
            w.folder.write_notice(message)
        except OSError as exc:
            log.warning("job %s: cannot leave its terminal a notice: %s", job_id, exc)
            return False
        return procs.send(w.ident.pid, signal.SIGUSR2)

    def waiting(self) -> dict[int, str]:
        return {}  # a shim runs its job at once

    def job_pids(self) -> set[int]:
        return {pid for pids in self.pids_by_job().values() for pid in pids}

    def pids_by_job(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for job_id, w in self._watched.items():
            cgroup = self._cgroup_of(job_id, w.attempt)
            if cgroup is not None:
                out[job_id] = set(cgroups.members(cgroup))
            else:
                out[job_id] = set(procs.session_members(w.ident))
        return out

    def wait_fds(self) -> list[int]:
        return [w.fd for w in self._watched.values() if w.fd is not None]

    def close(self) -> None:
        self.abandon(list(self._held))
        self._spawner.close()
        for w in self._watched.values():
            if w.fd is not None:
                os.close(w.fd)
                w.fd = None
