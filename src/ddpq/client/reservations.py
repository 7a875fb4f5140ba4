"""`ddpq reservations`: the GPU reservations in force or to come (`ddpq admin reserve`
makes them), as a table or the API's JSON."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import client, print_json
from ddpq.client.format import Data


def reservations(
    ended: Annotated[bool, typer.Option("--ended", help="past ones too")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """GPU reservations in force or to come (`ddpq admin reserve` makes them)."""
    from ddpq.client.draw import console

    with client() as c:
        items = c.reservations(ended)["items"]
    if as_json:
        print_json(items)
    elif not items:
        typer.echo("no reservations")
    else:
        console().print(reservations_table(items))


def reservations_table(items: list[Data]) -> Any:
    from ddpq.client.draw import new_table
    from ddpq.client.format import plain, text, when

    table = new_table("ID", "USER", "GPUS", "START", "END", "STATE", wrap="")
    for r in items:
        table.add_row(
            plain(str(r["id"])),
            plain(text(r["user"])),
            plain(str(r["gpus"])),
            plain(f"{when(r['start']).astimezone():%Y-%m-%d %H:%M}"),
            plain(f"{when(r['end']).astimezone():%Y-%m-%d %H:%M}"),
            plain("in force" if r["active"] else "to come", "green" if r["active"] else ""),
        )
    return table


def register(app: typer.Typer) -> None:
    """Add `ddpq reservations` to the client's app."""
    app.command("reservations", cls=QuickCommand)(reservations)
