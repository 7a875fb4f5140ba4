"""Count a ddpq daemon's SQL statements, per thread and per statement (a benchmark aid).

Started by ``bench/sampled/sitecustomize.py`` when ``DDPQ_BENCH_STATEMENTS=PATH`` is set;
at exit each daemon process writes ``PATH.<pid>``: a line per (thread, statement) with how
many times it ran, most first, then each thread's total. Every statement SQLAlchemy sends
is counted (its cursor events), ``BEGIN`` and savepoints included.

    PYTHONPATH=bench/sampled DDPQ_BENCH_STATEMENTS=/tmp/st python bench/scheduler_bench.py
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from typing import Any


def install(path: str) -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    guard = threading.Lock()

    @event.listens_for(Engine, "after_cursor_execute")
    def _counted(*args: Any) -> None:
        statement = " ".join(str(args[2]).split())[:120]
        with guard:
            counts[(threading.current_thread().name, statement)] += 1

    def dump() -> None:
        totals: collections.Counter[str] = collections.Counter()
        with open(f"{path}.{os.getpid()}", "w") as out:
            for (thread, statement), n in counts.most_common():
                totals[thread] += n
                out.write(f"{n}\t{thread}\t{statement}\n")
            for thread, n in totals.most_common():
                out.write(f"total\t{thread}\t{n}\n")

    atexit.register(dump)
