"""What the daemon's bounded looks cost at the sizes a hostile or careless user reaches.

    python bench/bounded_looks.py [--fds 1000,5000,9900] [--files 150000]

- the worker's wait (``wake.wait_readable``, poll(2)) over N pipes, the descriptors a
  worker holds with N running jobs: milliseconds per wait that finds one ready;
- the per-job folder limit's walk (``daemon.measure.FolderWalk``) over a folder of N empty
  files with 200-character names: seconds to walk it whole, and the walk's peak Python
  memory (tracemalloc) beside the peak of listing the same folder at once (``os.listdir``,
  what a naive measure would hold).

Prints a markdown table to paste into bench/RESULTS.md, with `python -c pass` measured in
the same run as the machine's floor.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from machine import cpu_model

from ddpq.daemon.measure import FolderWalk
from ddpq.wake import wait_readable


def python_floor_ms(runs: int = 10) -> float:
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1000


def wait_ms(count: int, repeats: int = 50) -> float:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * count + 64), hard))
    pipes = [os.pipe() for _ in range(count)]
    try:
        os.write(pipes[-1][1], b"x")  # the last one ready: poll looks at every one
        fds = [r for r, _ in pipes]
        took = []
        for _ in range(repeats):
            began = time.perf_counter()
            ready = wait_readable(fds, 1.0)
            took.append(time.perf_counter() - began)
            assert ready == {pipes[-1][0]}
        return statistics.median(took) * 1000
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def walk(files: int) -> tuple[float, float, float]:
    """Seconds to walk, the walk's peak MiB, and listing the folder at once's peak MiB."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "job"
        folder.mkdir()
        for i in range(files):
            (folder / f"{i:010d}{'x' * 190}").touch()
        tracemalloc.start()
        began = time.perf_counter()
        measured = FolderWalk(folder)
        while not measured.done:
            measured.advance(10**9, time.monotonic() + 3600, None)
        seconds = time.perf_counter() - began
        walk_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        names = os.listdir(folder)
        list_peak = (tracemalloc.get_traced_memory()[1] - base) / 2**20
        del names
        tracemalloc.stop()
        return seconds, walk_peak, list_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fds", default="1000,5000,9900")
    parser.add_argument("--files", type=int, default=150_000)
    args = parser.parse_args()
    print(f"{cpu_model()}, {os.cpu_count()} cores; `python -c pass`: {python_floor_ms():.1f} ms\n")
    print("| look | size | result |\n|---|---|---|")
    for count in (int(n) for n in args.fds.split(",")):
        print(f"| worker's wait (poll) | {count} descriptors | {wait_ms(count):.2f} ms |")
    seconds, walk_peak, list_peak = walk(args.files)
    print(
        f"| folder walk | {args.files} files | {seconds:.2f} s, peak {walk_peak:.3f} MiB "
        f"(os.listdir alone: {list_peak:.1f} MiB) |"
    )


if __name__ == "__main__":
    main()
