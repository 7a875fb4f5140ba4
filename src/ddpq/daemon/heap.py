"""The daemon's start-up objects kept out of the cyclic garbage collector's full passes.

Python's full collection walks every object that can hold a reference: for the daemon,
tens of thousands made once at start (modules, SQLAlchemy's tables and compiled
statements, the API's routes and pydantic models) that live as long as the process. It
holds the interpreter lock while it walks them, so every thread stops: 125-600 ms per
full pass here under load, in the worker's pass or a submission (bench/RESULTS.md, "the
slower kind of machine"), and in proportion to the machine's speed. Frozen once the
daemon has started, they are never walked again; what is made afterwards (requests,
passes) is collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    gc.collect()  # what start-up left as garbage is freed, not kept forever
    gc.freeze()
