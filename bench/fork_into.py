"""A child's way into its v2 cgroup, forked and moved (a write into ``cgroup.procs``) or born
there (``clone3`` with ``CLONE_INTO_CGROUP``, ``executors/local/clone_into.py``): the wall
time from just before the fork until the child runs inside the cgroup.

    sudo python bench/fork_into.py [--runs 30]

Runs in a ``python -S`` process of one thread that has imported the fork server's modules,
as the fork server does; a throwaway cgroup per run beneath our own v2 cgroup, 0.2 s
apart (the kernel's lock for ``cgroup.procs`` writes stays cheap for a while after a
write). The two ways alternate, so that both meet the same moments of the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from machine import ROOT, machine_line, python_c_pass_ms

from ddpq.executors.local import cgroups

CHILD = """
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import clone_into, forkserver
from pathlib import Path
base = Path(sys.argv[2]) / "ddpq-fork-into-bench"
base.mkdir()
took = {"forked, then moved": [], "born in it": []}
try:
    for run in range(int(sys.argv[3])):
        for way in took:
            folder = base / f"run{run}-{len(took[way])}{way[0]}"
            folder.mkdir()
            read, write = os.pipe()
            t0 = time.perf_counter()
            if way == "born in it":
                pid = clone_into.fork_into(str(folder))
                assert pid is not None, clone_into.unavailable()
            else:
                pid = os.fork()
            if pid == 0:
                if way != "born in it":
                    forkserver.join_cgroups({"cgroup": str(folder)})
                os.write(write, repr(time.perf_counter() - t0).encode())
                os._exit(0)
            os.close(write)
            took[way].append(float(os.read(read, 100)))
            os.close(read)
            os.waitpid(pid, 0)
            folder.rmdir()
            time.sleep(0.2)
finally:
    base.rmdir()
print(json.dumps({way: [statistics.median(t), max(t)] for way, t in took.items()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; {args.runs} children each way\n")
    own = cgroups.own_cgroup()
    if own is None:
        sys.exit("no v2 cgroup of our own here")
    local = ROOT / "src" / "ddpq" / "executors" / "local"
    done = subprocess.run(
        [sys.executable, "-S", "-c", CHILD, str(local), str(own), str(args.runs)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(done.stderr.strip().splitlines()[-1])
    print("| way into the cgroup | median | largest |")
    print("|---|---|---|")
    for way, (median, largest) in json.loads(done.stdout).items():
        print(f"| {way} | {median * 1000:.2f} ms | {largest * 1000:.2f} ms |")


if __name__ == "__main__":
    main()
