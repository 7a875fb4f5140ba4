"""What a Slurm site accepts from ddpq's users: partition names and extra ``#SBATCH`` options.

Shared by the daemon's settings (``--slurm-partition``, ``--slurm-options``,
``--slurm-user-options``), the API (a job's own ``partition`` and ``slurm_options``) and
the batch script, which checks a job's options again: one definition of which options
ddpq keeps for itself and which its users may give.

An option is judged as sbatch will read it (``core.sbatch``: short forms, attached
values, prefixes), and written into the script in its one unambiguous spelling,
``--name=value``: what ddpq checked is what sbatch reads.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Iterable

from ddpq.core.sbatch import LONG_OPTIONS, SbatchOption, SbatchOptionError, canonical, parse

# Options that ddpq writes into every batch script itself or that a setting holds (the
# partition, the account); those that change what ddpq leased (GPUs, nodes, tasks, time)
# or where and when the job runs as ddpq tracks it (another cluster, a begin time, a
# dependency, an array, its output, its environment, its account). Neither the admin's
# --slurm-options nor --slurm-user-options may name them.
OWNED_OPTIONS = frozenset(
    {
        *("job-name", "comment", "output", "error", "input", "open-mode", "chdir"),
        *("requeue", "no-requeue", "nodes", "ntasks-per-node", "signal", "gres", "time"),
        *("time-min", "begin", "deadline", "partition", "account", "hold", "parsable"),
        *("gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "tres-per-task"),
        *("ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-socket"),
        *("ntasks-per-tres", "nodelist", "nodefile", "array", "dependency"),
        *("kill-on-invalid-dep", "export", "export-file", "get-user-env", "uid", "gid"),
        *("wrap", "test-only", "wait", "clusters", "cluster", "cluster-constraint"),
        *("help", "usage", "version", "autocomplete", "quiet", "verbose", "ignore-pbs"),
        "external",
    }
)
# What a job's own --slurm-opt may set unless the admin says otherwise: where it may run
# (features, nodes left out, a reservation), CPUs, memory and local disk beside its GPUs,
# licenses, mail from Slurm, and a QOS (Slurm allows a user only the QOSs of their own
# association, so it grants nothing sbatch would not; an admin who pins the QOS of every
# job with --slurm-options pins it for users too).
DEFAULT_USER_OPTIONS = (
    *("constraint", "prefer", "exclude", "reservation", "qos", "cpus-per-gpu"),
    *("cpus-per-task", "mem", "mem-per-cpu", "mem-per-gpu", "tmp", "hint", "gres-flags"),
    *("licenses", "mail-type", "mail-user"),
)
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+,-]{1,128}\Z")
# A plugin's option (SPANK), named by the admin in full.
_PLUGIN_OPTION = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")
# sbatch reads quotes, backslashes and '#' (a comment) inside #SBATCH lines.
_SBATCH_SYNTAX = frozenset("'\"\\#")


class SlurmOptionError(ValueError):
    """An option ddpq will not write into a batch script; the message says why, in one line."""


def option_words(text: str) -> list[str]:
    """The words of one option as sbatch splits an ``#SBATCH`` line, or why not: one line of
    printable ASCII without the characters sbatch would read as its own syntax."""
    if "\n" in text or "\r" in text:
        raise SlurmOptionError("must be one line")
    if not all(" " <= c <= "~" for c in text):
        raise SlurmOptionError("must be printable ASCII")
    if _SBATCH_SYNTAX.intersection(text):
        raise SlurmOptionError("may hold no quote, '\\' or '#' (sbatch reads them itself)")
    words = text.split(" ")
    return [w for w in words if w]


def one_option(text: str, extra: Collection[str] = ()) -> SbatchOption:
    """The option that ``text`` (one ``--slurm-opt``) is to sbatch: exactly one."""
    words = option_words(text)
    if not words:
        raise SlurmOptionError("is empty")
    try:
        options = parse(words, extra)
    except SbatchOptionError as exc:
        raise SlurmOptionError(str(exc)) from None
    if len(options) != 1:
        shown = ", ".join(f"--{o.name}" for o in options)
        raise SlurmOptionError(f"is {len(options)} options to sbatch ({shown}): one each")
    return options[0]


def user_options(
    texts: Iterable[str], allowed: Collection[str], daemon_lines: Iterable[str] = ()
) -> tuple[str, ...]:
    """A job's own options as the script will hold them (``--name=value``), each one an
    option users may set (``allowed``: the setting ``slurm_user_options``) that the daemon's
    own options (``daemon_lines``) do not set; else ``SlurmOptionError`` naming it."""
    plugin = [name for name in allowed if name not in LONG_OPTIONS]
    daemon = {one_option(line, plugin).name for line in daemon_lines}
    lines = []
    for text in texts:
        try:
            option = one_option(text, plugin)
        except SlurmOptionError as exc:
            raise SlurmOptionError(f"{text[:64]!r}: {exc}") from None
        said = f"{text[:64]!r} is --{option.name} to sbatch"
        if option.name in OWNED_OPTIONS:
            raise SlurmOptionError(f"{said}, which ddpq sets itself")
        if option.name in daemon:
            raise SlurmOptionError(f"{said}, which the daemon's --slurm-options sets")
        if option.name not in allowed:
            shown = ", ".join(f"--{n}" for n in sorted(allowed)) or "none"
            raise SlurmOptionError(
                f"{said}, which users may not set here (they may: {shown}; "
                "the admin's slurm_user_options)"
            )
        lines.append(option.line())
    return tuple(lines)


def daemon_options(words: Iterable[str]) -> tuple[str, ...]:
    """The admin's ``--slurm-options`` (words of an argument vector) as script lines; an
    option that ddpq owns is refused as a user's is."""
    checked: list[str] = []
    for word in words:
        try:
            checked += option_words(word)
        except SlurmOptionError as exc:
            raise SlurmOptionError(f"{word[:64]!r}: {exc}") from None
    try:
        options = parse(checked)
    except SbatchOptionError as exc:
        raise SlurmOptionError(str(exc)) from None
    for option in options:
        if option.name in OWNED_OPTIONS:
            raise SlurmOptionError(
                f"{option.written} is --{option.name} to sbatch, which ddpq sets itself "
                "(or a setting of its own does)"
            )
    return tuple(o.line() for o in options)


def user_option_name(written: str) -> str:
    """One name of the setting ``slurm_user_options`` as it is kept: sbatch's long name
    (``--qos`` and ``qos`` are ``qos``), or a plugin's option named in full."""
    name = written.removeprefix("--")
    if name in LONG_OPTIONS:
        name = canonical(name)
    elif not _PLUGIN_OPTION.match(name):
        raise SlurmOptionError(f"{written!r} is not the long name of an sbatch option")
    elif any(known.startswith(name) for known in LONG_OPTIONS):
        # Without the plugin, sbatch would read it as the option it abbreviates.
        raise SlurmOptionError(f"{written!r}: name sbatch options in full")
    if name in OWNED_OPTIONS:
        raise SlurmOptionError(f"--{name} is ddpq's own: users may never set it")
    return name


def daemon_options_setting(value: object) -> object:
    """The setting ``slurm_options``: a list (TOML), or one string of them (a flag, a
    variable) split as a shell splits words: "--qos=high --constraint='a100|h100'"."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split into options: {exc}") from None
    if isinstance(value, list | tuple) and all(isinstance(w, str) for w in value):
        return daemon_options(value)
    return value


def user_options_setting(value: object) -> object:
    """The setting ``slurm_user_options``: a list (TOML), or one string of names separated
    by commas or spaces ("constraint,qos,mem"); "none" or nothing: users may set none."""
    if isinstance(value, str):
        value = [] if value.strip() == "none" else re.split(r"[\s,]+", value.strip())
    if isinstance(value, list | tuple) and all(isinstance(n, str) for n in value):
        return tuple(dict.fromkeys(user_option_name(n) for n in value if n))
    return value
