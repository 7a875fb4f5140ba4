"""A wall-clock stack sampler for a running ddpq daemon (no py-spy, no yappi here).

A thread reads ``sys._current_frames()`` every few milliseconds and counts, per thread
name, the innermost frame ("self") and every function on the stack ("total"). A thread
blocked in C (a syscall, SQLite's fsync, a lock) is counted at its Python call site, so
the figures are wall time, not CPU time: read the worker's and the API's threads, and
ignore frames that are only waiting for work (``select``, ``Condition.wait``).

Started by ``bench/sampled/sitecustomize.py`` when ``DDPQ_BENCH_SAMPLE=PATH`` is set;
written to ``PATH.<pid>`` when the process exits.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time

IDLE = ("select", "wait", "poll", "accept", "_worker", "run_forever", "epoll")


def _where(code: object, lineno: int | None = None) -> str:
    filename = getattr(code, "co_filename", "?")
    parts = filename.split("/")
    short = "/".join(parts[-2:])
    return f"{short}:{getattr(code, 'co_name', '?')}"


def start(path: str, interval_s: float = 0.002) -> None:
    own = collections.Counter[tuple[str, str]]()
    total = collections.Counter[tuple[str, str]]()
    samples = collections.Counter[str]()
    stop = threading.Event()

    def sample() -> None:
        me = threading.get_ident()
        while not stop.wait(interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = names.get(ident, str(ident))
                samples[thread] += 1
                own[(thread, _where(frame.f_code))] += 1
                seen = set()
                f = frame
                while f is not None:
                    key = _where(f.f_code)
                    if key not in seen:
                        seen.add(key)
                        total[(thread, key)] += 1
                    f = f.f_back

    def dump() -> None:
        stop.set()
        sampler.join(1.0)  # its last sample done: the counters no longer change under us
        with open(f"{path}.{os.getpid()}", "w") as out:
            out.write(f"argv: {sys.orig_argv}\ninterval: {interval_s * 1000:.1f} ms\n")
            for thread, n in samples.most_common():
                out.write(f"\n== thread {thread}: {n} samples\n-- self\n")
                mine = [(k[1], c) for k, c in own.items() if k[0] == thread]
                for key, c in sorted(mine, key=lambda kc: -kc[1])[:25]:
                    out.write(f"{c:7d} {100 * c / n:5.1f}%  {key}\n")
                out.write("-- total\n")
                mine = [(k[1], c) for k, c in total.items() if k[0] == thread]
                for key, c in sorted(mine, key=lambda kc: -kc[1])[:60]:
                    out.write(f"{c:7d} {100 * c / n:5.1f}%  {key}\n")

    sampler = threading.Thread(target=sample, name="stack-sampler", daemon=True)
    sampler.start()
    atexit.register(dump)
    _ = time
