"""The per-job folder limit (``job_folder_max``): how much one job's folder may hold (pure).

One job filling the disk its folder is on stops everyone whose folder (or whose database)
is there too. The limit is a size ("50G"), or a fraction of that filesystem ("50%", the
default: no one job alone can fill it, whatever its size). A running job whose folder
holds more is stopped, and ends failed with a reason that says so; it is not retried,
since its next attempt would find the same folder. The worker's side measures
(``daemon.quota``); this decides.
"""

from __future__ import annotations

from ddpq.core.units import parse_size, size_for_people

MIN_LIMIT = 1 << 20  # a size below this is a typo (64 for 64G), not a limit


def read_limit(value: object) -> object:
    """The setting as people write it: a size ("50G", or a number of bytes), a share of
    the disk ("50%", or a number below 1; kept as a float), or "unlimited" (None).
    ValueError for people."""
    return size_or_share(value, "the disk", ("50G", "50%"), MIN_LIMIT)


def size_or_share(value: object, of: str, examples: tuple[str, str], least: int) -> object:
    """A size ("50G", or bytes), a share of ``of`` ("50%", or a number below 1; kept as a
    float) or "unlimited" (None), as a setting reads it: the per-job folder limit, the
    memory given to jobs. ``examples``: a size and a share, for the messages; ``least``:
    a smaller size is a typo (64 for 64G), refused."""
    size_example, share_example = examples
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "unlimited":
            return None
        if text.endswith("%"):
            try:
                share = float(text[:-1]) / 100
            except ValueError:
                raise ValueError(f"{value!r} is not a percentage ({share_example})") from None
            if not 0 < share <= 1:
                raise ValueError(f"{value!r}: a share of {of} is above 0% and at most 100%")
            return share
        value = parse_size(text)
    elif isinstance(value, float):
        if 0 < value < 1:
            return value  # no size: a share, as 0.5 (TOML) for 50%
        if not value.is_integer():
            raise ValueError(
                f"a number is bytes; a share of {of} is written with %, as {share_example}"
            )
        value = int(value)  # a TOML 5e10: bytes, as any number here
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"expected a size ({size_example}), a share of {of} ({share_example}) or 'unlimited'"
        )
    if value < least:
        raise ValueError(f"{value} bytes: must be at least {size_for_people(least)}")
    return value


def folder_limit(setting: int | float | None, filesystem_bytes: int) -> int | None:
    """The limit in bytes: ``setting`` is bytes (an int), a fraction of the filesystem that
    holds the job folders (a float, 0 < f <= 1), or None for no limit."""
    if setting is None:
        return None
    if isinstance(setting, float):
        return max(1, int(filesystem_bytes * setting))
    return setting


def over_limit(held_bytes: int, limit: int | None, setting: int | float | None) -> str | None:
    """Why a job whose folder holds ``held_bytes`` must stop, or None if it may go on."""
    if limit is None or held_bytes <= limit:
        return None
    of = f" ({setting:.0%} of the disk its folder is on)" if isinstance(setting, float) else ""
    return (
        f"its folder holds {size_for_people(held_bytes)}, over the "
        f"{size_for_people(limit)}{of} per-job limit"
    )
