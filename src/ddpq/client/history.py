"""``ddpq history``: finished jobs with the fields you choose, as ``sacct`` lists them; a
table, CSV or JSON.

Yours unless ``--user NAME`` or ``--all`` (everyone may read everyone's, as with `ddpq ls`).
The daemon gives the newest first, a page at a time (``GET /v1/history``); the command
asks for the newest ``--limit`` and prints them oldest first (the newest last, as `ddpq ls`).
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import client, fail, print_json
from ddpq.client.format import sanitize

OUTPUTS = ("table", "csv", "json")
# A cell a spreadsheet would read as a formula (CSV injection): written as text.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def history(
    since: Annotated[
        str | None,
        typer.Option(metavar="WHEN", help="ended since: a duration back (2d, 12h) or a date"),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(metavar="WHEN", help="ended before: a duration back or a date"),
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="this owner's jobs")] = None,
    all_: Annotated[bool, typer.Option("--all", "-a", help="everyone's jobs")] = False,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", "-s", help="only these (succeeded, failed, cancelled, timed_out)"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="a job name, or a glob: 'lr-*'")] = None,
    limit: Annotated[int, typer.Option(min=0, help="the newest N (0: every one)")] = 100,
    fields: Annotated[
        str | None,
        typer.Option("--format", "-o", metavar="FIELD,...", help="the columns, in order"),
    ] = None,
    output: Annotated[str, typer.Option(metavar="table|csv|json")] = "table",
) -> None:
    """Finished jobs: when they ran, what they used, how they ended (as sacct). Fields: id,
    name, user, state, submitted, started, ended, elapsed, attempts, gpus, gpu_ids, cores,
    mem, peak_mem, exit, reason. ELAPSED is the time it ran, its attempts summed."""
    from ddpq.client import history_fields as hf
    from ddpq.client import history_query as hq

    names: list[str] | None = None
    try:
        names = hf.parse_format(fields) if fields is not None else None
    except hf.UnknownField as exc:
        fail(str(exc), 2)
    if output not in OUTPUTS:
        fail(f"--output: {sanitize(repr(output))} is not one of {', '.join(OUTPUTS)}", 2)
    if user is not None and all_:
        fail("--user and --all: choose one", 2)
    try:
        states = hq.finished_states(state or [])
        params = hq.query(since, until, user, all_, states, name, time.time())
    except ValueError as exc:
        fail(str(exc), 2)
    rows, more = _fetch(params, limit)
    rows.reverse()  # oldest first
    _print(rows, names, output)
    if more:
        typer.echo(f"ddpq: older jobs not listed (--limit {limit}; 0 for every one)", err=True)


def _fetch(params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    from ddpq.client.api import DdpqError
    from ddpq.client.history_query import newest

    with client() as c:
        try:
            return newest(c, params, limit)
        except DdpqError as exc:
            if exc.status == 404:  # the route, not a job: a daemon from before it
                fail(f"{c.url} has no history (GET /v1/history): a ddpq older than this one")
            if exc.status != 422:
                raise
            # What the daemon refuses of the query is bad usage too, said as the options.
            fail(exc.detail.replace("query.", "--"), 2)


def _print(rows: list[dict[str, Any]], names: list[str] | None, output: str) -> None:
    from ddpq.client import history_fields as hf

    if output == "json":
        # Without --format, the API's rows whole; with it, the fields chosen.
        print_json(rows if names is None else [hf.values(r, names) for r in rows])
        return
    names = names or list(hf.DEFAULT)
    if output == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(names)
        for row in rows:
            writer.writerow([_cell(v) for v in hf.values(row, names).values()])
        return
    from ddpq.client.draw import console

    console().print(history_table(rows, names))


def history_table(rows: list[dict[str, Any]], names: list[str]) -> Any:
    """The rows as a table of the fields ``names``: on a narrow terminal whole columns go,
    by ``DROP_ORDER``; into a pipe every one is drawn, one job a line."""
    from ddpq.client import history_fields as hf
    from ddpq.client.draw import new_table
    from ddpq.client.format import plain

    table = new_table(*(hf.FIELDS[n][0] for n in names), wrap=("REASON",), drop=hf.DROP_ORDER)
    for row in rows:
        table.add_row(*(plain(cell) for cell in hf.cells(row, names)))
    return table


def _cell(value: Any) -> str:
    """A CSV cell: numbers as they are, text safe to print and to open in a spreadsheet."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list):  # the GPUs' ids
        return ",".join(map(str, value))
    shown = sanitize("" if value is None else str(value))
    return "'" + shown if shown.startswith(_FORMULA) else shown


def register(app: typer.Typer) -> None:
    """Add `ddpq history` to the client's app."""
    app.command("history", cls=QuickCommand)(history)
