"""Job dependencies (``--after ID``): may a job waiting on others start?"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddpq.core.states import TERMINAL, JobState


@dataclass(frozen=True)
class Verdict:
    ready: bool  # every dependency succeeded
    doomed_by: int | None = None  # a dependency that ended without success
    doomed_state: JobState | None = None


def dependency_verdict(deps: Mapping[int, JobState]) -> Verdict:
    for dep_id, state in sorted(deps.items()):
        if state in TERMINAL and state is not JobState.SUCCEEDED:
            return Verdict(ready=False, doomed_by=dep_id, doomed_state=state)
    return Verdict(ready=all(s is JobState.SUCCEEDED for s in deps.values()))


def waiting_reason(deps: Iterable[int], user_hold: bool) -> str:
    parts = []
    if user_hold:
        parts.append("held by user")
    ids = sorted(deps)
    if ids:
        parts.append("waiting for job " + ", ".join(str(i) for i in ids) + " to succeed")
    return "; ".join(parts)
