"""What every client command shares: the ``ddpq`` Typer app and its global options, and,
from ``client.runtime`` (which needs no Typer), the connection to the daemon, one-line
failures, JSON output, and the error boundary (``run``) with the exit codes.

The command modules (``jobs``, ``submit``, ``devices``, ``usage``, ``sessions``, ``account``,
``tokens``, ``reservations``) import this module and nothing imports them but ``client.cli``,
which puts them on ``app``: this module imports no command module, so the package has no
import cycle (``tests/test_client_layout.py``). Like every module the hot commands load, it
imports neither httpx nor pydantic (``tests/test_cli_speed.py``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ddpq.client.api import DEFAULT_URL
from ddpq.client.coercion import QuickGroup
from ddpq.client.runtime import ACTIVE_STATES, OPTIONS, client, echo, fail, print_json, run

__all__ = ["ACTIVE_STATES", "OPTIONS", "app", "client", "echo", "fail", "print_json", "run"]

app = typer.Typer(
    name="ddpq",
    help="A GPU job queue for a shared training server: disjoint GPUs and a rendezvous "
    "port for every PyTorch DDP job.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Options read without pydantic: see client.coercion.
    cls=QuickGroup,
)


@app.callback()
def global_options(
    url: Annotated[
        str | None,
        typer.Option(
            help="daemon URL, or unix:/path for its socket (default $DDPQ_URL, else the "
            f"daemon's socket on this machine, else {DEFAULT_URL})"
        ),
    ] = None,
    token: Annotated[str | None, typer.Option(help="API token (default $DDPQ_TOKEN)")] = None,
    debug: Annotated[bool, typer.Option(help="show tracebacks")] = False,
) -> None:
    OPTIONS.update(url=url, token=token, debug=debug)
