"""Ids asked about in bounded pieces. An ``IN (...)`` list is one SQL variable per id, and
SQLite caps the variables of one statement (999 before 3.32, 32,766 since, 250,000 in some
builds): a question about every queued job must not fail when the queue is long."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

# Ids per statement: below every SQLite's cap, and few statements for a 10,000-job queue.
IDS_PER_STATEMENT = 900


def batches(ids: Iterable[int], size: int = IDS_PER_STATEMENT) -> Iterator[Sequence[int]]:
    """``ids`` in lists of at most ``size``, in order."""
    batch: list[int] = []
    for i in ids:
        batch.append(i)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
