"""An attempt's GPU-seconds as SQL, for every query that sums them (the service the LAS
and srpt-progress policies rank by, the history of finished jobs)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func

from ddpq.store.models import Attempt


def gpu_seconds(until: Any) -> Any:
    """An attempt's GPUs times its run, one still running counted up to ``until`` (a value
    or an expression)."""
    return func.json_array_length(Attempt.gpus) * (
        func.coalesce(Attempt.ended_at, until) - Attempt.started_at
    )
