"""A Slurm batch script's ``#SBATCH`` lines (and ddpq's own ``#DDPQ`` lines) as ddpq's
``submit`` options, so `ddpq submit job.sh` takes a script written for ``sbatch`` as it is.

sbatch reads directives only from the script's first lines: from the line after ``#!`` up to
the first line that is neither blank nor a comment; a directive below a command is a comment
to it, and so it is here. Each line's words are split as a shell would (quotes kept
together), read with sbatch's own option rules (``core.sbatch``: short forms, attached
values, unambiguous prefixes) and translated to the ``submit`` option that means the same.
An option ddpq has no meaning for is left out with one warning, never silently.
``#DDPQ`` lines hold ``submit``'s own options, word for word.

The caller puts these options before the command line's, so the command line wins.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpq.core import dependency_text, sbatch

SBATCH = "#SBATCH"
DDPQ = "#DDPQ"
MAX_SCRIPT_BYTES = 1024 * 1024  # a batch script is a page or two: a bigger file is not one

# Slurm's time forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


class ScriptError(ValueError):
    """The script cannot be read as a batch script; the message says where and why."""


@dataclass
class Directives:
    """What a script's directives ask for, as ``submit``'s option words."""

    options: list[str] = field(default_factory=list)  # sbatch's, translated, then #DDPQ's
    warnings: list[str] = field(default_factory=list)  # one line per option left out
    interpreter: list[str] = field(default_factory=list)  # the #! line's words


def read(text: str) -> Directives:
    """The directives of a script whose text is ``text`` (``ScriptError`` if malformed)."""
    lines = text.splitlines()
    found = Directives()
    if lines and lines[0].startswith("#!"):
        found.interpreter = lines[0][2:].split()
        lines = lines[1:]
    sbatch_words: list[str] = []
    for number, line in enumerate(lines, start=2 if found.interpreter else 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break  # the first command: directives end here, as they do for sbatch
        for mark, into in ((SBATCH, sbatch_words), (DDPQ, found.options)):
            if stripped.startswith(mark) and stripped[len(mark) : len(mark) + 1] in " \t":
                into += _words(stripped[len(mark) :], number)
    ddpq_words, found.options = found.options, []
    try:
        options = sbatch.parse(sbatch_words)
    except sbatch.SbatchOptionError as exc:
        raise ScriptError(f"#SBATCH: {exc}") from None
    for option in options:
        translated = translate(option)
        if isinstance(translated, str):
            found.warnings.append(translated)
        else:
            found.options += translated
    found.options += ddpq_words
    return found


def _words(rest: str, number: int) -> list[str]:
    try:
        return shlex.split(rest, comments=True)
    except ValueError as exc:
        raise ScriptError(f"line {number}: {exc}") from None


def translate(option: sbatch.SbatchOption) -> list[str] | str:
    """``submit``'s words for one sbatch option, or the warning that says it is left out."""
    rule = _RULES.get(option.name)
    if rule is None:
        return f"#SBATCH {option.written}: not used by ddpq, left out"
    try:
        return rule(option.value or "")
    except ValueError as exc:
        raise ScriptError(f"#SBATCH {option.written}: {exc}") from None


def slurm_time(value: str) -> str:
    """Slurm's ``--time`` as a ddpq duration (``1-02:00:00`` -> ``93600s``); "" for none."""
    cleaned = value.strip().upper()
    if cleaned in ("UNLIMITED", "INFINITE"):
        return ""
    m = _TIME.fullmatch(cleaned)
    if m is None:
        raise ValueError(f"{value!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS)")
    days, first, second, third = (int(g) if g else None for g in m.groups())
    if days is None and third is None:  # MM or MM:SS
        seconds = (first or 0) * 60 + (second or 0)
    elif days is None:  # HH:MM:SS
        seconds = (first or 0) * 3600 + (second or 0) * 60 + (third or 0)
    else:  # D-HH[:MM[:SS]]
        seconds = days * 86400 + (first or 0) * 3600 + (second or 0) * 60 + (third or 0)
    if seconds <= 0:
        raise ValueError(f"{value!r} is no time at all")
    return f"{seconds}s"


def gpu_count(value: str, *, gres: bool) -> str:
    """The GPU count of ``--gres`` (``gpu``, ``gpu:N``, ``gpu:TYPE:N``; other generic
    resources refused) or ``--gpus`` (``N``, ``TYPE:N``). A type says nothing to ddpq yet."""
    counts = []
    for item in value.split(","):
        parts = item.strip().split(":")
        if gres:
            if parts[0] != "gpu":
                raise ValueError(f"{item!r}: ddpq leases GPUs only")
            parts = parts[1:]
        count = parts[-1] if parts else "1"
        if not count.isdigit():
            raise ValueError(f"{item!r}: the GPU count must be a number")
        counts.append(int(count))
    return str(sum(counts))


def dependency(value: str) -> list[str]:
    """``--dependency`` as ddpq's own, its job ids without what ddpq has no use for: an
    array task's ``_N`` (the whole sweep is waited on as ``sN`` only when written so) and a
    delay's ``+MINUTES``. The daemon reads the kinds (``core.dependency_text``)."""
    items = []
    for part in value.split(","):
        kind, sep, ids = part.partition(":")
        plain = [job_id.split("_")[0].split("+")[0] for job_id in ids.split(":")] if sep else []
        items.append(":".join([kind, *plain]))
    text = ",".join(items)
    dependency_text.parse(text)  # a kind or an id ddpq cannot take: refused with its line
    return ["--dependency", text]


def export(value: str) -> list[str]:
    """``--export``: ALL, NONE (or NIL), NAME,NAME..., with ``NAME=value`` items set."""
    names: list[str] = []
    sets: list[str] = []
    for item in value.split(","):
        (sets if "=" in item else names).append(item)
    words = []
    if names:
        upper = [n.upper() for n in names]
        words += ["--export", "NONE" if upper == ["NIL"] else ",".join(names)]
    for pair in sets:
        words += ["--env", pair]
    return words


def _array(value: str) -> list[str]:
    if "," in value:
        raise ValueError(f"{value!r}: ddpq takes one range, FIRST-LAST[:STEP][%K]")
    return ["--array", value]


def _mem(value: str) -> list[str]:
    """Slurm's ``--mem``: megabytes unless a unit (K, M, G, T) says otherwise."""
    cleaned = value.strip().upper()
    if not re.fullmatch(r"\d+[KMGT]?", cleaned) or int(cleaned.rstrip("KMGT")) == 0:
        raise ValueError(f"{value!r}: give a size, as 4G or 4000 (megabytes)")
    return ["--mem", cleaned if cleaned[-1].isalpha() else f"{cleaned}M"]


def _time(value: str) -> list[str]:
    limit = slurm_time(value)
    return ["--time-limit", limit] if limit else []


_RULES: dict[str, Callable[[str], list[str]]] = {
    "job-name": lambda v: ["--name", v],
    "gres": lambda v: ["--gpus", gpu_count(v, gres=True)],
    "gpus": lambda v: ["--gpus", gpu_count(v, gres=False)],
    "time": _time,
    "array": _array,
    "dependency": dependency,
    "chdir": lambda v: ["--cwd", v],
    "cpus-per-task": lambda v: ["--cpus", v],
    "mem": _mem,
    "export": export,
}
