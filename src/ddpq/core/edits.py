"""Changing a job after its submission (``ddpq update``, ``PATCH /v1/jobs/{id}``) and
queuing it again (``ddpq restart``): what may change, and when (pure).

A waiting job (queued or held) may change its priority, time limit, GPUs, name and hold:
what its owner could have submitted it with. Once it has started, only its time limit
may change (as ``scontrol update`` on a running job): its owner may lower it, only an
admin may raise or remove it. An ended job changes no more; ``restart`` queues a new job
with its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpq.core.states import ACTIVE, TERMINAL, WAITING, JobState
from ddpq.core.units import human_duration

# The fields an update may set, with their words in reasons and events.
WORDS = {
    "priority": "priority",
    "time_limit_s": "time limit",
    "gpus": "GPUs",
    "name": "name",
}


def update_refusal(
    state: JobState,
    changes: Mapping[str, Any],
    *,
    hold: bool | None,
    admin: bool,
    time_limit_s: float | None,
) -> str | None:
    """Why a job in ``state`` whose time limit is ``time_limit_s`` may not take
    ``changes`` (and a hold or release), or None where it may."""
    if state in TERMINAL:
        return (
            f"it is {state.value}; only a waiting or running job changes "
            "(ddpq restart queues it again)"
        )
    if state in WAITING:
        return None
    assert state in ACTIVE
    fixed = [WORDS[k] for k in changes if k != "time_limit_s"]
    if hold is not None:
        fixed.append("hold")
    if fixed:
        return (
            f"it is {state.value}; once started only its time limit can change, "
            f"not its {', '.join(fixed)}"
        )
    if "time_limit_s" in changes and not admin and _raises(time_limit_s, changes["time_limit_s"]):
        now = "none" if time_limit_s is None else human_duration(time_limit_s)
        return (
            f"it is {state.value}; its owner may only lower its time limit (now {now}), "
            "an admin may raise it"
        )
    return None


def _raises(current: float | None, new: float | None) -> bool:
    if current is None:
        return False  # no limit yet: any limit is lower
    return new is None or new > current


def restart_refusal(state: JobState) -> str | None:
    """Why a job in ``state`` may not be queued again, or None: only one that has run
    or is running (a waiting one is changed with update instead)."""
    if state in WAITING:
        return f"it is {state.value} and has not run yet; change it with ddpq update"
    return None


def described(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The event's words for an update: ``priority 0 -> 5, time limit 1h -> 30m``."""
    parts = []
    for key, value in new.items():
        parts.append(f"{WORDS[key]} {_shown(key, old.get(key))} -> {_shown(key, value)}")
    return ", ".join(parts)


def _shown(key: str, value: Any) -> str:
    if key == "time_limit_s":
        return "none" if value is None else human_duration(value)
    return str(value)
