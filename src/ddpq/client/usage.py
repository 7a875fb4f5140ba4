"""``ddpq usage``: GPU-hours of jobs and of outside use, jobs ended, waits, per user, day or
month; as a table, CSV (``--csv``, for a spreadsheet) or the API's JSON (``--json``).

Registered by ``client.cli`` (``register``); the drawing is imported when it runs, so that
importing it costs the other commands nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import client, fail, print_json
from ddpq.client.format import Data, sanitize, text
from ddpq.core.states import TERMINAL, JobState

BY = ("user", "day", "month")
FINAL = [state.value for state in JobState if state in TERMINAL]
CSV_COLUMNS = [
    "key",
    "kind",
    "gpu_hours_jobs",
    "gpu_hours_outside",
    *FINAL,
    "jobs_started",
    "wait_p50_s",
    "wait_p90_s",
    "mem_reserved_gib_h",
    "mem_used_gib_h",
    "mem_used_peak_gib",
    "core_hours",
]
# A cell a spreadsheet would read as a formula (CSV injection): written as text.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def usage(
    since: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="how far back: a duration (30d, 12h, 1d12h), at most 3650d"
        ),
    ] = "30d",
    by: Annotated[
        str, typer.Option(metavar="user|day|month", help="group by user, or by UTC day or month")
    ] = "user",
    as_csv: Annotated[
        bool, typer.Option("--csv", help="comma-separated values, the total last")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the API's answer")] = False,
) -> None:
    """GPU-hours used (jobs, and processes in no job), core-hours, jobs ended by state,
    queue waits."""
    from ddpq.client.api import DdpqError
    from ddpq.core.usage import parse_since

    try:
        parse_since(since)
    except ValueError as exc:
        fail(f"--since: {sanitize(str(exc))}", 2)
    if by not in BY:
        fail(f"--by: {sanitize(repr(by))} is not one of user, day, month", 2)
    if as_csv and as_json:
        fail("--csv and --json: choose one", 2)
    with client() as c:
        try:
            report = c.usage(since, by)
        except DdpqError as exc:
            if exc.status != 422:
                raise
            fail(exc.detail, 2)  # what the daemon refuses of the query is bad usage too
    if as_json:
        print_json(report)
    elif as_csv:
        write_csv(report, sys.stdout)
    else:
        from ddpq.client.draw import console

        console().print(usage_table(report, since, by))


def register(app: typer.Typer) -> None:
    """Add `ddpq usage` to the client's app."""
    app.command("usage", cls=QuickCommand)(usage)


def _rows(report: Data) -> list[Data]:
    rows = [r for r in report.get("rows") or [] if isinstance(r, Mapping)]
    total = report.get("total")
    return [*rows, total] if isinstance(total, Mapping) else rows


def _jobs(row: Data) -> Mapping[str, Any]:
    jobs = row.get("jobs")
    return jobs if isinstance(jobs, Mapping) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _cell(value: Any) -> str:
    """A CSV cell: a number as it is (rounded), text made safe to print and to open."""
    number = _number(value)
    if number is not None:
        return f"{round(number, 4):g}" if abs(number) < 1e15 else str(number)
    shown = sanitize(text(value))
    return "'" + shown if shown.startswith(_FORMULA) else shown


def write_csv(report: Data, out: Any) -> None:
    import csv

    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in _rows(report):
        jobs = _jobs(row)
        values = {**row, **{state: jobs.get(state, 0) for state in FINAL}}
        writer.writerow([_cell(values.get(column)) for column in CSV_COLUMNS])


def _hours(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else f"{number:.1f}"


def _wait(value: Any) -> str:
    from ddpq.core.units import human_duration

    number = _number(value)
    return "-" if number is None else human_duration(number)


def _memory(row: Data) -> str:
    """Sharing by memory: GiB-hours reserved / of the measured peaks ("-": no sharing)."""
    reserved = _number(row.get("mem_reserved_gib_h"))
    if reserved is None:
        return "-"
    return f"{reserved:.1f}/{_hours(row.get('mem_used_gib_h'))}"


def _key(row: Data) -> str:
    key = text(row.get("key"))
    return f"account {key}" if row.get("kind") == "account" else key


def usage_table(report: Data, since: str, by: str) -> Any:
    """``report`` as a table; ``since`` and ``by`` as asked (and checked), not as answered."""
    from ddpq.client.draw import new_table
    from ddpq.client.format import plain

    counts = report.get("outside_use") == "count"
    title = f"since {sanitize(since)} ago; outside use " + (
        "counts towards fair share" if counts else "is shown, not counted"
    )
    columns = [by.upper(), "JOBS GPU-H", "OUTSIDE GPU-H", "CORE-H", *(s.upper() for s in FINAL)]
    # A narrow terminal loses whole columns, the least asked-for first (never a cut header).
    drop = (
        "MEM GIB-H RES/USED",
        "WAIT P90",
        "CORE-H",
        "OUTSIDE GPU-H",
        "TIMED_OUT",
        "CANCELLED",
        "STARTED",
    )
    table = new_table(
        *columns,
        "STARTED",
        "WAIT P50",
        "WAIT P90",
        "MEM GIB-H RES/USED",
        title=title,
        wrap="",
        drop=drop,
    )
    for row in _rows(report):
        jobs = _jobs(row)
        cells: Iterable[str] = [
            _key(row),
            _hours(row.get("gpu_hours_jobs")),
            _hours(row.get("gpu_hours_outside")),
            _hours(row.get("core_hours")),
            *(text(jobs.get(state, 0)) for state in FINAL),
            text(row.get("jobs_started")),
            _wait(row.get("wait_p50_s")),
            _wait(row.get("wait_p90_s")),
            _memory(row),
        ]
        style = "bold" if row.get("kind") == "total" else ""
        table.add_row(*(plain(cell, style) for cell in cells))
    return table
