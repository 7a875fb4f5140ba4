"""How often the daemon's threads take turns at the interpreter lock.

The API's threads, its event loop and the worker share one interpreter lock. A thread
that comes back from SQLite or the disk (which let the lock go) waits for it until the
thread holding it gives it up: under a computing thread, after ``sys.getswitchinterval()``,
5 ms by default. A submission comes back from SQLite six times inside its write
transaction, so while the worker's pass computed, each submission could wait tens of
milliseconds with the write gate held, and the worker's next transaction behind it. With
turns of 0.5 ms a submission beside a computing thread took 7 ms instead of 12-36 ms on
the 2-core AMD EPYC (2 ms alone; ``bench/lock_turns.py``, bench/RESULTS.md, "the hot path
on the slower machine"); a thread computing alone is not interrupted (there is nobody to
hand the lock to).
"""

from __future__ import annotations

import sys

TURN_S = 0.0005


def take_short_turns() -> None:
    sys.setswitchinterval(TURN_S)
