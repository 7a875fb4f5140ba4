"""``ddpq.core.series``: a job's metrics.jsonl read in chunks from a byte offset."""

from __future__ import annotations

import json

from ddpq.core import series
from ddpq.core.untrusted import MAX_LINE


def lines(*records: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_only_whole_lines_and_only_numbers() -> None:
    data = (
        lines(
            {"epoch": 1, "test_acc": 0.5, "phase": "eval", "ok": True, "nested": {"a": 1}},
            {"epoch": 2, "test_acc": None},
        )
        + b'{"epoch": 3, "test_a'
    )  # being written
    chunk = series.read_chunk(data, 100, full=False, max_records=10)
    assert chunk.records == [{"epoch": 1, "test_acc": 0.5}, {"epoch": 2}]
    assert chunk.next_offset == 100 + data.rindex(b"\n") + 1  # the partial line waits
    rest = series.read_chunk(b'{"epoch": 3, "test_a', chunk.next_offset, False, 10)
    assert rest.records == [] and rest.next_offset == chunk.next_offset


def test_fields_keep_records_holding_all_of_them() -> None:
    data = lines({"epoch": 1, "step": 5}, {"epoch": 1, "test_acc": 0.4, "test_loss": 2.0})
    chunk = series.read_chunk(data, 0, False, 10, fields=["epoch", "test_acc"])
    assert chunk.records == [{"epoch": 1, "test_acc": 0.4}]


def test_hostile_lines_are_skipped_and_reading_goes_on() -> None:
    deep = "[" * 5000 + "]" * 5000
    data = b"not json\n" + deep.encode() + b'\n{"x": NaN}\n\xff\xfe\n' + lines({"x": 1})
    assert series.read_chunk(data, 0, False, 10).records == [{"x": 1}]
    # One line longer than a chunk: skipped whole, so the reader never stalls on it.
    huge = b"x" * (4 * MAX_LINE)
    chunk = series.read_chunk(huge, 0, full=True, max_records=10)
    assert chunk.records == [] and chunk.next_offset == len(huge)


def test_at_most_max_records_and_the_offset_says_where_to_go_on() -> None:
    data = lines(*({"step": i} for i in range(10)))
    first = series.read_chunk(data, 0, False, max_records=4)
    assert [r["step"] for r in first.records] == [0, 1, 2, 3]
    second = series.read_chunk(data[first.next_offset :], first.next_offset, False, 100)
    assert [r["step"] for r in second.records] == list(range(4, 10))
    assert second.next_offset == len(data)
