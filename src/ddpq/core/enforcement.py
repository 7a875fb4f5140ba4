"""What a job's limits are enforced with on this host, in the words every screen uses.

The executor finds out (cgroup controllers, v2 or v1) and the daemon says it at start, in
``ddpq gpus`` and on the page; a limit that nothing enforces is said to be so, never
implied.
"""

from __future__ import annotations

from dataclasses import dataclass

# The controllers a job's limits need, and what each enforces, as people call it.
NOUNS = {"cpuset": "CPU cores", "memory": "memory limits", "pids": "process caps"}


@dataclass(frozen=True)
class Control:
    """One kind of limit on this host: ``how`` it is enforced ("cgroup v1"), or why not."""

    controller: str  # cpuset | memory | pids
    enforced: bool
    how: str


def phrase(control: Control) -> str:
    """'memory limits: enforced (cgroup v1)', 'memory limits: not enforced (no memory
    controller)'."""
    noun = NOUNS.get(control.controller, control.controller)
    state = "enforced" if control.enforced else "not enforced"
    return f"{noun}: {state} ({control.how})"
