"""The seam between the worker's decisions and where a job's processes run.

The worker decides: what starts, when a job must stop, what an ended attempt means.
An executor runs: it starts an attempt (held until the worker has stored its handle,
then let go), reports the attempts whose processes are all gone, stops one (a signal
now, a kill once its grace period is over), and finds its attempts again after the
worker restarts, from the handle it gave for each. The store keeps that handle per
attempt; the planner never knows which executor runs a job.

Executors never touch the database: what they know comes in as a ``Launch`` and goes
out as handles and ``Ended`` records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ddpq.core.enforcement import Control
from ddpq.core.rules import ExitRecord
from ddpq.core.spec import JobSpec


@dataclass(frozen=True)
class Launch:
    """One attempt to start: the job's spec (what it asked for: its command, folder,
    environment, owner, and what a cluster executor reads of it), plus what the worker
    leased it and who it runs as. Executors read the job's fields as ``launch.spec.<field>``.

    Of the spec, each executor uses what it supports (``executors.capabilities``): the
    local one runs every job on this host (no nodes, partition or #SBATCH options); a
    session's command (``spec.interactive``) runs on a terminal the executor relays to its
    owner (the local one: a pseudo-terminal and a Unix socket in the job's folder).
    """

    job_id: int
    attempt: int
    job_dir: Path
    spec: JobSpec
    gpus: tuple[int, ...]  # the GPUs leased (``spec.gpus`` of them)
    port: int | None
    unix_account: str | None  # the account it runs as: proven at submission, or mapped
    # Sharing its GPUs by memory: the bytes it reserved on each (None: they are its own).
    reserved_mem_bytes: int | None = None
    # The host's CPU cores leased to it (its cpuset); () where none are: not confined.
    cores: tuple[int, ...] = ()
    # The host memory it may use (its cgroup's limit), the job's own ask or the admin's
    # default; None: no limit.
    ram_bytes: int | None = None
    # What ``CUDA_VISIBLE_DEVICES`` names the leased GPUs by where an index will not do (a
    # MIG instance by its ``MIG-...`` UUID), and the physical GPUs whose device files the
    # job may open (a MIG instance's parent); () and None: the leased indexes themselves.
    visible: tuple[str, ...] = ()
    device_gpus: tuple[int, ...] | None = None

    @property
    def preempt_with(self) -> str | None:
        """The signal that tells a preemptible job to checkpoint (e.g. "USR1"); None: the
        job is not preemptible."""
        return self.spec.preempt_signal if self.spec.preemptible else None


class LaunchFailed(Exception):
    """The attempt could not be started; the message says why, for the job's reason.

    ``interrupted``: the executor itself lost the launch (the local one's fork server went
    away before it answered) and nothing of the job ran, so the worker queues it again
    (``core.disposition.after_interrupted_launch``: no retry used, a bounded number of
    times) instead of failing it.

    ``put_off``: the host had no room for it (the job folders' disk is full: ENOSPC; a full
    quota is the account's own, and fails it) and nothing of the job ran: it waits in the
    queue and tries again (``core.disposition.after_put_off_launch``), as long as it takes;
    meanwhile no job is launched (``worker.unlaunched``)."""

    def __init__(self, reason: str, interrupted: bool = False, put_off: bool = False) -> None:
        super().__init__(reason)
        self.interrupted = interrupted
        self.put_off = put_off


@dataclass(frozen=True)
class Ended:
    """An attempt none of whose processes is left; ``record`` says how it ended (for a job
    whose executor lost track of it: an error that starts with "lost")."""

    job_id: int
    attempt: int
    record: ExitRecord


LOST = "lost: the job's shim ended without an exit record"
# Past a stop's grace period (and a preemption's time to checkpoint) the shim has killed the
# job; an executor that still finds the attempt this much later ends it by force.
KILL_SLACK_S = 5.0


def one_by_one(
    start: Callable[[Launch], str], launches: Sequence[Launch]
) -> list[str | LaunchFailed]:
    """``Executor.start_many`` from ``start``, which starts one attempt (its handle) or
    raises LaunchFailed."""
    started: list[str | LaunchFailed] = []
    for launch in launches:
        try:
            started.append(start(launch))
        except LaunchFailed as exc:
            started.append(exc)
    return started


def only_one(started: list[str | LaunchFailed]) -> str:
    """One attempt's start from ``start_many`` of one launch: its handle, or raised."""
    (result,) = started
    if isinstance(result, LaunchFailed):
        raise result
    return result


class Executor(Protocol):
    """Where jobs run. One instance per worker; called from the worker's thread only."""

    # Stored with each attempt's handle: which executor can find that attempt again.
    name: str

    def describe(self) -> str:
        """One line for the daemon's start-up log: how jobs are run and tracked."""
        ...

    def start_many(self, launches: Sequence[Launch]) -> list[str | LaunchFailed]:
        """Make each attempt ready to run: in order, its handle, or why it could not start.
        Nothing of a job runs until ``proceed``: the worker first stores the handles, so
        that whatever runs can always be found again after a crash. An executor may
        overlap the starts (the local one: its fork server forks one shim while the next
        job's folder is made); one that starts one at a time has ``one_by_one`` do it."""
        ...

    def proceed(self, job_ids: Sequence[int]) -> None:
        """Let these started attempts run their jobs (their handles are stored now)."""
        ...

    def abandon(self, job_ids: Sequence[int]) -> None:
        """Give up these started attempts without running them (their handles could not be
        stored); each is reported by ``ended`` with a record that says nothing ran."""
        ...

    def adopt(self, job_id: int, attempt: int, job_dir: Path, handle: str | None) -> str | None:
        """After a restart, watch an attempt this executor started; its handle, or None if
        the attempt never started (no process, no record: the worker requeues it).

        ``handle`` is None when the worker died between starting the attempt and storing
        its handle. An attempt that ended while nobody watched is reported by ``ended``.
        """
        ...

    def ended(self) -> list[Ended]:
        """The watched attempts that have ended since the last call, all their processes
        gone (so their leases may be released); they are no longer watched."""
        ...

    def stop(self, job_id: int, preempt: bool = False) -> bool:
        """Ask a watched job to stop: a signal now, a kill after the grace period. With
        ``preempt``, first its preemption signal and the time to checkpoint (then a stop as
        above). False if the job is not watched (it ended meanwhile: ``ended`` reports it)."""
        ...

    def tell(self, job_id: int, message: str) -> bool:
        """Write ``message`` (one line) into a watched session's terminal, where its owner
        sees it (the idle warning); False if the job is not watched or not a session."""
        ...

    def waiting(self) -> dict[int, str]:
        """Watched jobs that were started but wait where they run (in a cluster's own
        queue), each with the reason in words; the local executor's never wait."""
        ...

    def job_pids(self) -> set[int]:
        """Processes of the watched jobs on this host (to tell them from outside GPU use)."""
        ...

    def pids_by_job(self) -> dict[int, set[int]]:
        """``job_pids``, job by job (to measure each job's GPU memory)."""
        ...

    def wait_fds(self) -> list[int]:
        """Descriptors that become readable when a watched attempt may have ended."""
        ...

    def close(self) -> None:
        """Let go of descriptors; running jobs keep running."""
        ...


@runtime_checkable
class Enforcing(Protocol):
    """An executor that enforces jobs' limits itself (the local one, by cgroups), and says
    with what: the daemon logs it at start and the API shows it (``ddpq gpus``)."""

    def controls(self) -> list[Control]:
        """Each kind of limit, enforced (and how) or not (and why)."""
        ...
