"""Interactive sessions as pure decisions: their idle limit, the ``{port}`` placeholder, and
when their GPUs count as idle (the worker samples them; this judges).

An interactive job (``ddpq shell``) is an ordinary job whose shim holds a terminal. Its GPUs
are *idle* while every one of them shows no compute utilisation and the memory its
processes hold does not grow; after ``idle_s`` of that the session is warned in its
terminal, and after the daemon's grace period still idle it is stopped, as a time limit
stops a job, with the reason ``idle: ...``. Any use of a GPU in between clears both.
A batch job is never stopped this way, but how long its GPUs have been idle is tracked
the same way and shown (``ddpq gpus``, the page, ``/metrics``).

Standard library only: the schemas, the CLI, the store and the worker all read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddpq.core.units import human_duration

# ---- the idle limit a session gets ----------------------------------------------------


def idle_limit(asked: float | None, default: float | None, maximum: float | None) -> float | None:
    """The idle limit of a new session: the one it asked for, else the daemon's default;
    None: never reclaimed. Raises ``ValueError`` (for people) above the daemon's maximum."""
    limit = default if asked is None else asked
    if maximum is not None and (limit is None or limit > maximum):
        raise ValueError(f"at most {human_duration(maximum)} (the daemon's --idle-max)")
    return limit


# ---- {port}: the leased port in a session's command ------------------------------------

# {port}, or {{port}} for a literal "{port}" (as a sweep's placeholders are escaped).
_PORT = re.compile(r"\{\{port\}\}|\{port\}")


def uses_port(argv: Sequence[str]) -> bool:
    """Whether the command names the leased port (``jupyter lab --port {port}``)."""
    return any(m.group(0) == "{port}" for arg in argv for m in _PORT.finditer(arg))


def fill_port(argv: Sequence[str], port: int | None) -> list[str]:
    """``argv`` with ``{port}`` replaced by the leased port (``{{port}}`` by ``{port}``)."""

    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "{{port}}":
            return "{port}"
        return str(port) if port is not None else m.group(0)

    return [_PORT.sub(replace, arg) for arg in argv]


# ---- idle GPUs -----------------------------------------------------------------------

# How often the worker looks at the GPUs of running jobs: at least four looks within the
# shortest idle limit, but no more than once a second and no less than every 5 s.
SAMPLE_MIN_S, SAMPLE_MAX_S = 1.0, 5.0


def sample_every(idle_limits: Iterable[float | None]) -> float:
    limits = [x for x in idle_limits if x]
    wanted = min(limits) / 4 if limits else SAMPLE_MAX_S
    return max(SAMPLE_MIN_S, min(SAMPLE_MAX_S, wanted))


@dataclass(frozen=True)
class GpuUse:
    """One look at one GPU: its compute utilisation (percent of the last sample period
    with a kernel running) and the memory its compute processes hold, in MiB. None where
    the driver cannot tell: a GPU whose utilisation is unknown counts as in use, so that
    nothing is ever reclaimed on a guess."""

    utilization_pct: int | None
    memory_mb: int | None


@dataclass(frozen=True)
class Watched:
    """A running job on GPUs as the store has it."""

    job_id: int
    interactive: bool
    idle_s: float | None  # its idle limit; None: never reclaimed
    idle_since: float | None  # when its GPUs were first seen idle (None: in use, or unknown)
    warned_at: float | None  # when its terminal was told it will be reclaimed


@dataclass(frozen=True)
class Verdict:
    """What follows one look at a job's GPUs."""

    idle_since: float | None
    warned_at: float | None
    peak_mb: int  # the memory its GPUs held at most since they were last in use
    warn: bool = False  # tell its terminal now that it will be reclaimed
    resumed: bool = False  # it had been warned, and its GPUs are in use again
    reclaim: bool = False  # stop it now: idle through its limit and the grace period


def in_use(uses: Sequence[GpuUse], peak_mb: int | None) -> bool:
    """Whether a job's GPUs are in use: one computes (or cannot tell), or the memory they
    hold grew past its peak since they were last in use (a model being loaded)."""
    if any(u.utilization_pct is None or u.utilization_pct > 0 for u in uses):
        return True
    held = memory_of(uses)
    return peak_mb is not None and held is not None and held > peak_mb


def memory_of(uses: Sequence[GpuUse]) -> int | None:
    known = [u.memory_mb for u in uses if u.memory_mb is not None]
    return sum(known) if known else None


def judge(
    job: Watched, uses: Sequence[GpuUse], peak_mb: int | None, now: float, grace_s: float
) -> Verdict:
    """One look at ``job``'s GPUs (``uses``, each of its GPUs once) at ``now``.

    ``peak_mb`` is what the worker kept from the previous look (None: this is the first
    since it started watching). An interactive job with a limit is warned once its GPUs
    have been idle ``idle_s``, and reclaimed ``grace_s`` after the warning if they still are.
    """
    held = memory_of(uses) or 0
    if in_use(uses, peak_mb):
        return Verdict(None, None, held, resumed=job.warned_at is not None)
    since = job.idle_since if job.idle_since is not None else now
    peak = max(held, peak_mb or 0)
    if not job.interactive or job.idle_s is None:
        return Verdict(since, None, peak)
    if job.warned_at is None:
        if now - since >= job.idle_s:
            return Verdict(since, now, peak, warn=True)
        return Verdict(since, None, peak)
    return Verdict(since, job.warned_at, peak, reclaim=now - job.warned_at >= grace_s)


def idle_for(idle_since: float | None, now: float) -> float:
    return 0.0 if idle_since is None else max(0.0, now - idle_since)


# ---- what the session and its history are told -----------------------------------------


def warning_text(idle_s: float, grace_s: float) -> str:
    return (
        f"ddpq: this session's GPUs have been idle for {human_duration(idle_s)}; it will be "
        f"ended in {human_duration(grace_s)} unless they are used again"
    )


RESUMED_TEXT = "ddpq: its GPUs are in use again; the session goes on"


def reclaim_reason(idle_s: float) -> str:
    """The stop's recorded reason: the job's reason begins with it (``idle: ...``)."""
    return f"idle: its GPUs were unused for {human_duration(idle_s)}"
