"""The worker's word on what enforces jobs' limits on its host, kept in the state folder.

The worker (which may be a process of its own, ``ddpq worker``) finds it out at start and
writes it here; the API reads it for ``ddpq gpus`` and the page. No file: the executor
enforces nothing itself (Slurm's limits are Slurm's), and nothing is claimed.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ddpq.core.enforcement import Control

FILE = "enforcement.json"


def publish(home: Path, controls: list[Control] | None) -> None:
    """Record ``controls`` for the API (None: remove an earlier run's record)."""
    path = home / FILE
    if controls is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    tmp = path.with_name(FILE + ".tmp")
    rows = [{"controller": c.controller, "enforced": c.enforced, "how": c.how} for c in controls]
    tmp.write_text(json.dumps(rows))
    tmp.replace(path)


def read(home: Path) -> list[Control]:
    """What the worker recorded; [] if nothing (or nothing readable) is."""
    try:
        rows = json.loads((home / FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(rows, list):
        return []
    out = []
    for row in rows:
        if isinstance(row, dict):
            controller, enforced, how = row.get("controller"), row.get("enforced"), row.get("how")
            if isinstance(controller, str) and isinstance(enforced, bool) and isinstance(how, str):
                out.append(Control(controller, enforced, how))
    return out
