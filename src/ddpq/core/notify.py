"""Notifications of a job's end: what is sent, where it may go, and when to try again (pure).

A job (or the daemon, by default) names a URL; when the job ends, ddpq POSTs a JSON
message there, the way Slack's and Mattermost's incoming webhooks take one (their ``text``
field is shown as it is). A receiver that is down or slow is tried again with a growing
back-off, a bounded number of times; each attempt is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ddpq.core.states import JobState

MAX_URL = 2048
# Delay before each attempt after the first, in seconds: five tries over about 12 minutes.
RETRY_DELAYS_S = (5.0, 30.0, 120.0, 600.0)
MAX_ATTEMPTS = len(RETRY_DELAYS_S) + 1
TIMEOUT_S = 10.0  # for one attempt: connecting, sending and reading the answer
MAX_METRICS = 16  # of the job's last progress record, the fields the message carries


def check_url(url: str) -> str:
    """``url`` if a notification may be sent there, else ValueError saying why.

    Only http and https, with a host, and nothing a header could be smuggled through.
    Where the host leads (loopback, say) is judged when sending: a name can change
    what it resolves to between now and then.
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


def message(job: Ended) -> dict[str, Any]:
    """The JSON body: the facts, and a ``text`` line for chat webhooks."""
    metrics = {
        key: value
        for key, value in list((job.progress or {}).items())[:MAX_METRICS]
        if isinstance(value, int | float | str)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and not math.isfinite(value))
    }
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
