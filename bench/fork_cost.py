"""What a fork costs a Python process like the fork server, by what it has imported.

    python bench/fork_cost.py [--forks 400]

For each set of imports (each in a fresh ``python -S``, as the fork server runs), the
process forks ``--forks`` children that exit at once (``os._exit``), one at a time, and
prints its resident size, its own CPU per fork and its children's CPU per fork (their
rusage). The last set is the fork server's own: the shim and its helpers, which import
``subprocess`` and with it ``threading``; the one before it is the same without them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from machine import ROOT, machine_line, python_c_pass_ms

BASE = "json,socket,array,signal,ctypes"
SETS = [
    ("nothing", ""),
    ("the fork server's standard modules", BASE),
    ("those and threading", f"{BASE},threading"),
    ("those and subprocess (threading with it)", f"{BASE},subprocess"),
    ("the fork server's own: the shim and its helpers", f"{BASE},shim"),
]

CHILD = """
import importlib, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
for name in filter(None, sys.argv[2].split(",")):
    importlib.import_module(name)
forks = int(sys.argv[3])
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
began = time.process_time()
for _ in range(forks):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
own = (time.process_time() - began) / forks * 1000
used = resource.getrusage(resource.RUSAGE_CHILDREN)
children = (used.ru_utime + used.ru_stime) / forks * 1000
print(f"{rss / 1e6:.1f} {own:.3f} {children:.3f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forks", type=int, default=400)
    args = ap.parse_args()
    shim_folder = str(ROOT / "src" / "ddpq" / "executors" / "local")
    print(machine_line())
    print(f"python -c pass {python_c_pass_ms():.1f} ms; {args.forks} forks each\n")
    print("| imported | resident | the parent's CPU a fork | the child's CPU |")
    print("|---|---|---|---|")
    for label, modules in SETS:
        out = subprocess.run(
            [sys.executable, "-S", "-c", CHILD, shim_folder, modules, str(args.forks)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        rss, own, children = out
        print(f"| {label} | {rss} MB | {own} ms | {children} ms |")


if __name__ == "__main__":
    main()
