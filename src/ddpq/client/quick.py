"""`ddpq submit` and `ddpq ls` without Typer: the command line's words read here, when
they are words this reader knows, and the command run straight away.

These two are typed in shell loops, where a command's whole process is what it costs:
Python's own start is ~15 ms, importing Typer (and the click it carries) ~60 ms more. So
``ddpq.entry`` asks ``run`` first, and builds the Typer command line only when ``run``
declines: anything this reader does not know exactly (``--help``, an option it lacks,
short options run together, a flag given a value, a number it cannot read, a batch
script, another command) is left to Typer, which reads it as it always did,
usage errors included. Declining costs nothing but the time; nothing has been done yet.

What this reader knows is ``SUBMIT`` and ``LS`` below, written out from the commands'
declarations (``client.submit``, ``client.jobs``); ``tests/test_cli_quick.py`` checks
that they say what Typer's own reading of those declarations says, and reads a set of
command lines both ways. An option added to `submit` or `ls` must be added here too (the
test says which); until it is, a command line that uses it goes through Typer.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence

# Not typing.TYPE_CHECKING: these commands import neither ``typing`` (~3 ms) nor
# ``pathlib`` (~3 ms, with urllib.parse's ipaddress) unless a word needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# How an option is read: its value's type, or a flag (FLAG: --x only; SWITCH: --x/--no-x).
INT, TEXT, PATH, LIST, FLAG, SWITCH = "int", "str", "path", "list", "flag", "switch"
_OFF = "off"  # the --no-x of a SWITCH

# (parameter, kind, default, the option's names): as the command declares them.
Spec = tuple[tuple[str, str, "Any", tuple[str, ...]], ...]

GLOBAL: Spec = (
    ("url", TEXT, None, ("--url",)),
    ("token", TEXT, None, ("--token",)),
    ("debug", SWITCH, False, ("--debug",)),
)
LS: Spec = (
    ("state", LIST, (), ("--state", "-s")),
    ("user", TEXT, None, ("--user", "-u")),
    ("mine", SWITCH, False, ("--mine",)),
    ("all_", FLAG, False, ("--all", "-a")),
    ("expand", SWITCH, False, ("--expand",)),
    ("limit", INT, None, ("--limit",)),
    ("as_json", FLAG, False, ("--json",)),
)
SUBMIT: Spec = (
    ("gpus", TEXT, "0", ("--gpus", "-g")),
    ("name", TEXT, None, ("--name", "-n")),
    ("priority", INT, 0, ("--priority",)),
    ("time_limit", TEXT, None, ("--time-limit",)),
    ("retries", INT, 0, ("--retries",)),
    ("after", LIST, (), ("--after",)),
    ("hold", SWITCH, False, ("--hold",)),
    ("env", LIST, (), ("--env", "-e")),
    ("export", TEXT, "ALL", ("--export",)),
    ("torchrun", SWITCH, False, ("--torchrun",)),
    ("cwd", PATH, None, ("--cwd",)),
    ("notify", TEXT, None, ("--notify",)),
    ("preemptible", SWITCH, False, ("--preemptible",)),
    ("preempt_signal", TEXT, None, ("--preempt-signal",)),
    ("sweep", LIST, (), ("--sweep",)),
    ("array", TEXT, None, ("--array",)),
    ("max_running", INT, None, ("--max-running",)),
    ("nodes", INT, None, ("--nodes",)),
    ("gpus_per_node", INT, None, ("--gpus-per-node",)),
    ("partition", TEXT, None, ("--partition",)),
    ("slurm_opt", LIST, (), ("--slurm-opt",)),
    ("as_json", FLAG, False, ("--json",)),
    ("gpu_mem", TEXT, None, ("--gpu-mem",)),
    ("gpu_share", INT, None, ("--gpu-share",)),
    ("gpu_link", TEXT, None, ("--gpu-link",)),
    ("gpu_type", TEXT, None, ("--gpu-type",)),
    ("cpus", INT, None, ("--cpus",)),
    ("mem", TEXT, None, ("--mem",)),
    ("dependency", TEXT, None, ("--dependency",)),
)

# What client.coercion takes as a whole number; compiled (re's cache) when one is given.
_INT = r"\s*[+-]?[0-9]+\s*"


class Declined(Exception):
    """Words this reader does not know: Typer's to read."""


def read(spec: Spec, words: Sequence[str], arguments: bool) -> tuple[dict[str, Any], list[str]]:
    """The parameters ``words`` give (the rest at their defaults) and the words that are
    no option (``arguments``: the command takes them), as click reads them: options
    anywhere before ``--``, everything after it an argument. Raises ``Declined``."""
    names: dict[str, tuple[str, str]] = {}
    for dest, kind, _, opts in spec:
        names.update((name, (dest, kind)) for name in opts)
        if kind == SWITCH:
            names.update((f"--no-{name[2:]}", (dest, _OFF)) for name in opts)
    params = {dest: default for dest, _, default, _ in spec}
    args: list[str] = []
    at = 0
    while at < len(words):
        word = words[at]
        at += 1
        if word == "--":
            args += words[at:]
            break
        if not word.startswith("-") or word == "-":
            args.append(word)
            continue
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name not in names:
            raise Declined(word)
        dest, kind = names[name]
        if kind in (FLAG, SWITCH, _OFF):
            if eq:
                raise Declined(word)
            params[dest] = kind != _OFF
            continue
        if not eq:
            if at == len(words):
                raise Declined(word)
            value = words[at]  # whatever it is, as click takes it (`--slurm-opt --qos=x`)
            at += 1
        params[dest] = [*params[dest], value] if kind == LIST else _value(kind, value)
    if args and not arguments:
        raise Declined(args[0])
    return params, args


def option_after_command(argv: Sequence[str]) -> tuple[str, str] | None:
    """The first of submit's own options that ``argv`` gives after the command's first word,
    with that word; None if none does (or the command follows ``--``, or is a built-in
    workload's name, which ddpq's options follow by design: `submit resnet18 --gpus 2`).

    Click reads a command's options anywhere before ``--``: `ddpq submit --gpus 1 python
    train.py --gpus 3` ran train.py with no argument, on 3 GPUs. Such an option is much
    more likely the command's own, so it is refused (``refuse_option_after_command``)."""
    from ddpq.client.submitting import is_workload

    at = next((i for i, word in enumerate(argv) if word == "submit"), len(argv)) + 1
    kinds = {name: kind for _, kind, _, opts in SUBMIT for name in opts}
    kinds.update((f"--no-{n[2:]}", FLAG) for n, kind in list(kinds.items()) if kind == SWITCH)
    command = None
    while at < len(argv):
        word = argv[at]
        at += 1
        if word == "--":
            return None
        name = word.partition("=")[0]
        if command is not None:
            if name in kinds:
                return word, command
        elif word.startswith("-") and word != "-":
            if name not in kinds:
                return None  # not submit's: its own error says so (`--url` belongs before)
            at += kinds[name] not in (FLAG, SWITCH) and "=" not in word
        elif is_workload(word):
            return None
        else:
            command = word
    return None


def refuse_option_after_command(argv: Sequence[str]) -> None:
    """Bad usage (exit 2) if ``option_after_command`` finds one: said before any request."""
    misplaced = option_after_command(argv)
    if misplaced is not None:
        from ddpq.client.format import sanitize
        from ddpq.client.runtime import fail
        from ddpq.client.submitting import near_workload

        word, command = (sanitize(w) for w in misplaced)
        near = near_workload(misplaced[1])
        hint = f" (or did you mean the workload {near}?)" if near else ""
        fail(
            f"{word}: after the command ({command}) it is read as ddpq's option, not the "
            f"command's; put the command after `--`: ddpq submit [OPTIONS] -- {command} ..." + hint,
            2,
        )


def _value(kind: str, value: str) -> Any:
    if kind == INT:
        if not re.fullmatch(_INT, value):
            raise Declined(value)
        return int(value)
    if kind == PATH:
        from pathlib import Path

        return Path(value)
    return value


def _ls(params: dict[str, Any], _: list[str]) -> Callable[[], None]:
    from ddpq.client import listing

    if params["limit"] is not None and params["limit"] < 0:
        raise Declined("--limit")  # Typer's range check says how
    return lambda: listing.ls(**params)


def _submit(params: dict[str, Any], args: list[str]) -> Callable[[], None]:
    if not args or args[0].startswith("-") or _may_be_batch_script(args[0]):
        # Nothing to run, a misspelt option, or a batch script (its directives are read
        # with Typer's parser, client.batch): client.submit says or does it.
        raise Declined(args[0] if args else "submit")
    from ddpq.client import submitting

    refuse_option_after_command(sys.argv[1:])
    return lambda: submitting.submit_with(args, params)


def _may_be_batch_script(first: str) -> bool:
    """Whether ``first`` names a file that ``client.batch`` may read as a batch script
    (``#!`` and a ``#SBATCH`` or ``#DDPQ`` line); one it cannot read, too."""
    if not os.path.isfile(first):
        return False
    try:
        with open(first, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return True
    return head.startswith(b"#!") and (b"#SBATCH" in head or b"#DDPQ" in head)


COMMANDS: dict[str, tuple[Spec, bool, Callable[..., Callable[[], None]]]] = {
    "ls": (LS, False, _ls),
    "submit": (SUBMIT, True, _submit),
}


def command(argv: Sequence[str]) -> Callable[[], None] | None:
    """What runs ``argv``'s command (the global options set), or None to leave it to Typer."""
    from ddpq.client.runtime import OPTIONS

    at = next((i for i, word in enumerate(argv) if word in COMMANDS), None)
    if at is None:
        return None
    spec, arguments, make = COMMANDS[argv[at]]
    try:
        given, loose = read(GLOBAL, argv[:at], False)
        params, args = read(spec, argv[at + 1 :], arguments)
        run = make(params, args)
    except Declined:
        return None
    if loose:
        return None
    OPTIONS.update(given)
    return run


def run(argv: Sequence[str]) -> bool:
    """Run ``argv`` here if this reader knows its words (True), else do nothing (False)."""
    from ddpq.client.runtime import run as boundary

    cli = command(argv)
    if cli is None:
        return False
    try:
        boundary(cli)
    except BrokenPipeError:  # `ddpq ls | head`: as click ends it, quietly
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes it at exit
        sys.exit(1)
    return True
