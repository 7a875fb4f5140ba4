"""What every client command shares that needs no Typer: the global options as given, the
connection to the daemon, one-line failures, JSON output, and the error boundary (``run``).

``client.common`` (the Typer app) re-exports these; `ddpq ls` and `ddpq submit`, which
``client.quick`` runs without Typer when it can read their words itself, use them from
here, so that Typer (~60 ms to import) is not loaded for them at all.

Exit codes: 0 success; 1 the daemon refused the request; 2 bad usage or configuration; 3 the
daemon cannot be reached; 4 no such job; 5 not allowed (missing or wrong token, someone
else's job); 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from ddpq.client.api import DdpqError, JsonApi
from ddpq.client.credentials import connection
from ddpq.core.states import TERMINAL, JobState

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# The global options as given (``common.global_options``), for the command that runs.
OPTIONS: dict[str, Any] = {"url": None, "token": None, "debug": False}
# What `ls`, `watch` and `cancel --mine` mean by unfinished.
ACTIVE_STATES = [state.value for state in JobState if state not in TERMINAL]


def echo(line: str, err: bool = False) -> None:
    """One line on stdout (stderr with ``err``), flushed: what ``typer.echo`` does here."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{line}\n")
    stream.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with ``message`` as one line on stderr and exit status ``code``."""
    echo(f"ddpq: {message}", err=True)
    # SystemExit, not Typer's Exit: the same status under Typer (click lets it through),
    # and no Typer to import on the quick path.
    raise SystemExit(code)


def client() -> JsonApi:
    """The daemon the global options (or the environment) name, with its token."""
    url, token = connection(OPTIONS["url"], OPTIONS["token"])  # a token only where it belongs
    return JsonApi(url, token)


def print_json(data: Any) -> None:
    echo(json.dumps(data, indent=2, default=str))


def run(cli: Callable[[], object]) -> None:
    """Run the command line: a ``DdpqError`` is one line on stderr and its exit code."""
    try:
        cli()
    except DdpqError as exc:
        if OPTIONS["debug"]:
            raise
        echo(f"ddpq: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        # JSON of another shape than the daemon's (a missing key, a list for an object,
        # a string for a number), met wherever a command reads it: one line, not a trace.
        if OPTIONS["debug"]:
            raise
        from ddpq.client.errors import unreadable_answer

        echo(f"ddpq: {unreadable_answer(exc)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
