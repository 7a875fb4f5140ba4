"""``ddpq token ...``: your own API tokens, for where the daemon's Unix socket is out of reach.

On the server itself no token is needed: the socket tells the daemon who you are. For
another machine or the web page, make a token there (`ddpq token create --expires 90d`),
use it elsewhere with `ddpq --url URL login` (or $DDPQ_TOKEN with $DDPQ_URL: a token goes only
to the daemon named with it), and revoke it when you are done.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand, QuickGroup
from ddpq.client.common import client, fail, print_json
from ddpq.client.submission import usage_if_refused

app = typer.Typer(
    help="Your own API tokens, for another machine or the web page (on the server itself "
    "the Unix socket needs none).",
    rich_markup_mode=None,
    no_args_is_help=True,
    cls=QuickGroup,
)


def _when(epoch: Any) -> str:
    if not isinstance(epoch, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _note(item: dict[str, Any]) -> str:
    from ddpq.client.format import sanitize, text

    return sanitize(text(item.get("note"))) or "-"


@app.command("create", cls=QuickCommand)
def create(
    expires: Annotated[
        str, typer.Option(help="how long it works: 90d, 12h, 30m (at most 365d)")
    ] = "90d",
    note: Annotated[
        str | None, typer.Option(help="a word to tell it from others: where it is used")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Make a token for yourself and print it, once: only its hash is kept.

    Runs on the server itself (through the daemon's Unix socket); a token cannot make
    another. Use it elsewhere: `ddpq --url URL login` there (paste it), or $DDPQ_TOKEN with
    $DDPQ_URL.
    """
    from ddpq.client.api import uses_socket
    from ddpq.core.units import parse_duration

    try:
        seconds = parse_duration(expires)
    except ValueError as exc:
        fail(f"--expires: {exc}", 2)
    with client() as c:
        if not uses_socket(c.url):
            fail(
                f"tokens are made on the server itself, through the daemon's Unix socket; "
                f"this command would go to {c.url} (no socket found here: $DDPQ_SOCKET "
                "names one)",
                2,
            )
        with usage_if_refused():
            out = c.create_token(seconds, note)
    if as_json:
        print_json(out)
        return
    typer.echo(out["token"])
    typer.echo(
        f"token {out['id']} of {out['owner']}, works until {_when(out['expires_at'])}: "
        "`ddpq --url URL login` on the other machine (paste it), or DDPQ_TOKEN with DDPQ_URL; "
        f"`ddpq token revoke {out['id']}` ends it",
        err=True,
    )


@app.command("ls", cls=QuickCommand)
def ls(
    all_: Annotated[bool, typer.Option("--all", "-a", help="everyone's (admins)")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Your tokens: id, note, made, works until (expired ones for 30 days)."""
    from ddpq.client.format import sanitize, text

    with client() as c:
        items = c.tokens(everyone=all_)
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo("no tokens (`ddpq token create` makes one, on a daemon with --auth)", err=True)
        return
    rows = [["ID", *(["OWNER"] if all_ else []), "NOTE", "MADE", "WORKS UNTIL"]]
    for t in items:
        until = _when(t.get("expires_at")) + (" (expired)" if t.get("expired") else "")
        owner = [sanitize(text(t.get("owner")))] if all_ else []
        rows.append([text(t.get("id")), *owner, _note(t), _when(t.get("created_at")), until])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@app.command("revoke", cls=QuickCommand)
def revoke(
    token_ids: Annotated[list[int], typer.Argument(help="token IDs (`ddpq token ls`)")],
) -> None:
    """Revoke tokens: each stops working at once."""
    from ddpq.client.api import DdpqError

    worst = 0
    with client() as c:
        for token_id in token_ids:
            try:
                c.revoke_token(token_id)
            except DdpqError as exc:
                typer.echo(f"ddpq: {exc}", err=True)
                worst = max(worst, exc.exit_code)
                continue
            typer.echo(f"token {token_id} revoked")
    if worst:
        raise typer.Exit(worst)
