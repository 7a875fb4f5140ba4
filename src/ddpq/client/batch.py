"""`ddpq submit job.sh`: a batch script's directives (``core.batch_script``) as ``submit``'s
options, under the ones typed on the command line.

A script is the command's first word when it names a readable file that starts with
``#!`` and holds ``#SBATCH`` or ``#DDPQ`` lines; it then runs as sbatch runs it, through the
interpreter its ``#!`` line names (it need not be executable). The directives' words are
read by ``submit``'s own parser, so they mean exactly what the same options typed mean, and
an option typed on the command line wins over the script's (a list option, ``--env`` or
``--after``, gets both: the script's first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ddpq.client.common import fail
from ddpq.client.submitting import gpu_range_of, not_gpus
from ddpq.core import batch_script


@dataclass(frozen=True)
class Script:
    path: Path
    directives: batch_script.Directives

    def command(self, rest: list[str]) -> list[str]:
        """What the job runs: the script through its interpreter, with its arguments."""
        return [*self.directives.interpreter, str(self.path), *rest]


def script_of(first: str) -> Script | None:
    """The batch script ``first`` names, or None where it names none (a program, a
    workload, a script without directives: run as it is)."""
    path = Path(first)
    try:
        if not path.is_file() or path.stat().st_size > batch_script.MAX_SCRIPT_BYTES:
            return None
        with path.open("rb") as f:
            head = f.read(batch_script.MAX_SCRIPT_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!") or not (b"#SBATCH" in head or b"#DDPQ" in head):
        return None
    try:
        directives = batch_script.read(head.decode("utf-8", "replace"))
    except batch_script.ScriptError as exc:
        fail(f"{first}: {exc}", 2)
    if not directives.interpreter:
        fail(f"{first}: its #! line names no interpreter", 2)
    return Script(path.resolve(), directives)


def with_directives(ctx: typer.Context, script: Script) -> dict[str, Any]:
    """``submit``'s parameters: the command line's, then the script's where the command
    line left one at its default; warnings for what the script asks that ddpq leaves out."""
    for warning in script.directives.warnings:
        typer.echo(f"ddpq: warning: {script.path.name}: {warning}", err=True)
    try:
        # Click's errors raised (not made one line there): said below with the script's name.
        command: Any = ctx.command  # submit's: a coercion.QuickCommand
        theirs = command.parse_context(
            ctx.info_name, list(script.directives.options), parent=ctx.parent
        )
    except Exception as exc:  # click's usage errors (Typer vendors click: no one class)
        if not hasattr(exc, "format_message"):
            raise
        fail(f"{script.path.name}: {exc.format_message()}", 2)
    if theirs.args:
        from ddpq.client import submission
        from ddpq.client.format import sanitize

        first = theirs.args[0]
        known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        why = (
            submission.unknown_option(first, known).split(";")[0]
            if first.startswith("-")
            else f"#DDPQ lines hold options only, not {first!r}"
        )
        fail(sanitize(f"{script.path.name}: {why}"), 2)
    gpus = theirs.params.get("gpus")
    if typed(theirs, "gpus") and gpu_range_of(gpus) is None:  # as `submit_with` reads it
        fail(f"{script.path.name}: --gpus: {not_gpus(gpus)}", 2)
    params = dict(ctx.params)
    for name, value in theirs.params.items():
        if not typed(theirs, name):
            continue
        if isinstance(value, list) and isinstance(params.get(name), list):
            params[name] = [*value, *params[name]]
        elif not typed(ctx, name):
            params[name] = value
    if params.get("cwd") is not None and not os.path.isabs(str(params["cwd"])):
        params["cwd"] = Path(params["cwd"]).resolve()
    return params


def typed(ctx: Any, name: str) -> bool:
    """Whether ``name`` was given in ``ctx``'s words (not its default nor a variable).
    ``ctx``: a click context (Typer's own, or the one its vendored click makes)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"
