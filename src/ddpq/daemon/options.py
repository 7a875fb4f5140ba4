"""The settings as the daemon's commands take them, and as the docs' table lists them: both
made from the declarations (``ddpq.config_decl``), never written by hand.

Each setting declared ``Public`` is an option of the commands that read it (``Public.only``):
a switch is ``--NAME/--no-NAME`` (or ``--NAME`` alone), a whole number is an int, anything
else (a duration, a size, a range, a word) is text that the settings read. Every option
defaults to unset (None), so that a flag left out overrides no variable and no file.

``python -m ddpq.daemon.options`` prints the table that docs/admin.md holds
(``tests/test_settings_declared.py`` checks that they agree).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import NoneType
from typing import Annotated, get_args

import typer
from pydantic.fields import FieldInfo

from ddpq.config import Public, public_fields
from ddpq.config_values import Written
from ddpq.daemon.settings import ENV_PREFIX, written_default

COMMANDS = {None: "serve, server, worker", "api": "serve, server", "worker": "serve, worker"}


def reads(public: Public, *, api: bool, worker: bool) -> bool:
    """Whether a command that runs the API (and/or the worker) takes this setting."""
    return public.only is None or (api if public.only == "api" else worker)


def flag_of(public: Public) -> str:
    return "--" + public.name.replace("_", "-")


def option_type(info: FieldInfo) -> type:
    """What the command line converts a value to; the settings check it further."""
    if any(isinstance(m, Written) for m in info.metadata):
        return str  # "30s", "64M", "10%": read by the settings, as every source's are
    kinds = set(get_args(info.annotation)) - {NoneType} or {info.annotation}
    return next((t for t in (bool, int, Path) if kinds == {t}), str)


def option_help(public: Public, info: FieldInfo) -> str:
    """The option's help, with its default as people write it (a switch: as its flag)."""
    default = written_default(public, info)
    if isinstance(default, bool):
        if not public.negatable:
            return public.help  # --allow-root: off unless given, as Typer shows such a flag
        flag = flag_of(public)[2:]
        default = flag if default else f"no-{flag}"
    return public.help if default is None else f"{public.help}  [default: {default}]"


def parameters(*, api: bool, worker: bool) -> list[inspect.Parameter]:
    """One keyword parameter per setting the command reads, as Typer reads options."""
    found = []
    for public, info in public_fields().values():
        if not reads(public, api=api, worker=worker):
            continue
        kind = option_type(info)
        flag = flag_of(public)
        if kind is bool and public.negatable:
            flag = f"{flag}/--no-{flag[2:]}"
        option = typer.Option(flag, help=option_help(public, info))
        annotation = Annotated[kind | None, option]  # type: ignore[valid-type]
        found.append(
            inspect.Parameter(
                public.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    return found


def markdown_table() -> str:
    """The docs' table of settings, one row per setting, in the order declared."""
    rows = [
        "| flag / variable / TOML key | default | written as | read by | what it sets |",
        "|---|---|---|---|---|",
    ]
    for public, info in public_fields().values():
        flag = flag_of(public)
        if option_type(info) is bool and public.negatable:
            flag = f"{flag}`/`--no-{flag[2:]}"
        names = f"`{flag}` / `{ENV_PREFIX}{public.name.upper()}` / `{public.name}`"
        default = written_default(public, info)
        if default is None or default == public.default_is:
            shown = default or "—"  # a rule in words, or none
        else:
            shown = f"`{str(default).lower() if isinstance(default, bool) else default}`"
        cells = (names, shown, _written_as(info), COMMANDS[public.only], public.help)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _written_as(info: FieldInfo) -> str:
    written = next((m for m in info.metadata if isinstance(m, Written)), None)
    if written is not None:
        return written.unit + (f"; `{written.none}`: no limit" if written.none else "")
    kind = option_type(info)
    return {bool: "true or false", int: "whole number", Path: "path"}.get(kind, "text")


def main(argv: list[str]) -> int:
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
