"""A pytest plugin: each test's wall time and the whole machine's busy CPU over it.

    PYTHONPATH=bench python -m pytest -p per_test_cpu -n 0 -q tests/test_workload_ddpq.py
    PER_TEST_CPU=/tmp/cpu.tsv PYTHONPATH=bench python -m pytest -p per_test_cpu -n 0 -q

Appends one line per test (node id, wall seconds, busy CPU seconds) to ``$PER_TEST_CPU``
(default ``per_test_cpu.tsv`` in the working folder). The machine's CPU, not the test
process's: a test's daemons, jobs and torchrun ranks are mostly not its children, and are
counted only this way. Run it in one process (``-n 0``) with nothing else on the machine,
or every test is charged its neighbours' work too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from pathlib import Path

import pytest
from machine import busy_cpu_s


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    busy, began = busy_cpu_s(), time.perf_counter()
    yield
    wall, cpu = time.perf_counter() - began, busy_cpu_s() - busy
    out = Path(os.environ.get("PER_TEST_CPU", "per_test_cpu.tsv"))
    with out.open("a") as f:
        f.write(f"{item.nodeid}\t{wall:.2f}\t{cpu:.2f}\n")
