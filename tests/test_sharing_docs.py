"""docs/sharing.md and the README say only what ddpq does: every `ddpq` command line they
show in a ``sh`` block names a command that exists, and parses with that command's own
options and types; the values only the command's body reads (sizes, times, limits) are read
by the functions the command uses."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from ddpq.entry import command_line

ROOT = Path(__file__).resolve().parents[1]
# What ends one command on a shell line (the rest is another program's).
SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}
# What a command line refused before any command runs raises: Click's errors (Typer's own
# copy of Click: its usage errors and bad values, as ``parse_context`` leaves them raised)
# and the values the checks below read.
REFUSED = (typer.TyperException, ValueError)


def command_lines(text: str) -> list[list[str]]:
    """The arguments of each `ddpq` command in ``text``'s ``sh`` blocks (after `sudo` and
    any VAR=value words; continued lines joined)."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
                words.pop(0)
            if words[:1] == ["ddpq"]:
                end = next((i for i, w in enumerate(words) if w in SHELL_ENDS), len(words))
                found.append(words[1:end])
    return found


def check(args: list[str]) -> None:
    """Raises ``REFUSED`` where ``ddpq ARGS`` would be refused before doing anything."""
    group = command_line(["admin"])  # every command, the daemon's and admin's included
    # The groups' own options (--url, ...) are not shown in these docs: each group's
    # context is made bare, and its command found by Click's own lookup.
    ctx = typer.Context(group, info_name="ddpq")
    command: Any = group
    rest, path = without_global_options(group, args), list[str]()
    while isinstance(command, TyperGroup):
        if not rest:
            raise ValueError(f"`ddpq {' '.join(path)}` alone only prints its help")
        name, found, rest = command.resolve_command(ctx, rest)
        assert name is not None and found is not None  # it raises UsageError first
        command, path = found, [*path, name]
        if isinstance(command, TyperGroup):
            ctx = typer.Context(command, info_name=name, parent=ctx)
        else:
            # A client command's own make_context ends the process on a bad value.
            make = getattr(command, "parse_context", command.make_context)
            ctx = make(name, list(rest), parent=ctx)
    if path == ["submit"]:
        unknown_submit_options(rest)
    read_values(path, ctx.params)


def without_global_options(group: Any, args: list[str]) -> list[str]:
    """``args`` past the top group's own options (``ddpq --url URL login``), each checked
    to be one it has (a misspelt one is left to be refused as a command)."""
    options = {name: param for param in group.params for name in param.opts}
    rest = list(args)
    while rest and rest[0].split("=", 1)[0] in options:
        word = rest.pop(0)
        param = options[word.split("=", 1)[0]]
        if "=" not in word and not getattr(param, "is_flag", False):
            rest.pop(0)  # its value
    return rest


def unknown_submit_options(args: list[str]) -> None:
    """`submit` passes on what it does not know (the command, or a workload's options), so
    Click takes a misspelt option before `--` for the start of the command."""
    from ddpq.workloads.registry import WORKLOADS

    words = args[: args.index("--")] if "--" in args else args
    options = {o for p in command_line(["submit"]).commands["submit"].params for o in p.opts}
    for i, word in enumerate(words):
        known = word.split("=")[0] in options
        after_workload = any(w in WORKLOADS for w in words[:i])  # then it is the workload's
        if word.startswith("-") and not known and not after_workload:
            raise ValueError(f"submit has no option {word}")


def read_values(path: list[str], params: dict[str, object]) -> None:
    """What the commands about sharing check in their body, checked the same way."""
    if path == ["submit"]:
        from ddpq.client.sharing import submit_fields

        gpu_mem, gpu_share = params["gpu_mem"], params["gpu_share"]
        assert gpu_mem is None or isinstance(gpu_mem, str)
        assert gpu_share is None or isinstance(gpu_share, int)
        submit_fields(gpu_mem, gpu_share)
    if path == ["admin", "reserve"]:
        from ddpq.core.units import parse_when

        start, end = str(params["start"]), str(params["end"])
        begins = parse_when(start, time.time())
        if parse_when(end, time.time(), after=begins) <= begins:
            raise ValueError(f"--end {end} is not after --start {start}")
    if path == ["admin", "limit"]:
        for option in ("gpus", "jobs"):
            value = params[option]
            if value is not None and not (str(value).isdigit() or value == "none"):
                raise ValueError(f"--{option} {value!r} is neither a number nor none")


@pytest.mark.parametrize("doc", ["docs/sharing.md", "README.md"])
def test_every_command_shown_parses(doc: str) -> None:
    shown = command_lines((ROOT / doc).read_text())
    # The docs of this feature show its commands (and the parsing above found them).
    for expected in (["submit"], ["reservations"], ["admin", "limit"], ["admin", "reserve"]):
        assert any(args[: len(expected)] == expected for args in shown), expected
    assert any("--gpu-mem" in args for args in shown)
    for args in shown:
        try:
            check(args)
        except REFUSED as exc:
            pytest.fail(f"{doc}: `ddpq {shlex.join(args)}`: {exc}")


@pytest.mark.parametrize(
    "line",
    [
        "ddpq submitt -- python a.py",  # no such command
        "ddpq admin",  # a group alone
        "ddpq admin reservee --gpus 1",  # no such subcommand
        "ddpq submit --gpu-memory 5G -- python a.py",  # no such option
        "ddpq submit --gpu-mem -- python a.py",  # an option's value missing
        "ddpq submit --gpu-mem 5Q -- python a.py",  # not a size
        "ddpq submit --gpu-share 2 -- python a.py",  # a cap with no memory
        "ddpq submit --gpu-mem 5G --gpu-share two -- python a.py",  # not a number
        "ddpq reservations --gpus 2",  # an option of another command
        "ddpq admin reserve --gpus 4 --user alice --start soon --end +8h",  # not a time
        "ddpq admin reserve --gpus 4 --user alice --start now --end 2001-01-01",  # ends first
        "ddpq admin reserve --user alice --start now --end +1h",  # a required option missing
        "ddpq admin limit alice --gpus four",  # not a limit
    ],
)
def test_the_check_refuses_what_ddpq_would(line: str) -> None:
    (args,) = command_lines(f"```sh\n{line}   # a comment\n```\n")
    with pytest.raises(REFUSED):
        check(args)


def test_lines_are_found_as_a_shell_reads_them() -> None:
    text = "```sh\nDDPQ_URL=x sudo ddpq ls --user a | head  # ls\nddpq submit \\\n  -- a\n```"
    assert command_lines(text) == [["ls", "--user", "a"], ["submit", "--", "a"]]
