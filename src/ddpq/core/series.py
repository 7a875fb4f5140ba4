"""A job's metrics history: the lines of its ``metrics.jsonl`` as records of numbers (pure).

The job writes that file, so whatever is read of it is untrusted: each line goes through
``core.untrusted.parse_progress`` (bounded, flattened, cleaned), and only finite numbers
are kept (a plot needs nothing else). Read in chunks from a byte offset, like a log, so a
page that polls a running job reads only what is new; only whole lines are consumed, so a
line being written is read once it is complete.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ddpq.core.untrusted import MAX_LINE, parse_progress

Numbers = dict[str, float | int]


@dataclass(frozen=True)
class Chunk:
    records: list[Numbers]
    next_offset: int  # where the next read starts: after the last line consumed


def numbers_of(line: str, fields: Collection[str] = ()) -> Numbers | None:
    """The numeric fields of one line (only ``fields``, all of them, when given); None if
    the line is not a record or has none (or lacks one of ``fields``)."""
    record = parse_progress(line)
    if record is None:
        return None
    out: Numbers = {
        k: v
        for k, v in record.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and (not fields or k in fields)
    }
    if not out or (fields and len(out) < len(set(fields))):
        return None
    return out


def read_chunk(
    data: bytes, offset: int, full: bool, max_records: int, fields: Collection[str] = ()
) -> Chunk:
    """The records in ``data`` (the file's bytes from ``offset``), at most ``max_records``.

    ``full``: ``data`` is as long as was asked for, so more may follow. A chunk that holds
    no line end then is one huge line: it is skipped whole (it is over ``MAX_LINE``
    anyway, so no record), and the read goes on after it. Otherwise an unfinished last
    line waits for its end.
    """
    end = data.rfind(b"\n")
    if end < 0:
        skip = full and len(data) > MAX_LINE
        return Chunk([], offset + len(data) if skip else offset)
    records: list[Numbers] = []
    pos = 0
    while pos <= end and len(records) < max_records:
        stop = data.index(b"\n", pos)
        record = numbers_of(data[pos:stop].decode(errors="replace"), fields)
        if record is not None:
            records.append(record)
        pos = stop + 1
    return Chunk(records, offset + pos)
