"""The ``ddpq`` command: the client's commands and the daemon's, on one command line.

The client (``ddpq.client``) and the daemon (``ddpq.daemon``) never import each other; this
is the one module that knows both. Both define their commands with Typer and import nothing
heavy until a command runs, so building this command line stays cheap; a client command
(`ddpq submit`, `ddpq ls`, ...) does not even build the daemon's (~5 ms of every one).
`ddpq submit` and `ddpq ls` are first offered to ``client.quick``, which runs them without
importing Typer at all when it knows every word of theirs.
"""

from __future__ import annotations

import sys

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` at all (~3 ms
# of their start; see ddpq/__init__.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from typer.core import TyperGroup


def command_line(argv: Sequence[str] | None = None) -> TyperGroup:
    """The client's app (its global options, --url, --token, --debug, and its commands),
    with the daemon's commands first and ``admin`` last, as ``ddpq --help`` lists them.

    When ``argv`` (default: this process's arguments) runs one of the client's commands,
    the daemon's are left out: nothing would use them."""
    import typer
    from typer.core import TyperGroup

    from ddpq.client import cli as client

    cli = typer.main.get_command(client.app)  # with --install-completion, unlike get_group
    assert isinstance(cli, TyperGroup)
    if invoked(cli, sys.argv[1:] if argv is None else argv) in cli.commands:
        return cli
    from ddpq.daemon import admin, commands

    daemon = typer.main.get_group(commands.app)
    cli.commands = {**daemon.commands, **cli.commands}
    cli.add_command(typer.main.get_group(admin.app), "admin")
    return cli


def invoked(cli: TyperGroup, argv: Sequence[str]) -> str | None:
    """The command ``argv`` names after the global options, if it names one before any
    option the group does not know (`--help`, a typo: Typer then needs every command)."""
    takes_value = {name for p in cli.params if not getattr(p, "is_flag", False) for name in p.opts}
    flags = {name for p in cli.params for name in (*p.opts, *p.secondary_opts)} - takes_value
    args = iter(argv)
    for arg in args:
        if arg in takes_value:
            next(args, None)
        elif arg.partition("=")[0] in takes_value or arg in flags:
            continue
        else:
            return None if arg.startswith("-") else arg
    return None


def main() -> None:
    try:
        _main()
    except KeyboardInterrupt:
        # A Ctrl-C while the command is still importing, before ``client.runtime.run``
        # would answer it so: the shell's status for it, without a trace of the imports.
        sys.exit(130)


def _main() -> None:
    import gc

    # `ddpq submit` and `ddpq ls` end in a moment: the collector, which would run a dozen
    # times over what their imports allocate, is off while ``quick`` runs them.
    gc.disable()
    try:
        from ddpq.client import quick

        done = quick.run(sys.argv[1:])
    finally:
        gc.enable()
    if done:
        if getattr(sys.modules["__main__"], "main", None) is main:
            exit_at_once()  # the `ddpq` script or `python -m ddpq`, not a caller in Python
        return
    from ddpq.client import cli as client

    cli = command_line()
    if not starts_a_daemon(cli, sys.argv[1:]):
        client.run(cli)
        return
    from ddpq.daemon.heap import collections_held

    # The daemon's start allocates most of what it will ever hold (its imports, its app):
    # without the collector's passes over it until the daemon freezes it (daemon.heap).
    with collections_held():
        client.run(cli)


def starts_a_daemon(cli: TyperGroup, argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs ``serve``, ``server`` or ``worker``: their commands say so
    (``daemon.commands.DeclaredOptions``), and are on ``cli`` only when no client command
    is run."""
    command = cli.commands.get(invoked(cli, argv) or "")
    return bool(getattr(command, "starts_a_daemon", False))


def exit_at_once() -> None:
    """End the process now, with status 0, its output flushed: the interpreter's own exit
    would first take apart every module and object (~3 ms of a `ddpq ls`). Where a flush
    fails (a closed pipe), the interpreter's exit is left to say so, as it always has; and
    where something asked to run at exit (``atexit``: none of ddpq's, but a coverage run's
    or a sitecustomize's), the interpreter's exit runs it."""
    import atexit
    import os

    if atexit._ncallbacks():
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(0)
