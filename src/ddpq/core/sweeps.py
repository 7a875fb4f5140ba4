"""Sweeps and arrays as pure data: parameters and array expressions in, members out.

A sweep queues one job per combination of its parameters (the cartesian product, the
first parameter varying slowest, as ``itertools.product``), or one per index of an array
expression in Slurm's form (``0-99``, ``1,3,5``, ``0-99:2``, ``0-99%10``). Everything a
client sends is bounded here before anything is built: a product of 10^9 is refused by
multiplying lengths, never by expanding it.

A command's arguments carry ``{name}`` placeholders for the parameters and ``{index}`` for
the member's index; ``{{name}}`` is a literal ``{name}``, and ``${name}`` (a shell's) is
left as it is, so ``sh -c 'echo ${HOME}'`` needs no escaping.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What one sweep may hold: a lab's largest sweeps are hundreds; 10,000 rows is still one
# quick transaction, and more is a mistake or an attack.
MAX_MEMBERS = 10_000
MAX_PARAMS = 32
MAX_VALUE_CHARS = 1024
MAX_ARRAY_CHARS = 1024
# Slurm's MaxArraySize is configurable up to 4,000,001; an index is stored as SQLite's int.
MAX_ARRAY_INDEX = 2**31 - 1
INDEX = "index"  # the placeholder of a member's index, so no parameter may be called that

PARAM_NAME_RULE = (
    f"must be 1-64 letters, digits, '_' or '-', starting with a letter or '_' (and not {INDEX!r})"
)
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")
# {{name}} (a literal), or {name} not preceded by '$' (a shell's ${name} is not ours).
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_-]*)\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_-]*)\}")
# The job name's characters (schemas.NAME_PATTERN): what a member's name is made of.
_NAME_JUNK = re.compile(r"[^A-Za-z0-9._-]+")
NAME_MAX = 64
# Room left for "-<index>" after the base name, whatever the index.
BASE_MAX = NAME_MAX - 1 - len(str(MAX_ARRAY_INDEX))


class SweepError(ValueError):
    """A sweep that cannot be built; the message says why, naming what is wrong."""


@dataclass(frozen=True)
class ArraySpec:
    """An array expression, parsed: its indices in ascending order and its ``%K`` cap."""

    indices: tuple[int, ...]
    max_running: int | None


@dataclass(frozen=True)
class Member:
    """One job of a sweep: its index and its parameters' values."""

    index: int
    params: dict[str, str]


def _count(part: str) -> tuple[int, int, int]:
    """``(first, last, step)`` of one comma-separated piece of an array expression."""
    spec, _, step_text = part.partition(":")
    first_text, dash, last_text = spec.partition("-")
    numbers = [first_text, last_text] if dash else [first_text]
    if step_text and not dash:
        raise SweepError(f"array: {part!r} has a step but is not a range (write 0-9:2)")
    for text in [*numbers, *([step_text] if step_text or ":" in part else [])]:
        if not text.isdigit() or not text.isascii():
            raise SweepError(f"array: {part!r} is not an index, a range a-b or a range a-b:step")
        if len(text) > 10:  # before int(): a 4,300-digit number is slow to convert
            raise SweepError(f"array: {part!r} has an index above {MAX_ARRAY_INDEX}")
    first = int(first_text)
    last = int(last_text) if dash else first
    step = int(step_text) if step_text else 1
    if max(first, last) > MAX_ARRAY_INDEX:
        raise SweepError(f"array: {part!r} has an index above {MAX_ARRAY_INDEX}")
    if last < first:
        raise SweepError(f"array: {part!r} is a range that ends before it starts")
    if step < 1:
        raise SweepError(f"array: {part!r} has a step of 0")
    return first, last, step


def parse_array(expr: str) -> ArraySpec:
    """Slurm's ``--array``: comma-separated indices and ranges (``a-b``, ``a-b:step``),
    optionally ending in ``%K``, at most K members running at once.

    Refused with a reason: anything else, an empty or reversed range, a step of 0, more
    than ``MAX_MEMBERS`` indices (counted before any is listed), ``%0``.
    """
    if not expr:
        raise SweepError("array: the expression is empty")
    if len(expr) > MAX_ARRAY_CHARS:
        raise SweepError(f"array: longer than {MAX_ARRAY_CHARS} characters")
    body, percent, cap_text = expr.partition("%")
    cap: int | None = None
    if percent:
        if not cap_text.isdigit() or not cap_text.isascii() or len(cap_text) > 6:
            raise SweepError(f"array: %{cap_text} is not a count of members (write %10)")
        cap = int(cap_text)
        if cap < 1:
            raise SweepError("array: %0 would never run a member; give at least %1")
    parts = body.split(",")
    ranges = [_count(part) for part in parts]
    listed = sum((last - first) // step + 1 for first, last, step in ranges)
    if listed > MAX_MEMBERS:
        raise SweepError(f"array: lists {listed} indices; a sweep has at most {MAX_MEMBERS}")
    # Bounded by now: listing them costs at most MAX_MEMBERS steps. Repeats count once, as
    # Slurm's bitmap of indices has it.
    indices = sorted({i for first, last, step in ranges for i in range(first, last + 1, step)})
    return ArraySpec(tuple(indices), cap)


def check_params(params: Mapping[str, Sequence[str]]) -> int:
    """Check every parameter's name and values; return how many combinations they make.

    The product is computed from the lengths alone, so a hostile request is refused
    without expanding it.
    """
    if len(params) > MAX_PARAMS:
        raise SweepError(f"params: more than {MAX_PARAMS} parameters")
    size = 1
    for name, values in params.items():
        if not _PARAM_NAME.match(name) or name == INDEX:
            raise SweepError(f"params: {name!r} {PARAM_NAME_RULE}")
        if not values:
            raise SweepError(f"params.{name}: give at least one value")
        seen: set[str] = set()
        for value in values:
            if len(value) > MAX_VALUE_CHARS:
                raise SweepError(f"params.{name}: a value is longer than {MAX_VALUE_CHARS}")
            if not value.strip():  # `--sweep lr=` or `lr=0.1,,0.2`: a slip, never a value
                raise SweepError(f"params.{name}: an empty value; give NAME=VALUE,VALUE,...")
            if "\x00" in value:
                raise SweepError(f"params.{name}: a value contains a NUL byte")
            if value in seen:
                raise SweepError(f"params.{name}: {value!r} is listed twice")
            seen.add(value)
        size *= len(values)
        if size > MAX_MEMBERS:
            total = math.prod(len(v) for v in params.values())
            raise SweepError(
                f"params: {total} combinations; a sweep has at most {MAX_MEMBERS} members"
            )
    return size


def members(params: Mapping[str, Sequence[str]], array: ArraySpec | None = None) -> list[Member]:
    """The sweep's members: one per array index, or one per combination of the parameters
    (indexed 0, 1, ... in product order). Check the parameters first (``check_params``)."""
    if array is not None:
        return [Member(i, {}) for i in array.indices]
    names = list(params)
    return [
        Member(i, dict(zip(names, combo, strict=True)))
        for i, combo in enumerate(itertools.product(*(params[n] for n in names)))
    ]


def placeholders(args: Sequence[str]) -> set[str]:
    """The names of the ``{name}`` placeholders in ``args`` (not the escaped ones)."""
    return set(placeholder_counts(args))


def placeholder_counts(args: Sequence[str]) -> Counter[str]:
    """How often each ``{name}`` placeholder occurs in ``args``: each occurrence is filled
    with the whole value, so a long value used many times makes a long command."""
    return Counter(m.group(2) for arg in args for m in _PLACEHOLDER.finditer(arg) if m.group(2))


def filled_bytes(args: Sequence[str], params: Mapping[str, Sequence[str]]) -> int:
    """A bound on the length of ``args`` filled with any member's values (the longest of
    each parameter wherever its placeholder is; an array's index as its largest)."""
    longest = {name: max(map(len, values), default=0) for name, values in params.items()}
    longest[INDEX] = len(str(MAX_ARRAY_INDEX))
    counts = placeholder_counts(args)
    return sum(map(len, args)) + sum(n * longest.get(name, 0) for name, n in counts.items())


def check_placeholders(args: Sequence[str], names: Sequence[str]) -> None:
    """Every placeholder must name a parameter (or ``index``), and every parameter must be
    used: a parameter used nowhere would queue the same command many times."""
    used = placeholders(args)
    unknown = sorted(used - {*names, INDEX})
    if unknown:
        raise SweepError(f"template.command: {{{unknown[0]}}} names no parameter")
    unused = [n for n in names if n not in used]
    if unused:
        raise SweepError(
            f"params.{unused[0]}: used nowhere in the command (put {{{unused[0]}}} in it)"
        )


def fill(args: Sequence[str], member: Member) -> list[str]:
    """``args`` with each placeholder replaced by the member's value (and ``{{x}}`` by
    ``{x}``). Check them first (``check_placeholders``): a name it lacks stays as it is."""
    values = {**member.params, INDEX: str(member.index)}

    def replace(m: re.Match[str]) -> str:
        if m.group(1):
            return "{" + m.group(1) + "}"
        return values.get(m.group(2), m.group(0))

    return [_PLACEHOLDER.sub(replace, arg) for arg in args]


def workload_args(member: Member) -> list[str]:
    """A built-in workload's options for the member: ``--lr 0.05`` for each parameter."""
    return [arg for name, value in member.params.items() for arg in (f"--{name}", value)]


def option_names(args: Sequence[str]) -> set[str]:
    """The long options ``args`` already gives (``--lr 1`` and ``--lr=1`` both name lr)."""
    return {a[2:].partition("=")[0] for a in args if a.startswith("--") and len(a) > 2}


def _clean(text: str) -> str:
    return _NAME_JUNK.sub("-", text).strip("-")


def member_name(base: str, member: Member) -> str:
    """``<base>-<index>``, then as many ``-<name><value>`` parts as fit in a job's name.

    ``base`` must already be a valid job name (the template's, or one derived from its
    program); the result always is one: the index always fits, the parts are cut.
    """
    name = f"{base[:BASE_MAX].rstrip('.-_') or 'sweep'}-{member.index}"
    for key, value in member.params.items():
        part = "-" + _clean(f"{key}{value}")
        if part == "-" or len(name) + len(part) > NAME_MAX:
            break
        name += part
    return name


# The job contract's sweep variables (the job's environment, beside DDPQ_JOB_ID).
SWEEP_ID_ENV = "DDPQ_SWEEP_ID"
SWEEP_INDEX_ENV = "DDPQ_SWEEP_INDEX"
SWEEP_PARAMS_ENV = "DDPQ_SWEEP_PARAMS"
# Written into a member's stored environment by the server alone (a submitter's DDPQ_*
# variables are refused at the door), so they survive the filter of exported variables.
MEMBER_ENV_NAMES = frozenset({SWEEP_ID_ENV, SWEEP_INDEX_ENV, SWEEP_PARAMS_ENV})


def member_env(sweep_id: int, member: Member) -> dict[str, str]:
    """What a member finds in its environment: the sweep, its index, its parameters as a
    JSON object (ASCII, so any value survives any locale)."""
    return {
        SWEEP_ID_ENV: str(sweep_id),
        SWEEP_INDEX_ENV: str(member.index),
        SWEEP_PARAMS_ENV: json.dumps(member.params, separators=(",", ":")),
    }
