"""Time-limit, retry, outcome and fair-share rules (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from ddpq.core.states import JobState
from ddpq.core.units import size_for_people


class StopRequest(StrEnum):
    """Why ddpq asked a running job to stop."""

    CANCEL = "cancel"
    TIMEOUT = "timeout"
    PREEMPT = "preempt"  # checkpoint and go back to the queue (an admin, or the policy)
    IDLE = "idle"  # an interactive session whose GPUs stayed unused (core.interactive)
    # Its folder holds more than the per-job limit (core.quota): the daemon's word, which
    # a retry would not change (the folder still holds it), so the job ends failed.
    QUOTA = "quota"


@dataclass(frozen=True)
class ExitRecord:
    """What the shim wrote when the job's process group was gone."""

    exit_code: int | None
    signal: int | None
    started_at: float
    ended_at: float
    error: str | None = None
    # False: the shim never started the job (its worker went away first), so the attempt
    # did not run at all and the job goes back to the queue as it was.
    launched: bool = True
    # The memory limit (bytes) of the cgroup whose OOM killer killed some of the job: read
    # by the executor from the kernel's count, never from what the job wrote. None: no kill.
    oom_limit_bytes: int | None = None
    # The most host memory (bytes) its cgroup held (v2 ``memory.peak``, v1
    # ``memory.max_usage_in_bytes``), read by the executor before the cgroup goes. None:
    # not known (no memory controller, or no cgroup).
    peak_ram_bytes: int | None = None


def within_attempt(record: ExitRecord, attempt_started: float | None, now: float) -> ExitRecord:
    """``record`` with its times held to when its attempt could have run: from the
    attempt's start, as the store has it, to ``now``. The job can write the shim's record
    over: an end forged before its start would hide its time from fair share and the
    usage reports, and one far ahead would count it there for years."""
    earliest = attempt_started if attempt_started is not None else float("-inf")
    began = min(max(record.started_at, earliest), now)
    ended = min(max(record.ended_at, began), now)
    if (began, ended) == (record.started_at, record.ended_at):
        return record
    return replace(record, started_at=began, ended_at=ended)


@dataclass(frozen=True)
class Outcome:
    state: JobState
    reason: str


def past_time_limit(started_at: float | None, time_limit_s: float | None, now: float) -> bool:
    if started_at is None or time_limit_s is None:
        return False
    return now - started_at >= time_limit_s


def stop_due(
    requested: StopRequest | None,
    sent_at: float | None,
    started_at: float | None,
    time_limit_s: float | None,
    now: float,
) -> StopRequest | None:
    """The stop the worker must send a running job now, if any: one asked for (a cancel)
    and not sent yet, or its time limit reached. A stop is sent once; the executor's
    grace period turns it into a kill."""
    if requested is not None:
        return requested if sent_at is None else None
    if past_time_limit(started_at, time_limit_s, now):
        return StopRequest.TIMEOUT
    return None


def retry_backoff_s(retry: int, base_s: float = 2.0, cap_s: float = 300.0) -> float:
    """Delay before retry ``retry`` (1-based).

    Doubles each time (2 s, 4 s, 8 s, ...) so a job that fails at once does not
    spin, capped so a retry still happens within minutes.
    """
    return float(min(cap_s, base_s * (2 ** max(0, retry - 1))))


def describe_exit(record: ExitRecord) -> str:
    how = _how_it_ended(record)
    succeeded = record.error is None and record.signal is None and record.exit_code == 0
    if record.oom_limit_bytes is not None and not succeeded:
        # The limit is what it asked for (--mem) or was given: say so before the signal.
        return f"out of memory: used its {size_for_people(record.oom_limit_bytes)}; {how}"
    return how


def _how_it_ended(record: ExitRecord) -> str:
    if record.error:
        return record.error
    if record.signal is not None:
        return f"killed by signal {record.signal}"
    return f"exit code {record.exit_code}"


def outcome_of(
    record: ExitRecord, stop: StopRequest | None, grace_s: float, stop_reason: str | None = None
) -> Outcome:
    """The final state of one attempt, given how it ended and whether ddpq stopped it
    (``stop_reason``: the words the stop was asked for with, "idle: ...")."""
    how = describe_exit(record)
    if stop is StopRequest.CANCEL:
        return Outcome(
            JobState.CANCELLED, f"cancelled (SIGTERM, SIGKILL after {grace_s:g}s); {how}"
        )
    if stop is StopRequest.TIMEOUT:
        return Outcome(
            JobState.TIMED_OUT,
            f"time limit reached (SIGTERM, SIGKILL after {grace_s:g}s); {how}",
        )
    if stop is StopRequest.IDLE:
        # A limit as a time limit is, so the same end; the reason says which ("idle: ...").
        why = stop_reason or "idle"
        return Outcome(JobState.TIMED_OUT, f"{why} (SIGTERM, SIGKILL after {grace_s:g}s); {how}")
    if stop is StopRequest.QUOTA:
        why = stop_reason or "its folder holds more than the per-job limit"
        return Outcome(JobState.FAILED, f"{why} (SIGTERM, SIGKILL after {grace_s:g}s); {how}")
    if record.error is None and record.signal is None and record.exit_code == 0:
        return Outcome(JobState.SUCCEEDED, how)
    return Outcome(JobState.FAILED, how)


def should_retry(state: JobState, retries_used: int, max_retries: int) -> bool:
    """Only plain failures are retried; a cancel or a time limit is the user's word."""
    return state is JobState.FAILED and retries_used < max_retries


@dataclass(frozen=True)
class Run:
    """One stretch of GPU use by one owner, for fair share."""

    owner: str
    gpus: int
    started_at: float
    ended_at: float | None  # None: still running
    cores: int = 0  # the host's CPU cores it leased (its cpuset)


# What a job that leased neither GPUs nor cores weighs, in GPUs.
UNLEASED_WEIGHT = 0.1


def recent_usage(
    runs: Iterable[Run], now: float, window_s: float, gpus_per_core: float = 0.0
) -> dict[str, float]:
    """GPU-seconds each owner used within the last ``window_s`` seconds.

    A run weighs its dominant share of the host, in GPUs: its GPUs, or its cores at
    ``gpus_per_core`` (the host's GPUs over its cores), whichever is more. A flood of
    one-core jobs then weighs what it takes of the host: counted as a tenth of a GPU each,
    it let its owner rank ahead of anyone who had run a GPU job, for as long as it lasted.
    A job that leased neither counts as ``UNLEASED_WEIGHT`` of a GPU.
    """
    since = now - window_s
    usage: dict[str, float] = {}
    for run in runs:
        end = now if run.ended_at is None else min(run.ended_at, now)
        start = max(run.started_at, since)
        if end <= start:
            continue
        weight = max(run.gpus, run.cores * gpus_per_core) or UNLEASED_WEIGHT
        usage[run.owner] = usage.get(run.owner, 0.0) + weight * (end - start)
    return usage
