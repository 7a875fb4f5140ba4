"""Every option's declared bounds (``typer.Option(min=..., max=...)``) hold, on every command.

The client reads its plain options with a converter of its own (``client.coercion``) in
place of Typer's, which is what checked the bounds: until the converter checked them too,
`ddpq watch --interval 0` polled the daemon in a tight loop, `--interval -1` ended with a
misleading error, and `ddpq ls --limit -2` went to the daemon to be refused there. Each
command line is parsed as ``ddpq`` parses it (click's own reading, the converter inside),
for every bounded option found, so an option declared with a bound later is checked too;
a client command says the refusal in one line, as its own checks do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer

from ddpq import entry

# Typer's commands and options (on the click Typer carries: duck-typed here, not imported).
Command = Any
Option = Any


def commands(group: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Command]]:
    """Every command under ``group`` (the daemon's and admin's included), by its words."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def bounded() -> list[tuple[str, Command, Option]]:
    cli = entry.command_line(["serve"])  # a daemon's command: every command is built
    found = []
    for name, command in commands(cli):
        params = command.get_params(typer.Context(command))  # as the parser gets them
        for param in params:
            if param.param_type_name == "option" and (
                getattr(param, "min", None) is not None or getattr(param, "max", None) is not None
            ):
                found.append((name, command, param))
    return found


BOUNDED = bounded()


def test_the_bounded_options_are_found() -> None:
    names = {(name, param.opts[0]) for name, _, param in BOUNDED}
    assert {("watch", "--interval"), ("ls", "--limit"), ("history", "--limit")} <= names


def outside(param: Option) -> list[str]:
    """Values just past each of the option's bounds, as typed."""
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    step = 1 if isinstance(low if low is not None else high, int) else 0.05
    values = ([low - step] if low is not None else []) + ([high + step] if high is not None else [])
    return [str(v) for v in values]


def parse(command: Command, args: list[str]) -> dict[str, Any]:
    """The command's parameters read from ``args`` as ``ddpq`` reads them."""
    params: dict[str, Any] = command.make_context(command.name or "ddpq", args).params
    return params


def refusal(command: Command, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What reading ``args`` says when it refuses them: one line on stderr and exit 2 for
    the client's commands (``client.coercion.QuickCommand``), click's error for the rest."""
    try:
        parse(command, args)
    except typer.BadParameter as exc:
        return exc.format_message()
    except SystemExit as exc:
        said = capsys.readouterr().err
        assert exc.code == 2 and said.startswith("ddpq: ") and said.count("\n") == 1, said
        return said
    raise AssertionError(f"{args} taken")


@pytest.mark.parametrize(
    ("name", "command", "param"), BOUNDED, ids=[f"{n} {p.opts[0]}" for n, _, p in BOUNDED]
)
def test_a_value_past_a_bound_is_a_usage_error_and_a_bound_itself_is_taken(
    name: str, command: Command, param: Option, capsys: pytest.CaptureFixture[str]
) -> None:
    option = param.opts[0]
    for value in outside(param):
        said = refusal(command, [option, value], capsys)
        assert option in said and "Traceback" not in said, said
    for bound in (getattr(param, "min", None), getattr(param, "max", None)):
        if bound is None:
            continue
        try:
            assert parse(command, [option, str(bound)])[param.name] == bound
        except (typer.BadParameter, SystemExit) as exc:  # another value it needs is missing
            said = exc.format_message() if isinstance(exc, typer.BadParameter) else ""
            said += capsys.readouterr().err
            assert "Missing" in said and option not in said, said
