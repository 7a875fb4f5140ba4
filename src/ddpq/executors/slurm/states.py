"""What Slurm says of a job, in ddpq's terms: pure functions over its commands' text.

``squeue`` knows the jobs Slurm holds in memory (waiting, running, and those that ended
less than ``MinJobAge`` ago); ``sacct`` knows every job, where the cluster keeps
accounting. The Slurm executor asks each once per pass for all of its jobs and reads the
answers here; how an attempt ended comes from the shim's exit record when there is one,
and from Slurm's state (``record_from_slurm``) when the shim could not write it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ddpq.core.rules import ExitRecord

# The states of a job that has ended in Slurm, every process of it gone (COMPLETING, the
# state in which Slurm still kills what is left, is not one of them).
FINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# Slurm's reason for a job submitted with --hold and not released yet: ddpq's own hold,
# never shown to users as a reason to wait.
HELD = "JobHeldUser"

# squeue's fields, "|"-separated: none of them holds a "|".
QUEUE_FORMAT = "%i|%T|%r|%S|%e|%N"
ACCOUNTING_FORMAT = "JobIDRaw,State,ExitCode,Start,End,Reason"
_NO_TIME = {"", "N/A", "NONE", "Unknown", "None"}


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as squeue or sacct reports it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, ... ("CANCELLED by 0" is CANCELLED)
    reason: str  # why it waits or why it ended; "" for Slurm's "None"
    started_at: float | None = None
    ended_at: float | None = None
    nodes: str = ""  # squeue only: the nodes it runs on, e.g. "n[1-2]"
    exit_code: int | None = None  # sacct only: ExitCode "code:signal"
    signal: int | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def waiting(self) -> bool:
        return self.state == "PENDING"


def parse_time(text: str) -> float | None:
    """Slurm's local time, ``2026-12-01T20:42:15``, as epoch seconds; None if it has none."""
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's ExitCode ``code:signal`` as (exit code, signal): one of them is None."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit() or not sig.isdigit():
        return None, None
    return (None, int(sig)) if int(sig) else (int(code), None)


def _reason(text: str) -> str:
    text = text.strip()
    return "" if text in ("None", "(null)") else text


def parse_queue(text: str) -> dict[str, SlurmJob]:
    """``squeue --noheader --format=QUEUE_FORMAT`` by job id."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6 or not fields[0].isdigit():
            continue  # an array or heterogeneous job's "1_2"/"3+0" is none of ddpq's
        job_id, state, reason, start, end, nodes = fields
        jobs[job_id] = SlurmJob(
            job_id,
            state.split()[0] if state else "",
            _reason(reason),
            parse_time(start),
            parse_time(end),
            nodes,
        )
    return jobs


def parse_accounting(text: str) -> dict[str, SlurmJob]:
    """``sacct --noheader --parsable2 --allocations --format=ACCOUNTING_FORMAT`` by job id."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        job_id, state, exit_code, start, end = fields[:5]
        code, sig = parse_exit_code(exit_code)
        jobs[job_id] = SlurmJob(
            job_id,
            state.split()[0] if state else "",
            _reason("|".join(fields[5:])),
            parse_time(start),
            parse_time(end),
            exit_code=code,
            signal=sig,
        )
    return jobs


_PARENTHESES = re.compile(r"\([^)]*\)")


def gpu_count(gres: str) -> int:
    """The GPUs in one node's GRES as sinfo's %G writes them: ``gpu:4``, ``gpu:a100:2(S:0-1)``,
    ``gpu:a100:2,gpu:v100:2,shard:8``; ``(null)`` is none."""
    total = 0
    for item in _PARENTHESES.sub("", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def partition_gpus(text: str, partition: str | None) -> int:
    """The GPUs of a partition's nodes, from ``sinfo --Node --noheader --format=%N|%P|%G``.

    Without a partition, the default one (sinfo marks it with ``*``): where sbatch sends a
    job that names none. A node listed twice (in two partitions) counts once.
    """
    seen: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        node, part, gres = fields
        mine = part.rstrip("*") == partition if partition else part.endswith("*")
        if mine:
            seen[node] = gpu_count(gres)
    return sum(seen.values())


# Why an attempt ended, for a job whose shim left no exit record, by Slurm's final state.
_ENDED_AS = {
    "COMPLETED": "lost: Slurm job {id} completed, but its exit record never appeared in the "
    "job's folder (is that folder on a filesystem the nodes share?)",
    "FAILED": "Slurm job {id} failed before ddpq's shim could record its end",
    "CANCELLED": "Slurm job {id} was cancelled",
    "TIMEOUT": "Slurm job {id} reached Slurm's time limit",
    "NODE_FAIL": "lost: a node of Slurm job {id} failed",
    "BOOT_FAIL": "lost: a node of Slurm job {id} failed to boot",
    "OUT_OF_MEMORY": "Slurm job {id} ran out of memory",
    "PREEMPTED": "Slurm job {id} was preempted",
    "DEADLINE": "Slurm job {id} passed its deadline",
}


def record_from_slurm(handle: str, job: SlurmJob | None, now: float) -> ExitRecord:
    """How an attempt ended as Slurm tells it (``job``: its squeue or sacct view; None when
    neither knows the job any more): for an attempt whose shim wrote no exit record."""
    if job is None:
        error = (
            f"lost: Slurm no longer knows job {handle} (neither squeue nor sacct lists it) "
            "and it left no exit record"
        )
        return ExitRecord(None, None, now, now, error=error)
    words = _ENDED_AS.get(job.state, f"Slurm job {{id}} ended as {job.state}").format(id=handle)
    if job.reason and job.reason not in words:
        words = f"{words} ({job.reason})"
    started = job.started_at if job.started_at is not None else now
    ended = job.ended_at if job.ended_at is not None else now
    return ExitRecord(job.exit_code, job.signal, started, max(started, ended), error=words)


def waiting_reason(job: SlurmJob) -> str | None:
    """What to tell users of a job Slurm has not started: its reason (``Resources``,
    ``Priority``, ``ReqNodeNotAvail, UnavailableNodes:n2``); None once it runs, or while it
    is still ddpq's own hold."""
    if not job.waiting or job.reason in (HELD, ""):
        return None  # no reason yet: the moment between its release and Slurm's next look
    return f"waiting in Slurm: {job.reason}"
