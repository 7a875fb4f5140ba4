"""The client's commands of the ``ddpq`` command line (Typer + Rich), put together.

Each group of commands has its module: ``submit``; ``jobs`` (ls, show, logs, cancel, hold,
release, preempt); ``edits`` (update, restart); ``devices`` (gpus, watch); ``usage``;
``history``; ``sessions`` (shell, attach); ``account`` (login, whoami, and ``tokens``:
`ddpq token ...`); ``reservations``. What they share (the app and its global options, the
connection, one-line failures, the error boundary ``run``) is ``client.common``, which
imports none of them. This module only puts them on ``app``, in the order `ddpq --help`
lists them; ``ddpq.entry`` adds the daemon's commands (``ddpq.daemon``), which this package
never imports.

Quick as the shell: the commands speak to the daemon through ``JsonApi`` (the standard
library's HTTP, the answers as plain JSON) and draw from that JSON, so none imports httpx or
pydantic; Rich is imported by the commands that draw, and each imports what it needs when
it runs (`python -X importtime -m ddpq ls` shows what is left; bench/cli_latency.py times it).
"""

from __future__ import annotations

import typer

from ddpq.client import (
    account,
    devices,
    edits,
    history,
    jobs,
    reservations,
    sessions,
    submit,
    usage,
)
from ddpq.client.coercion import QuickCommand
from ddpq.client.common import app, run

__all__ = ["app", "run"]


def version() -> None:
    """Print ddpq's version."""
    from ddpq import __version__

    typer.echo(__version__)


submit.register(app)
jobs.register(app)  # ls, show, logs, cancel, hold, release, preempt
devices.register(app)  # gpus, watch
usage.register(app)
history.register(app)
sessions.register(app)  # shell, attach
account.register(app)  # login, whoami, token
app.command("version", cls=QuickCommand)(version)
reservations.register(app)
edits.register(app)  # update, restart
