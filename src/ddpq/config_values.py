"""A setting's values as people write them, and what a setting's declaration says about it.

Each reader takes what a flag, a variable (always a string) or a TOML value may hold, and
raises ValueError with a message for people; pydantic then checks the type. ``Written`` marks
a type whose values are written in a unit ("30s", "64M", "10%"): the command line takes them
as text, and help and the docs write defaults back in that unit. ``Public`` makes a field of
``ddpq.config.Settings`` a setting people set (a flag, a ``DDPQ_*`` variable, a TOML key).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from ddpq.core import hostres, notify, quota, slurm
from ddpq.core.names import state_folder
from ddpq.core.units import human_duration, human_size, parse_duration, parse_size

DEFAULT_PORT_RANGE = (29600, 29999)
_DEFAULT_RANGE_TEXT = "{}-{}".format(*DEFAULT_PORT_RANGE)
MIN_LOG_CAP = 4096


class ConfigError(ValueError):
    """A setting that ddpq refuses to start with; the message says why."""


@dataclass(frozen=True)
class Public:
    """A setting people set: the flag ``--NAME`` (``_`` written ``-``), the variable
    ``DDPQ_NAME``, the TOML key ``NAME``. ``help`` is the flag's help and the docs' line.
    ``only``: the commands of one half read it (``api``: serve and server; ``worker``: serve
    and worker); otherwise all three do. ``negatable``: a switch also has ``--no-NAME``.
    ``default_is``: the default in words, where it is a rule rather than a value."""

    name: str
    help: str
    only: Literal["api", "worker"] | None = None
    negatable: bool = True
    default_is: str | None = None


@dataclass(frozen=True)
class Written:
    """Values written in a unit: ``unit`` names it for the docs, ``show`` writes a value
    back as people would; ``none`` is the word that lifts the limit (None), if any."""

    unit: str
    show: Callable[[Any], str]
    none: str | None = None

    def or_word(self, word: str) -> Written:
        return replace(self, none=word)


def _share(value: float) -> str:
    return f"{value:.0%}"


DURATION = Written("duration (30s, 2m, 1h30m, 1d)", human_duration)
SIZE = Written("size (4096, 512K, 64M, 1G)", human_size)
SHARE = Written("fraction (0.1) or percentage (10%)", _share)
RANGE = Written("LOW-HIGH", lambda ports: "{}-{}".format(*ports))
NAMES = Written("names, comma-separated", ",".join)
FOLDER_LIMIT = Written(
    "size (10G), share of the disk (50%) or unlimited",
    lambda v: human_size(v) if isinstance(v, int) else _share(v),
)


def default_home() -> Path:
    """Per-user state folder: $DDPQ_HOME, else $XDG_STATE_HOME/ddpq, else ~/.local/state/ddpq."""
    return Path(state_folder(os.environ, str(Path.home()))).expanduser()


def absolute(path: Path) -> Path:
    return path.expanduser().resolve()


def parse_port_range(text: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ConfigError(
            f"port range {text!r} is not of the form LOW-HIGH, e.g. {_DEFAULT_RANGE_TEXT}"
        ) from None
    return _check_ports((lo, hi))


def read_ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    with open(path) as f:
        lo, hi = f.read().split()
    return int(lo), int(hi)


def check_port_range(ports: tuple[int, int], ephemeral: tuple[int, int]) -> None:
    """Refuse a range that overlaps the kernel's ephemeral ports.

    The kernel hands those out to any outgoing connection, so a rendezvous port
    there can be taken between ddpq's check and torchrun's bind.
    """
    lo, hi = ports
    elo, ehi = ephemeral
    if lo <= ehi and elo <= hi:
        raise ConfigError(
            f"port range {lo}-{hi} overlaps the kernel's ephemeral range {elo}-{ehi} "
            f"(/proc/sys/net/ipv4/ip_local_port_range); choose ports outside it, "
            f"e.g. --port-range {_DEFAULT_RANGE_TEXT}"
        )


def _not_a_bool(value: object) -> object:
    # A TOML `true` is no number of seconds or bytes, though bool is an int to Python.
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a string, not {str(value).lower()}")
    return value


def _duration(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value, allow_zero=True)  # a grace of 0: SIGKILL at once
    return _not_a_bool(value)


def _size(value: object) -> object:
    return parse_size(value) if isinstance(value, str) else _not_a_bool(value)


def _or_never(written: Written, read: Callable[[str], object]) -> Callable[[object], object]:
    """A limit that may be lifted: ``written.none`` ("forever", "unlimited") is None, so
    that a flag can undo what a lower source set."""

    def check(value: object) -> object:
        if isinstance(value, str):
            return None if value.strip().lower() == written.none else read(value)
        return _not_a_bool(value)

    return check


def _ports(value: object) -> object:
    return parse_port_range(value) if isinstance(value, str) else value


def _check_ports(ports: tuple[int, int]) -> tuple[int, int]:
    lo, hi = ports
    if not (1024 <= lo <= hi <= 65535):
        raise ConfigError(f"port range {lo}-{hi} must lie within 1024-65535, low before high")
    return ports


def between(low: int, high: int) -> Callable[[int | None], int | None]:
    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return check


def at_least(low: int, unit: str = "") -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < low:
            raise ValueError(f"must be at least {low}{unit}")
        return value

    return check


def one_of(*words: str) -> Callable[[str], str]:
    """A word among ``words``: "must be 'avoid' or 'ignore'" otherwise."""
    listed = " or ".join(f"'{w}'" for w in words)

    def check(value: str) -> str:
        if value not in words:
            raise ValueError(f"must be {listed}")
        return value

    return check


def checked_url(url: str | None) -> str | None:
    return None if url is None else notify.check_url(url)


NO_SOCKET = "none"
# A group name as groupadd takes it (and the upper case some directories use).
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def socket_path(value: object) -> object:
    """A socket path (absolute once ``~`` is expanded), or "none" for no socket."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in (NO_SOCKET, "off", ""):
        return NO_SOCKET
    path = os.path.expanduser(text)
    if not os.path.isabs(path) or "\x00" in path:
        raise ValueError(f"{value!r} is not an absolute path (or 'none')")
    return os.path.normpath(path)


def group_name(value: object) -> object:
    """A Unix group's name, or None ("none", empty) for no admin group."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("none", ""):
        return None
    if not _GROUP.fullmatch(text):
        raise ValueError(f"{value!r} is not a Unix group name")
    return text


EXECUTORS = ("local", "slurm")


def slurm_name(value: str | None) -> str | None:
    if value is not None and not slurm.SLURM_NAME.match(value):
        raise ValueError("must be a Slurm name: letters, digits, '.', '_', '+', '-' (',' lists)")
    return value


def _fraction(value: object) -> object:
    """``0.1`` or ``"10%"``."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a fraction (0.1) or a percentage (10%)") from None
    return _not_a_bool(value)


_FOREVER, _UNLIMITED, _IDLE = (
    DURATION.or_word("forever"),
    SIZE.or_word("unlimited"),
    DURATION.or_word("off"),
)

Seconds = Annotated[float, BeforeValidator(_duration), Field(ge=0, allow_inf_nan=False), DURATION]
# A period that is never none (how often something is looked at).
Period = Annotated[float, BeforeValidator(_duration), Field(gt=0, allow_inf_nan=False), DURATION]
Bytes = Annotated[
    int, BeforeValidator(_size), AfterValidator(at_least(MIN_LOG_CAP, " bytes")), SIZE
]
# Retention: how long a finished job's folder is kept, and how much all job folders may hold.
KeepFor = Annotated[
    Annotated[float, Field(gt=0, allow_inf_nan=False)] | None,
    BeforeValidator(_or_never(_FOREVER, parse_duration)),
    _FOREVER,
]
Budget = Annotated[
    Annotated[int, Field(gt=0)] | None,
    BeforeValidator(_or_never(_UNLIMITED, parse_size)),
    _UNLIMITED,
]
# An interactive session's idle limit: "off" (None) is no reclaim at all.
IdleLimit = Annotated[
    Annotated[float, Field(gt=0, allow_inf_nan=False)] | None,
    BeforeValidator(_or_never(_IDLE, parse_duration)),
    _IDLE,
]
PortRange = Annotated[tuple[int, int], BeforeValidator(_ports), AfterValidator(_check_ports), RANGE]
# A size that may be none at all (a headroom of 0).
AnySize = Annotated[int, BeforeValidator(_size), Field(ge=0), SIZE]
Fraction = Annotated[
    float, BeforeValidator(_fraction), Field(ge=0, le=10, allow_inf_nan=False), SHARE
]
# A job folder's limit (core.quota): bytes, a share of the disk (a float), or None.
FolderMax = Annotated[int | float | None, BeforeValidator(quota.read_limit), FOLDER_LIMIT]


# The host's CPU cores and memory given to jobs (core.hostres).
def _count(value: object) -> object:
    """A number of cores, or "auto" (None: the rule the setting's help names)."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return None
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a whole number of cores (or 'auto')") from None
    return _not_a_bool(value)


CORES = Written("number of cores, or auto", str)
# Cores in all (None: auto, the daemon's), and each GPU's default share (None: auto).
CpuCapacity = Annotated[
    Annotated[int, Field(ge=1, le=1_000_000)] | None,
    BeforeValidator(_or_never(CORES, _count)),
    CORES,
]
CpusPerGpu = Annotated[Annotated[int, Field(ge=0, le=4096)] | None, BeforeValidator(_count), CORES]
JOB_RAM = Written(
    "size (64G), share of the host's memory (90%) or unlimited",
    lambda v: human_size(v) if isinstance(v, int) else _share(v),
).or_word("unlimited")
JobRam = Annotated[int | float | None, BeforeValidator(hostres.read_job_ram), JOB_RAM]
_NO_SIZE = SIZE.or_word("none")
OptionalSize = Annotated[
    Annotated[int, Field(ge=hostres.MIN_RAM)] | None,
    BeforeValidator(_or_never(_NO_SIZE, parse_size)),
    _NO_SIZE,
]
