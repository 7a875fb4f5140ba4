"""The cap on one user's waiting jobs (``max_queued_per_user``), checked at the door.

A submission that would leave its owner with more queued and held jobs than the cap is
refused whole (a sweep counts every member), with 429 and a reason that names the cap,
inside the submission's own write transaction: two submissions cannot both pass the
last free place. The cap on running jobs is the planner's (``gates.running_cap``)."""

from __future__ import annotations

from ddpq.config import Settings
from ddpq.server.errors import ApiError
from ddpq.store import queue as queue_store
from ddpq.store.db import Session


def _jobs(n: int) -> str:
    return f"{n:,} job{'' if n == 1 else 's'}"


def refuse_if_over(s: Session, settings: Settings, owner: str, adding: int) -> None:
    """429 if ``adding`` more jobs of ``owner`` would pass the cap (0: no cap)."""
    cap = settings.max_queued_per_user
    if not cap:
        return
    waiting = queue_store.waiting_of(s, owner, upto=cap + 1)
    if waiting + adding <= cap:
        return
    what = "this job" if adding == 1 else f"these {_jobs(adding)}"
    # Past the cap already (it was lowered, or is new): counted no further than that.
    has = _jobs(waiting) if waiting <= cap else f"more than {_jobs(cap)}"
    raise ApiError(
        429,
        "queue_cap",
        f"{owner} has {has} queued or held; the cap is {cap:,} per user "
        f"(max_queued_per_user), so {what} would pass it",
    )
