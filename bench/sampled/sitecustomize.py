"""Benchmark aids started inside a ddpq daemon (never the benchmark's client or a shim):

    PYTHONPATH=bench/sampled DDPQ_BENCH_SAMPLE=/tmp/prof python bench/scheduler_bench.py
    PYTHONPATH=bench/sampled DDPQ_BENCH_SQL=/tmp/sql [DDPQ_BENCH_FSYNC_MS=10] python ...

``DDPQ_BENCH_SAMPLE``: bench/stack_sampler.py (where the threads' wall time goes).
``DDPQ_BENCH_SQL``: bench/sql_timing.py (write-lock waits, holds, commits; a slow disk).
``DDPQ_BENCH_THREADS``: bench/thread_names.py (which thread is which, for bench/burst_cpu.py).
``DDPQ_BENCH_STATEMENTS``: bench/statement_count.py (how many SQL statements, by thread).
``DDPQ_BENCH_PASS_GAP_S``: the worker's pass gap (``worker.loop.PASS_GAP_S``) set to this,
to compare gaps with one tree.
"""

import os
import sys

if {"serve", "server", "worker"} & set(sys.orig_argv):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if os.environ.get("DDPQ_BENCH_SAMPLE"):
        import stack_sampler

        stack_sampler.start(os.environ["DDPQ_BENCH_SAMPLE"])
    if os.environ.get("DDPQ_BENCH_SQL"):
        import sql_timing

        sql_timing.install(
            os.environ["DDPQ_BENCH_SQL"], float(os.environ.get("DDPQ_BENCH_FSYNC_MS", "0"))
        )
    if os.environ.get("DDPQ_BENCH_THREADS"):
        import thread_names

        thread_names.start(os.environ["DDPQ_BENCH_THREADS"])
    if os.environ.get("DDPQ_BENCH_STATEMENTS"):
        import statement_count

        statement_count.install(os.environ["DDPQ_BENCH_STATEMENTS"])
    if os.environ.get("DDPQ_BENCH_PASS_GAP_S"):
        from ddpq.worker import loop

        loop.PASS_GAP_S = float(os.environ["DDPQ_BENCH_PASS_GAP_S"])
