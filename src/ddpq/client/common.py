"""What every client command shares: the ``ddpq`` Typer app and its global options, the
connection to the daemon, one-line failures, JSON output, and the error boundary (``run``).

Exit codes: 0 success; 1 the daemon refused the request; 2 bad usage or configuration; 3 the
daemon cannot be reached; 4 no such job; 5 not allowed (missing or wrong token, someone
else's job); 130 interrupted.

The command modules (``jobs``, ``submit``, ``devices``, ``usage``, ``sessions``, ``account``,
``tokens``, ``reservations``) import this module and nothing imports them but ``client.cli``,
which puts them on ``app``: this module imports no command module, so the package has no
import cycle (``tests/test_client_layout.py``). Like every module the hot commands load, it
imports neither httpx nor pydantic (``tests/test_cli_speed.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

from ddpq.client.api import DEFAULT_URL, DdpqError, JsonApi
from ddpq.client.coercion import QuickGroup
from ddpq.client.credentials import connection
from ddpq.core.states import TERMINAL, JobState

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

# The global options as given (``global_options``), for the command that runs.
OPTIONS: dict[str, Any] = {"url": None, "token": None, "debug": False}
# What `ls`, `watch` and `cancel --mine` mean by unfinished.
ACTIVE_STATES = [state.value for state in JobState if state not in TERMINAL]


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


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with ``message`` as one line on stderr and exit status ``code``."""
    typer.echo(f"ddpq: {message}", err=True)
    raise typer.Exit(code)


def client() -> JsonApi:
    """The daemon the global options (or the environment) name, with its token."""
    url, token = connection(OPTIONS["url"], OPTIONS["token"])  # a token only where it belongs
    return JsonApi(url, token)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def run(cli: Callable[[], object]) -> None:
    """Run the command line: a ``DdpqError`` is one line on stderr and its exit code."""
    try:
        cli()
    except DdpqError as exc:
        if OPTIONS["debug"]:
            raise
        typer.echo(f"ddpq: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        # JSON of another shape than the daemon's (a missing key, a list for an object,
        # a string for a number), met wherever a command reads it: one line, not a trace.
        if OPTIONS["debug"]:
            raise
        from ddpq.client.errors import unreadable_answer

        typer.echo(f"ddpq: {unreadable_answer(exc)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
