"""Which of a daemon's threads is which, for a benchmark reading their CPU from /proc.

The kernel knows a thread by its id, and Python's names (``ddpq-worker``, ``AnyIO worker
thread``) are not its ``comm``: every half second this writes ``{native id: name}`` of
the daemon's threads to a file. Started by ``bench/sampled/sitecustomize.py`` when
``DDPQ_BENCH_THREADS=PATH`` is set.
"""

from __future__ import annotations

import json
import os
import threading
import time


def start(path: str) -> None:
    def write() -> None:
        while True:
            names = {t.native_id: t.name for t in threading.enumerate()}
            with open(path + ".tmp", "w") as out:
                json.dump(names, out)
            os.replace(path + ".tmp", path)
            time.sleep(0.5)

    threading.Thread(target=write, name="bench-thread-names", daemon=True).start()
    # `ddpq serve`'s worker half, forked: its threads, in a file of its own.
    os.register_at_fork(after_in_child=lambda: start(f"{path}.{os.getpid()}"))
