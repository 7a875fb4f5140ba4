"""The Slurm executor: each attempt a Slurm batch job, tracked by its Slurm job id.

``start`` renders the attempt's batch script into its folder and submits it held
(``sbatch --hold``); ``proceed`` releases it (``scontrol release``) once the worker has
stored the job id, ``abandon`` cancels it: Slurm runs nothing the worker could not find
again. The handle is the Slurm job id; ``adopt`` watches it again after a restart.

``ended`` asks ``squeue`` once per pass about every watched job (and ``sacct`` once about
those squeue no longer knows). A job in a final state has ended with all its processes
gone (Slurm's COMPLETING is not final), so its leases may go. How it ended is the shim's
exit record in the job's folder (the shim runs inside the allocation: see ``script``);
only where the shim wrote none does Slurm's state say it (``states.record_from_slurm``),
and a job neither squeue nor sacct knows, with no record, is lost.

``stop`` sends SIGTERM to the batch step (the shim passes it to the job and kills it after
the grace period, as locally), and cancels the job through Slurm if it is still there a
little after that. A job Slurm has not started yet is cancelled at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.rules import ExitRecord
from ddpq.core.untrusted import clean_text
from ddpq.executors.base import KILL_SLACK_S, Ended, Launch, LaunchFailed, one_by_one
from ddpq.executors.slurm import script, states
from ddpq.executors.slurm.commands import Slurm, SlurmError
from ddpq.executors.slurm.states import SlurmJob
from ddpq.executors.slurm.submit import prepare
from ddpq.jobdir import JobDir, append_if_own, read_regular

log = logging.getLogger("ddpq.executor")

# At most one squeue per this, however often the worker passes (a submission wakes it).
POLL_S = 0.4
# A record the shim wrote on a node may take this long to show here on a shared
# filesystem (NFS caches attributes, and the absence of a file, for seconds): waited for
# when Slurm says the job completed, which means its shim did write one.
RECORD_WAIT_S = 30.0
# Otherwise (cancelled, failed, timed out) the shim may still be writing its record as
# Slurm calls the job ended (a job cancelled as its batch step starts): waited for briefly.
RECORD_GRACE_S = 3.0
ABANDONED = "abandoned before it was released in Slurm"


@dataclass
class Watched:
    slurm_id: str
    attempt: int
    folder: JobDir
    held: bool  # submitted with --hold, not released by us yet
    job: SlurmJob | None = None  # squeue's latest view, while Slurm has not ended it
    abandoned: bool = False
    record_due: float | None = None  # Slurm says it ended; its record is awaited until
    kill_at: float | None = None  # stopped: cancel it through Slurm if still there then
    told: str = ""  # the latest line about it written into the job's log
    waits_for: str = ""  # the latest reason Slurm gave for keeping it waiting


class SlurmExecutor:
    name = "slurm"

    def __init__(
        self,
        settings: Settings,
        slurm: Slurm,
        gpus: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.slurm = slurm
        self.gpus = gpus
        self.clock = clock
        self.tag = script.daemon_tag(settings.home)
        self._watched: dict[int, Watched] = {}
        self._polled_at = float("-inf")
        self._failing: str | None = None  # the squeue failure last logged

    def describe(self) -> str:
        where = self.settings.slurm_partition or "Slurm's default partition"
        who = "each job's owner" if self.settings.auth else "this daemon's account"
        return (
            f"jobs go to Slurm (sbatch to {where}, as {who}), at most {self.gpus} GPU(s) "
            f"there at once; job folders ({self.settings.jobs_dir}) must be shared with the nodes"
        )

    # ---- start, proceed, abandon, adopt ----------------------------------------------

    def start(self, launch: Launch) -> str:
        submission = prepare(launch, self.settings)
        try:
            slurm_id = self.slurm.submit_held(submission.script, submission.env, submission.account)
        except SlurmError as exc:
            # sbatch may have queued it before it failed to answer: nothing may be left.
            self._cancel_unrecorded(launch.job_id, launch.attempt)
            raise LaunchFailed(f"Slurm did not take the job: {exc}") from None
        # sbatch runs as the job's account with the job's environment (a preloaded
        # library of its own included), so the id it answers is the job's word: root
        # releases and cancels it, and must never act on someone else's job. It must be
        # a job with this attempt's name and comment, as squeue says.
        try:
            ours = self._marked(launch.job_id, launch.attempt)
        except SlurmError as exc:  # the controller too busy to say: nothing of it ran
            self._cancel_unrecorded(launch.job_id, launch.attempt)
            raise LaunchFailed(f"Slurm did not take the job: {exc}", interrupted=True) from None
        if slurm_id not in ours:
            self._cancel(ours)  # the attempt's own, held: never run
            raise LaunchFailed(
                f"Slurm did not take the job: sbatch answered Slurm job {slurm_id}, "
                "which is not the job it was given"
            )
        folder = JobDir(launch.job_dir)
        self._watched[launch.job_id] = Watched(slurm_id, launch.attempt, folder, held=True)
        return slurm_id

    def _marked(self, job_id: int, attempt: int) -> list[str]:
        """The Slurm jobs with this attempt's name and comment, as squeue says."""
        return self.slurm.find(script.job_name(job_id), script.comment(self.tag, job_id, attempt))

    def start_many(self, launches: Sequence[Launch]) -> list[str | LaunchFailed]:
        return one_by_one(self.start, launches)

    def proceed(self, job_ids: Sequence[int]) -> None:
        held = [w for i in job_ids if (w := self._watched.get(i)) is not None and w.held]
        for w in held:
            w.held = False
        # One that could not be released now is released when squeue shows it still held.
        self._release([w.slurm_id for w in held])

    def abandon(self, job_ids: Sequence[int]) -> None:
        gone = [w for i in job_ids if (w := self._watched.get(i)) is not None and w.held]
        for w in gone:
            w.abandoned = True
        self._cancel([w.slurm_id for w in gone])

    def adopt(self, job_id: int, attempt: int, job_dir: Path, handle: str | None) -> str | None:
        if handle is None or not handle.isdigit():
            # The worker died between sbatch and storing the job id: the job was never
            # released, so nothing ran. Cancel it; the worker requeues the job.
            self._cancel_unrecorded(job_id, attempt)
            return None
        # If it is still held (the worker died before releasing it), the next look at the
        # queue releases it: its id is stored now.
        folder = JobDir(job_dir)
        w = Watched(handle, attempt, folder, held=False, told=self._last_told(folder, handle))
        self._watched[job_id] = w
        return handle

    def _last_told(self, folder: JobDir, handle: str) -> str:
        """The latest line about Slurm job ``handle`` in the log: not written twice."""
        try:
            tail = folder.log_tail()
        except OSError:
            return ""
        mine = f"[ddpq] Slurm job {handle} "
        told = [line for line in tail.splitlines() if line.startswith(mine)]
        return told[-1] if told else ""

    def _cancel_unrecorded(self, job_id: int, attempt: int) -> None:
        try:
            found = self._marked(job_id, attempt)
        except SlurmError as exc:
            log.warning("job %s: cannot look for its Slurm job (%s)", job_id, exc)
            return
        self._cancel(found)

    # ---- ended ---------------------------------------------------------------------

    def ended(self) -> list[Ended]:
        out = self._take_abandoned()
        now = self.clock()
        if not self._watched or now - self._polled_at < POLL_S:
            return out
        self._polled_at = now
        try:
            seen = self.slurm.queue([w.slurm_id for w in self._watched.values()])
        except SlurmError as exc:
            # No news is not an end: nothing is lost because the controller is slow.
            if self._failing != str(exc):
                self._failing = str(exc)
                log.warning("cannot ask Slurm about ddpq's jobs (%s); asking again", exc)
            return out
        if self._failing is not None:
            self._failing = None
            log.info("Slurm answers again")
        unknown: list[int] = []
        release: list[str] = []
        kill: list[str] = []
        for job_id, w in list(self._watched.items()):
            job = seen.get(w.slurm_id)
            if job is not None and not job.final:
                w.job = job
                self._tell(w, job)
                if job.waiting and job.reason == states.HELD and not w.held:
                    release.append(w.slurm_id)
                if w.kill_at is not None and now >= w.kill_at:
                    w.kill_at = None
                    kill.append(w.slurm_id)
                continue
            record = self._record(w)
            if record is None and job is None:
                unknown.append(job_id)
                continue
            if record is None and job is not None:
                if not self._waited_for_record(w, job, now):
                    continue
                record = self._from_slurm(w, job)
            assert record is not None
            del self._watched[job_id]
            out.append(Ended(job_id, w.attempt, record))
        out += self._vanished(unknown)
        self._release(release)
        self._cancel(kill)
        return out

    def _take_abandoned(self) -> list[Ended]:
        out = []
        for job_id, w in list(self._watched.items()):
            if w.abandoned:
                del self._watched[job_id]
                at = time.time()
                record = ExitRecord(None, None, at, at, ABANDONED, launched=False)
                out.append(Ended(job_id, w.attempt, record))
        return out

    def _record(self, w: Watched) -> ExitRecord | None:
        try:
            return w.folder.read_exit_record(w.attempt)
        except OSError:
            return None

    def _waited_for_record(self, w: Watched, job: SlurmJob, now: float) -> bool:
        if w.record_due is None:
            w.record_due = now + (RECORD_WAIT_S if job.state == "COMPLETED" else RECORD_GRACE_S)
        return now >= w.record_due

    def _from_slurm(self, w: Watched, job: SlurmJob | None) -> ExitRecord:
        """The end of an attempt whose shim left no record, in Slurm's words, with the last
        line Slurm wrote for it (a node without ddpq's Python says so there)."""
        record = states.record_from_slurm(w.slurm_id, job, time.time())
        tail = read_regular(w.folder.slurm_output, 2048, tail=True).decode(errors="replace")
        lines = [line for line in tail.splitlines() if line.strip()]
        if lines and record.error is not None:
            last = clean_text(lines[-1].strip(), 300)
            return ExitRecord(
                record.exit_code,
                record.signal,
                record.started_at,
                record.ended_at,
                clean_text(f"{record.error}; Slurm's output ends: {last}", 1000),
            )
        return record

    def _vanished(self, job_ids: list[int]) -> list[Ended]:
        """Jobs squeue no longer knows and that left no record: sacct's word, or lost."""
        if not job_ids:
            return []
        try:
            known = self.slurm.accounting([self._watched[i].slurm_id for i in job_ids])
        except SlurmError as exc:
            log.warning("cannot ask sacct about %d job(s) (%s); asking again", len(job_ids), exc)
            return []
        out = []
        for job_id in job_ids:
            w = self._watched[job_id]
            job = known.get(w.slurm_id) if known is not None else None
            if job is not None and not job.final:
                continue  # sacct still has it running: squeue will catch up
            del self._watched[job_id]
            out.append(Ended(job_id, w.attempt, self._from_slurm(w, job)))
        return out

    def _tell(self, w: Watched, job: SlurmJob) -> None:
        """A line in the job's log when Slurm's word on it changes: why it waits, then where
        it runs, so ``ddpq logs -f`` says what Slurm does with it."""
        if states.waiting_reason(job) is not None:
            line = f"[ddpq] Slurm job {w.slurm_id} is waiting: {job.reason}"
        elif job.state == "RUNNING":
            line = f"[ddpq] Slurm job {w.slurm_id} is running on {job.nodes}"
        else:
            return
        if line == w.told:
            return
        w.told = line
        # Only into the log as the account left it: a running job's log is never replaced,
        # nor written through a link; the folder is the job's: a line it kept out is its loss.
        with contextlib.suppress(OSError):
            append_if_own(w.folder.log, w.folder.path.stat().st_uid, f"{line}\n".encode())

    def waiting(self) -> dict[int, str]:
        """Why each job Slurm has not started waits there, in Slurm's words: for the job's
        reason (``waiting in Slurm: Resources``)."""
        reasons = {}
        for job_id, w in self._watched.items():
            if w.job is not None and not w.job.waiting:
                continue  # it runs (or ended): its wait is over
            # A look that gave no reason (squeue's moment between two of its passes, or a
            # look that missed the job) is not a start: the last reason stands.
            why = states.waiting_reason(w.job) if w.job is not None else None
            w.waits_for = why or w.waits_for
            if w.waits_for:
                reasons[job_id] = w.waits_for
        return reasons

    def tell(self, job_id: int, message: str) -> bool:
        """No sessions run on Slurm (the API refuses them): no terminal to write into."""
        return False

    # ---- stop, processes, descriptors -----------------------------------------------

    def stop(self, job_id: int, preempt: bool = False) -> bool:
        # A preemption is a stop here (SIGTERM to the batch step, the stop's grace, then
        # scancel): the shim's checkpoint protocol would need the signal carried through
        # srun to ranks on other nodes. The job is still requeued as preempted, not ended;
        # docs/slurm.md says so.
        del preempt
        w = self._watched.get(job_id)
        if w is None or w.abandoned:
            return False
        # Only a running job has a batch step to signal: Slurm answers a signal to a
        # waiting one with "try again later", and scancel retries that for a minute. The
        # last look may be a pass old, and the job started since: look again.
        if not w.held and (w.job is None or w.job.state != "RUNNING"):
            with contextlib.suppress(SlurmError):  # then the last look it is
                w.job = self.slurm.queue([w.slurm_id]).get(w.slurm_id, w.job)
        if w.job is not None and w.job.state == "RUNNING":
            try:
                # To the batch step, where the shim forwards it and kills after the grace.
                self.slurm.cancel([w.slurm_id], signal="TERM")
                w.kill_at = self.clock() + self.settings.grace_s + KILL_SLACK_S
                return True
            except SlurmError:
                pass  # it has ended meanwhile: the cancel below changes nothing
        # Not started (or only just: then Slurm's KillWait is its grace period).
        self._cancel([w.slurm_id])
        return True

    def job_pids(self) -> set[int]:
        return set()  # they run on Slurm's nodes, not here

    def pids_by_job(self) -> dict[int, set[int]]:
        return {}  # nothing of theirs to measure here (and no job on Slurm shares a GPU)

    def wait_fds(self) -> list[int]:
        return []  # Slurm is asked every pass (POLL_S)

    def close(self) -> None:
        self.abandon([i for i, w in self._watched.items() if w.held])

    # ---- Slurm calls whose failure the next pass mends ------------------------------

    def _release(self, slurm_ids: list[str]) -> None:
        if slurm_ids:
            try:
                self.slurm.release(slurm_ids)
            except SlurmError as exc:
                log.warning("cannot release Slurm job(s) %s (%s)", ",".join(slurm_ids), exc)

    def _cancel(self, slurm_ids: list[str]) -> None:
        if slurm_ids:
            try:
                self.slurm.cancel(slurm_ids)
            except SlurmError as exc:
                log.warning("cannot cancel Slurm job(s) %s (%s)", ",".join(slurm_ids), exc)
