"""The client's option values read with the standard library, not with pydantic.

Typer (0.2x) converts every option's value, defaults included, with a pydantic
``TypeAdapter`` built the first time the option is used: `ddpq ls` would import pydantic
(~50 ms) and build a schema for each of its options, on every run, for `--user` to become
a ``str``. The client's options are of a few plain types (``bool``, ``int``, ``float``,
``str``, ``Path`` and lists of them); for those, ``use_stdlib_coercion`` gives Typer a converter of
its own in place of the adapter (Typer's ``RuntimeParam`` interface: ``coerce``), through
``QuickCommand`` and ``QuickGroup``: they do it for every parameter of theirs as the command
line is parsed (Typer's own ``--help`` included, which is made then). Options of any other
type, or a Typer without this mechanism, keep Typer's own conversion: slower, never wrong
(``tests/test_cli_speed.py`` notices the slowness).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, get_args, get_origin

from typer.core import TyperCommand, TyperGroup

_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def _int(value: str) -> int:
    if not _INT.fullmatch(value):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def _float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS |= {"0": False, "false": False, "no": False, "off": False}


def _bool(value: str) -> bool:
    try:
        return _BOOLS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{value!r} is not true or false") from None


CONVERTERS: dict[Any, Callable[[str], Any]] = {
    bool: _bool,
    int: _int,
    float: _float,
    str: str,
    Path: Path,
}


class StdlibCoercion:
    """Converts one option's values (each, for a repeatable one) as Typer's adapter would."""

    def __init__(self, convert: Callable[[str], Any], kind: type) -> None:
        self.convert = convert
        self.kind = kind

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        from typer import BadParameter

        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        if multi and isinstance(value, str):
            raise BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        try:
            if multi:
                return [in_range(self._one(item), param) for item in value]
            return in_range(self._one(value), param)
        except ValueError as exc:
            raise BadParameter(str(exc), ctx=ctx, param=param) from None

    def _one(self, value: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode(errors="surrogateescape")
        if isinstance(value, self.kind) and (self.kind is bool or not isinstance(value, bool)):
            return value  # a default, already of its type
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a valid {self.kind.__name__}")
        return self.convert(value)


def in_range(value: Any, param: Any) -> Any:
    """``value`` if it is within the option's declared bounds (``typer.Option(min=, max=)``,
    which Typer's adapter checks and this converter, standing in for it, must too)."""
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if low is not None and high is not None and not low <= value <= high:
        raise ValueError(f"{value} is not between {low} and {high}")
    if low is not None and value < low:
        raise ValueError(f"{value} is not {low} or more")
    if high is not None and value > high:
        raise ValueError(f"{value} is not {high} or less")
    return value


def converter_for(annotation: Any) -> StdlibCoercion | None:
    """The converter for an option of this (resolved, ``None``-less) type, if it is plain."""
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation) or (None,)
    convert = CONVERTERS.get(annotation)
    return StdlibCoercion(convert, annotation) if convert is not None else None


def use_stdlib_coercion(params: Iterable[Any]) -> None:
    """Give each of these Typer parameters of a plain type the standard library's converter."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        # Typer builds its adapter lazily into this attribute: None until first used.
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue
        coercion = converter_for(getattr(descriptor, "annotation", None))
        if coercion is not None:
            param._runtime_param = coercion


class QuickCommand(TyperCommand):
    """A Typer command whose plain options are read by ``StdlibCoercion``, and whose
    command line's unreadable or missing values are one line on stderr and exit 2, as the
    client's own checks say theirs (``runtime.fail``), not click's usage block."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)
        use_stdlib_coercion(params)
        return params

    def make_context(self, info_name: str | None, args: list[str], *a: Any, **k: Any) -> Any:
        from typer import BadParameter

        try:
            return self.parse_context(info_name, args, *a, **k)
        except BadParameter as exc:  # a value (or a missing one) of this command's
            from ddpq.client.runtime import fail

            fail(exc.format_message(), 2)

    def parse_context(self, info_name: str | None, args: list[str], *a: Any, **k: Any) -> Any:
        """The context of ``args`` as click makes it, its errors raised: for words that are
        not the command line's own (a script's ``#DDPQ`` lines, ``client.batch``), whose
        reader says where they came from."""
        return super().make_context(info_name, args, *a, **k)


class QuickGroup(TyperGroup):
    """A Typer group (the global options) whose plain options are read likewise, and
    whose unknown command is one line and exit 2, as a command's bad value is."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)
        use_stdlib_coercion(params)
        return params

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # click's usage error of this group (no such command), by its context: its
            # class lives in click or in Typer's copy of it, as the Typer installed has it.
            if getattr(exc, "ctx", None) is not ctx or not hasattr(exc, "format_message"):
                raise  # a command's own (its usage block says more), or no usage error
            from ddpq.client.runtime import fail

            fail(f"{exc.format_message()} (`ddpq --help` lists the commands)", 2)
