"""Who you are to the daemon: `ddpq login` (save a token for a daemon), `ddpq whoami`, and
`ddpq token ...` (``client.tokens``: make and revoke your tokens)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ddpq.client import tokens
from ddpq.client.coercion import QuickCommand
from ddpq.client.common import OPTIONS, client, print_json


def login(
    token: Annotated[
        str | None,
        typer.Argument(
            help="the token `ddpq token create` (or the admin) printed; better left out: an "
            "argument shows in `ps` and your shell history, so paste it at the prompt or pipe "
            "it in"
        ),
    ] = None,
) -> None:
    """Save your API token (0600) in your config folder with the daemon it is for (--url or
    $DDPQ_URL), which alone it goes to: paste it, or `... | ddpq login`."""
    from ddpq.client.credentials import check_token, login_url, save_login

    url = login_url(OPTIONS["url"])

    if token is not None:
        # Kept so that existing scripts work, but anyone on the machine can read a command
        # line (`ps`), and the shell keeps it in its history.
        typer.echo(
            "ddpq: warning: a token given as an argument is visible to other users (ps) and "
            "kept in your shell history; run `ddpq login` and paste it, or pipe it in",
            err=True,
        )
    else:
        token = _read_token()
    path = save_login(url, check_token(token))
    typer.echo(f"token for {url} saved to {path}")


def _read_token() -> str:
    """The token from a hidden prompt on a terminal, else from standard input."""
    import getpass

    if sys.stdin is None:
        return ""
    if sys.stdin.isatty():
        try:
            return getpass.getpass("token: ")
        except EOFError:  # Ctrl-D at the prompt
            return ""
    # A token is one short line; a bound keeps a mistaken `ddpq login < big.file` cheap.
    return sys.stdin.read(4096)


def whoami(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Who the daemon thinks you are, how it knows (the Unix socket, a token), and which
    path this client took."""
    from ddpq.client.whoami import describe

    with client() as c:
        me = {**c.whoami(), "url": c.url}
    if as_json:
        print_json(me)
        return
    typer.echo("\n".join(describe(me, me["url"])))


def register(app: typer.Typer) -> None:
    """Add `login`, `whoami` and the `token` group to the client's app."""
    app.command("login", cls=QuickCommand)(login)
    app.command("whoami", cls=QuickCommand)(whoami)
    app.add_typer(tokens.app, name="token")
