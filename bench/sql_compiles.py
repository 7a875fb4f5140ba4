"""How many SQL statements a pytest run compiles, and the CPU that took.

    python bench/sql_compiles.py [PYTEST ARGS]    # e.g. -n 0 -q tests/test_api_hardening.py

SQLAlchemy keeps what it compiled in a cache of each engine (its key holds the engine's
dialect), so every fresh ``Database`` (two engines) compiles its statements again: each
in-process test's app, each daemon. This runs pytest in this process (``-n 0``: xdist's
workers are other processes) with every ``SQLCompiler`` counted and its thread's CPU
summed, and prints both after pytest's own summary, beside the process's CPU in all.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
from sqlalchemy.sql import compiler

_lock = threading.Lock()
_counted = {"compiles": 0, "cpu_s": 0.0}
_original = compiler.SQLCompiler.__init__


def _counting_init(self: compiler.SQLCompiler, *args: Any, **kwargs: Any) -> None:
    began = time.thread_time()
    try:
        _original(self, *args, **kwargs)
    finally:
        with _lock:
            _counted["compiles"] += 1
            _counted["cpu_s"] += time.thread_time() - began


def main() -> int:
    compiler.SQLCompiler.__init__ = _counting_init  # type: ignore[method-assign]
    code = pytest.main(sys.argv[1:])
    print(
        f"SQL compiles: {_counted['compiles']}, {_counted['cpu_s']:.2f} s of their threads' "
        f"CPU, of {time.process_time():.1f} s of this process's CPU"
    )
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
