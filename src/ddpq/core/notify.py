"""Notifications of a job's or a sweep's end: what is sent, where it may go, and when to
try again (pure).

A job or a sweep (or the daemon, by default) names a URL; when the job ends, or every
member of the sweep has, ddpq POSTs a JSON message there, the way Slack's and Mattermost's
incoming webhooks take one (their ``text`` field is shown as it is). A sweep sends one
message for all its members (a 100-member array is one message, not 100); its members send
none of their own. A receiver that is down or slow is tried again with a growing back-off,
a bounded number of times; each attempt is recorded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ddpq.core.finite import finite_float
from ddpq.core.states import JobState

MAX_URL = 2048
# Delay before each attempt after the first, in seconds: five tries over about 12 minutes.
RETRY_DELAYS_S = (5.0, 30.0, 120.0, 600.0)
MAX_ATTEMPTS = len(RETRY_DELAYS_S) + 1
TIMEOUT_S = 10.0  # for one attempt: connecting, sending and reading the answer
# Of one owner's messages, how many may be in flight at once: a user whose receivers hang
# or drip holds at most this many of the senders all users share.
PER_OWNER = 1
MAX_METRICS = 16  # of the job's last progress record, the fields the message carries


def check_url(url: str) -> str:
    """``url`` if a notification may be sent there, else ValueError saying why.

    Only http and https, with a host, and nothing a header could be smuggled through.
    Where the host leads is judged apart (``ddpq.notify_target``, which needs the host's
    resolver and addresses): at submission, and again at each delivery, as a name can
    change what it resolves to between then and now.
    """
    if len(url) > MAX_URL:
        raise ValueError(f"is longer than {MAX_URL} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError("contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry a user name or password (put a token in the path)")
    if port == 0:
        raise ValueError("has port 0")
    return url


@dataclass(frozen=True)
class Ended:
    """What a notification says about a job that has ended."""

    job_id: int
    name: str
    owner: str
    state: JobState
    exit_code: int | None
    reason: str
    progress: Mapping[str, Any] | None


def metrics_of(progress: Mapping[str, Any] | None) -> dict[str, int | float | str]:
    """The fields of a progress record a message carries: its first numbers and words."""
    return {
        key: value
        for key, value in list((progress or {}).items())[:MAX_METRICS]
        if isinstance(value, int | float | str)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and not math.isfinite(value))
    }


def message(job: Ended) -> dict[str, Any]:
    """The JSON body: the facts, and a ``text`` line for chat webhooks."""
    metrics = metrics_of(job.progress)
    shown = ", ".join(f"{k} {v}" for k, v in list(metrics.items())[:4])
    text = f"ddpq: job {job.job_id} ({job.name}) of {job.owner} {job.state.value}: {job.reason}"
    return {
        "job_id": job.job_id,
        "name": job.name,
        "owner": job.owner,
        "state": job.state.value,
        "exit_code": job.exit_code,
        "reason": job.reason,
        "metrics": metrics,
        "text": f"{text} ({shown})" if shown else text,
    }


# What ranks a sweep's members in its message: the first of these metrics that any member's
# newest progress record has as a number, and whether higher is better. None of them: the
# message names no best member (an array of scripts has no obvious measure).
RANKING_METRICS = (("test_acc", True), ("val_acc", True), ("test_loss", False), ("val_loss", False))
SHOWN_PARAMS = 4  # of the best member's parameters, how many its text line names
SHOWN_VALUE_CHARS = 40  # and how much of each value


@dataclass(frozen=True)
class MemberEnded:
    """A member of an ended sweep, as its message may tell of it."""

    job_id: int
    index: int
    params: Mapping[str, str]
    state: JobState
    progress: Mapping[str, Any] | None


@dataclass(frozen=True)
class SweepEnded:
    """What a notification says about a sweep all of whose members have ended."""

    sweep_id: int
    name: str
    owner: str
    size: int
    members: Sequence[MemberEnded]


def _number(progress: Mapping[str, Any] | None, key: str) -> float | None:
    return finite_float((progress or {}).get(key))


def best_member(members: Sequence[MemberEnded]) -> tuple[str, MemberEnded] | None:
    """The metric that ranks the members and the best of them by it (the lowest index
    among equals), or None when no member has any of ``RANKING_METRICS``.

    Those that succeeded are ranked first: a failed or cancelled run's last record is not
    its result. Only when none of them has the metric are all the members ranked (a sweep
    whose every run hit its time limit still has a best)."""
    finished = [m for m in members if m.state is JobState.SUCCEEDED]
    for metric, higher_is_better in RANKING_METRICS:
        for pool in (finished, members):
            scored = [(v, m) for m in pool if (v := _number(m.progress, metric)) is not None]
            if scored:
                sign = 1.0 if higher_is_better else -1.0
                return metric, max(scored, key=lambda vm: (sign * vm[0], -vm[1].index))[1]
    return None


def _shown(value: str) -> str:
    """A parameter's value as a chat line may show it: short, one printable line."""
    cut = value if len(value) <= SHOWN_VALUE_CHARS else value[: SHOWN_VALUE_CHARS - 1] + "…"
    return "".join(c if c.isprintable() else "?" for c in cut)


def sweep_message(sweep: SweepEnded) -> dict[str, Any]:
    """The JSON body for a whole sweep: its members by final state, the best member's
    parameters and metrics where a metric ranks them, and a ``text`` line for chat."""
    by_state = Counter(m.state for m in sweep.members)
    counts = {state.value: by_state[state] for state in JobState if by_state[state]}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items()) or "no members left"
    text = f"ddpq: sweep s{sweep.sweep_id} ({sweep.name}) of {sweep.owner} ended: {summary}"
    body: dict[str, Any] = {
        "sweep_id": sweep.sweep_id,
        "name": sweep.name,
        "owner": sweep.owner,
        "size": sweep.size,
        "counts": counts,
    }
    ranked = best_member(sweep.members)
    if ranked is not None:
        metric, best = ranked
        value = (best.progress or {})[metric]  # a finite number: best_member ranked by it
        body["best"] = {
            "metric": metric,
            "value": value,
            "job_id": best.job_id,
            "index": best.index,
            "state": best.state.value,
            "params": dict(best.params),
            "metrics": {**metrics_of(best.progress), metric: value},
        }
        params = list(best.params.items())
        which = ", ".join(f"{k}={_shown(v)}" for k, v in params[:SHOWN_PARAMS])
        if len(params) > SHOWN_PARAMS:
            which += ", …"
        text += f"; best {metric} {value}: {which or f'index {best.index}'} (job {best.job_id})"
    body["text"] = text
    return body


def next_attempt_at(
    attempts: int, last_at: float | None, delays: Sequence[float] = RETRY_DELAYS_S
) -> float | None:
    """When the next attempt is due, after ``attempts`` failed ones (the last at ``last_at``);
    None once the bound is reached (the notification is given up): ``len(delays) + 1``
    attempts in all."""
    if attempts == 0:
        return float("-inf")  # at once
    if attempts > len(delays) or last_at is None:
        return None
    return last_at + delays[attempts - 1]


def delivered(status: int | None) -> bool:
    """A 2xx answer is a delivery; anything else (or none) is tried again."""
    return status is not None and 200 <= status < 300


Item = TypeVar("Item")


def take_fairly(
    due: Sequence[Item],
    owner_of: Callable[[Item], str],
    in_flight: Mapping[str, int],
    free: int,
    per_owner: int = PER_OWNER,
) -> list[Item]:
    """Which of the messages ``due`` (the most urgent first) to start with ``free`` senders
    left: never more than ``per_owner`` of one owner in flight, counting ``in_flight``
    (owner: messages being sent), and round by round, so an owner with fewer in flight goes
    before one with more, whatever their messages' order."""
    taken: dict[int, Item] = {}  # by position in ``due``
    counts = Counter(in_flight)
    for level in range(per_owner):
        for i, item in enumerate(due):
            if len(taken) >= free:
                return list(taken.values())
            owner = owner_of(item)
            if counts[owner] == level and i not in taken:
                counts[owner] += 1
                taken[i] = item
    return list(taken.values())
