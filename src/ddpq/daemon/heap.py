"""The daemon's start-up objects: made without the cyclic garbage collector's passes, then
kept out of its full passes.

Python's full collection walks every object that can hold a reference: for the daemon,
tens of thousands made once at start (modules, SQLAlchemy's tables and compiled
statements, the API's routes and pydantic models) that live as long as the process. It
holds the interpreter lock while it walks them, so every thread stops: 125-600 ms per
full pass here under load, in the worker's pass or a submission (bench/RESULTS.md, "the
slower kind of machine"), and in proportion to the machine's speed. Frozen once the
daemon has started, they are never walked again; what is made afterwards (requests,
passes) is collected as before.

While the daemon starts (``collections_held``), the collector does not run at all: its
imports allocate those objects by the hundred thousand, and the passes they set off
(young ones every 700 allocations, full ones as the heap grows) found almost nothing to
free at about a tenth of a start's CPU (bench/RESULTS.md, "a daemon's start and stop").
The one full collection of ``freeze_startup_objects`` still frees what the start left as
garbage, and the collector runs again from there on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collections_held() -> Iterator[None]:
    """No automatic collection until ``freeze_startup_objects`` (or, for a start that ends
    before it, until the block ends)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def freeze_startup_objects() -> None:
    gc.collect()  # what start-up left as garbage is freed, not kept forever
    gc.freeze()
    gc.enable()  # after collections_held: what the daemon makes from now on is collected
