"""The CPU of a test daemon forked from the zygote, half by half, with and without what the
zygote now builds before it forks (``tests/prepared_daemon.py``).

    python bench/forked_daemon_cpu.py [--runs 5]

For each way, a fresh process does what ``tests/zygote.py`` does (imports ``DAEMON``, then
``prepared_daemon.prepare()`` or not, then collects and freezes), then forks a child that
runs ``ddpq serve --fake-gpus 4`` as a test daemon does; the parent polls /healthz, asks
for /v1/devices and stops it with SIGTERM. Measured in the child: the CPU of its API half
(``time.process_time`` from before the command line to its end) and of its worker half (the
same, in the worker's process); and which modules each half still imported after the fork.
The two ways alternate, one run each per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from machine import ROOT, free_port, machine_line, python_c_pass_ms

CHILD = r"""
import gc, importlib, json, os, signal, sys, tempfile, time, urllib.request
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.zygote import DAEMON
from tests.template_db import migrated, remove_template
for name in DAEMON:
    importlib.import_module(name)
if sys.argv[2] == "prepared":
    from tests import prepared_daemon
    prepared_daemon.prepare()
gc.collect(); gc.freeze()
home = Path(tempfile.mkdtemp(prefix="ddpq-bench-forked-"))
migrated(home / "ddpq.db")
port = int(sys.argv[3])
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)
    import ddpq.daemon.run as run
    from ddpq import entry
    child, leave = run._run_worker_child, run.leave
    def worker_half(settings, parent):
        began, before = time.process_time(), set(sys.modules)
        def left(code):
            said = {"worker": time.process_time() - began,
                    "worker imports": sorted(set(sys.modules) - before)}
            os.write(write, (json.dumps(said) + "\n").encode())
            leave(code)
        run.leave = left
        child(settings, parent)
    run._run_worker_child = worker_half
    sys.argv = ["ddpq", "serve", "--home", str(home), "--port", str(port), "--fake-gpus", "4",
                "--allow-root", "--grace", "1s"]
    began, before = time.process_time(), set(sys.modules)
    try:
        entry.main()
    except SystemExit:
        pass
    said = {"api": time.process_time() - began, "api imports": sorted(set(sys.modules) - before)}
    os.write(write, (json.dumps(said) + "\n").encode())
    os._exit(0)
os.close(write)
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.02)
urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/devices", timeout=5).read()
os.kill(pid, signal.SIGTERM)
os.waitpid(pid, 0)
said = {}
for line in os.fdopen(read).read().splitlines():
    said.update(json.loads(line))
remove_template()
import shutil
shutil.rmtree(home, ignore_errors=True)
print(json.dumps(said))
"""


def one(way: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), way, str(free_port())],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        check=True,
        timeout=120,
    )
    said: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return said


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    print(machine_line())
    command = f"python bench/forked_daemon_cpu.py --runs {runs}"
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; command: {command}\n")
    found: dict[str, list[dict[str, object]]] = {"as before": [], "prepared": []}
    for _ in range(runs):
        for way in found:
            found[way].append(one("prepared" if way == "prepared" else "plain"))
    print("| zygote | API half, median (min–max) | worker half, median (min–max) |")
    print("|---|---|---|")
    for way, said in found.items():
        cells = []
        for half in ("api", "worker"):
            cpu = [float(str(s[half])) for s in said]
            cells.append(f"{statistics.median(cpu):.3f} s ({min(cpu):.3f}–{max(cpu):.3f})")
        print(f"| {way} | {cells[0]} | {cells[1]} |")
    for half in ("api imports", "worker imports"):
        names = sorted({str(name) for said in found["prepared"] for name in said[half]})  # type: ignore[attr-defined]
        listed = ", ".join(names) or "nothing"
        print(f"\nimported after the fork, {half.split()[0]} half (prepared): {listed}")


if __name__ == "__main__":
    os.environ.pop("DDPQ_URL", None)
    main()
