"""The fields `ddpq history --format` chooses from (as ``sacct --format``): each one's
column header, its cell for people (a table) and its value for programs (CSV, JSON).

A row is one ``HistoryRow`` of ``GET /v1/history`` as JSON. For people: times in local
time, durations and sizes as people write them, GPUs as "count:which" (as `ddpq ls`).
For programs: times as the API gives them (ISO 8601, UTC), elapsed in seconds, sizes in
bytes, None where there is nothing (CSV: an empty cell).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ddpq.client.format import sanitize, text, when

Row = Mapping[str, Any]
DEFAULT = ("id", "name", "user", "state", "ended", "elapsed", "gpus", "peak_mem", "exit")
# On a narrow terminal, the columns a table goes without first (ID, NAME, STATE and EXIT
# stay); into a pipe every column is drawn.
DROP_ORDER = (
    "SUBMITTED",
    "GPU IDS",
    "ATTEMPTS",
    "CORES",
    "MEM",
    "STARTED",
    "PEAK MEM",
    "USER",
    "GPUS",
    "ENDED",
    "ELAPSED",
)


class UnknownField(ValueError):
    """A field ``--format`` does not know (bad usage: exit 2)."""


def _local(value: Any) -> str:
    if not value:
        return "-"
    moment: datetime = when(value).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _duration(value: Any) -> str:
    from ddpq.core.units import human_duration

    return "-" if not isinstance(value, int | float) else human_duration(float(value))


def _size(value: Any) -> str:
    from ddpq.core.units import human_size

    return "-" if not isinstance(value, int) or isinstance(value, bool) else human_size(value)


def exit_text(row: Row) -> str:
    """How its last attempt's processes ended: the exit code, or the signal's name."""
    sig = row.get("exit_signal")
    if isinstance(sig, int) and not isinstance(sig, bool):
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"
    code = row.get("exit_code")
    return "-" if code is None else text(code)


def exit_value(row: Row) -> int | str | None:
    """As ``exit_text`` for programs: the code as a number, a signal's name, or None."""
    shown = exit_text(row)
    code = row.get("exit_code")
    if shown == "-":
        return None
    return code if isinstance(code, int) and shown == text(code) else shown


def _seconds(value: Any) -> float | None:
    """Elapsed seconds to the millisecond (the clocks say no more)."""
    return round(float(value), 3) if isinstance(value, int | float) else None


def gpus_text(row: Row) -> str:
    """ "2:0,1" (how many: which, its last attempt's), "2" if it never ran, "-" for none."""
    ids = row.get("gpu_ids") or []
    if ids:
        return f"{len(ids)}:" + ",".join(map(text, ids))
    return text(row.get("gpus")) if row.get("gpus") else "-"


def _dash(value: Any) -> str:
    return "-" if value is None or value == "" else text(value)


# name -> (header, cell for people, value for programs)
Field = tuple[str, Callable[[Row], str], Callable[[Row], Any]]
FIELDS: dict[str, Field] = {
    "id": ("ID", lambda r: text(r.get("id")), lambda r: r.get("id")),
    "name": ("NAME", lambda r: text(r.get("name")), lambda r: r.get("name")),
    "user": ("USER", lambda r: text(r.get("owner")), lambda r: r.get("owner")),
    "state": ("STATE", lambda r: text(r.get("state")), lambda r: r.get("state")),
    "submitted": (
        "SUBMITTED",
        lambda r: _local(r.get("submitted_at")),
        lambda r: r.get("submitted_at"),
    ),
    "started": (
        "STARTED",
        lambda r: _local(r.get("started_at")),
        lambda r: r.get("started_at"),
    ),
    "ended": ("ENDED", lambda r: _local(r.get("ended_at")), lambda r: r.get("ended_at")),
    "elapsed": (
        "ELAPSED",
        lambda r: _duration(r.get("elapsed_s")),
        lambda r: _seconds(r.get("elapsed_s")),
    ),
    "attempts": ("ATTEMPTS", lambda r: text(r.get("attempts")), lambda r: r.get("attempts")),
    "gpus": ("GPUS", gpus_text, lambda r: r.get("gpus")),
    "gpu_ids": (
        "GPU IDS",
        lambda r: ",".join(map(text, r.get("gpu_ids") or [])) or "-",
        lambda r: list(r.get("gpu_ids") or []),
    ),
    "cores": ("CORES", lambda r: _dash(r.get("cores")), lambda r: r.get("cores")),
    "mem": ("MEM", lambda r: _size(r.get("mem")), lambda r: r.get("mem")),
    "peak_mem": (
        "PEAK MEM",
        lambda r: _size(r.get("peak_mem")),
        lambda r: r.get("peak_mem"),
    ),
    "exit": ("EXIT", exit_text, lambda r: exit_value(r)),
    "reason": ("REASON", lambda r: _dash(r.get("reason")), lambda r: r.get("reason")),
}


def parse_format(spec: str) -> list[str]:
    """``--format id,name,...`` as field names, in order; ``UnknownField`` names the one it
    does not know and every one it does."""
    names = [part.strip().lower() for part in spec.split(",") if part.strip()]
    if not names:
        raise UnknownField(f"--format: no field given (known: {', '.join(FIELDS)})")
    for name in names:
        if name not in FIELDS:
            raise UnknownField(
                f"--format: unknown field {sanitize(name)!r} (known: {', '.join(FIELDS)})"
            )
    return names


def cells(row: Row, names: list[str]) -> list[str]:
    """The row's cells for people, in the order of ``names``."""
    return [FIELDS[name][1](row) for name in names]


def values(row: Row, names: list[str]) -> dict[str, Any]:
    """The row's values for programs, keyed by field name."""
    return {name: FIELDS[name][2](row) for name in names}
