"""The ``ddpq`` command: the client's commands and the daemon's, on one command line.

The client (``ddpq.client``) and the daemon (``ddpq.daemon``) never import each other; this
is the one module that knows both. Both define their commands with Typer and import nothing
heavy until a command runs, so building this command line stays cheap.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from ddpq.client import cli as client
from ddpq.daemon import admin, commands


def command_line() -> TyperGroup:
    """The client's app (its global options, --url, --token, --debug, and its commands),
    with the daemon's commands first and ``admin`` last, as ``ddpq --help`` lists them."""
    cli = typer.main.get_command(client.app)  # with --install-completion, unlike get_group
    assert isinstance(cli, TyperGroup)
    daemon = typer.main.get_group(commands.app)
    cli.commands = {**daemon.commands, **cli.commands}
    cli.add_command(typer.main.get_group(admin.app), "admin")
    return cli


def main() -> None:
    client.run(command_line())
