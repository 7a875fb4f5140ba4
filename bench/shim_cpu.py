"""The CPU of one shim with its job, forked as the fork server forks it.

    python bench/shim_cpu.py [--jobs 200] [--src PATH] [--command true] [--steps] [--cgroup]

This process imports the shim as the fork server does (``python -S``, the shim's folder
first on the path, ``json`` and ``ctypes`` loaded before any fork) and then, ``--jobs``
times, forks a child that becomes a session leader and runs ``shim.main`` for a fresh job
folder, one at a time. It prints the children's CPU per shim (the shim and the job it ran,
from their rusage), their minor page faults (pages copied on write) and the wall time per
shim. No daemon, no worker, no cgroup: the shim
finds its job's processes by their session (as a daemon with ``--tracking session`` does),
so the figure is the shim's own part of ``burst_cpu.py``'s "shims" line, without the
cgroup joins. ``--src`` is the ``src`` folder of a tree to measure (this checkout's by
default): run two trees alternately and compare their figures, not figures of other runs.

``--cgroup`` (root, a writable cgroup v2 tree): each shim joins a cgroup of its own and is
told so at its gate, as a daemon tracking jobs by cgroup does it (``join`` below is that
write). ``--steps``: each shim also times its own steps (the CPU of its process in each of
the shim's functions, ``time.process_time``) and the means are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import ROOT, machine_line, python_c_pass_ms


def children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def children_faults() -> int:
    """Minor page faults of the reaped children: a forked shim's pages copied on write (and
    its job's, mapped at exec)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--command", default="true")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--cgroup", action="store_true")
    args = ap.parse_args()
    if sys.flags.no_site == 0:  # as the fork server: no site-packages, no .pth files
        os.execv(sys.executable, [sys.executable, "-S", *sys.argv])
    floor = python_c_pass_ms()
    sys.path.insert(0, str(Path(args.src) / "ddpq" / "executors" / "local"))
    import ctypes  # noqa: F401  # as the fork server: loaded once, before any fork
    import json  # noqa: F401

    import shim  # type: ignore[import-not-found]

    with_tmp = hasattr(shim, "shim_tmp")  # a tree from before stop 50 makes no TMPDIR

    with contextlib.suppress(ImportError):  # a tree from before stop 40 has none
        import shim_libc  # type: ignore[import-not-found]

        shim_libc.preload()  # as the fork server does
    if args.steps:
        time_steps(shim)
    work = Path(tempfile.mkdtemp(prefix="ddpq-shim-cpu-"))
    tree = Path(tempfile.mkdtemp(prefix="ddpq-shim-cpu-", dir=CGROUP_V2)) if args.cgroup else None
    try:
        before, faults, began = children_cpu_s(), children_faults(), time.perf_counter()
        for i in range(args.jobs):
            run_one(shim, work, i, args.command, tree, with_tmp)
        cpu_ms = (children_cpu_s() - before) / args.jobs * 1000
        faults_each = (children_faults() - faults) / args.jobs
        wall_ms = (time.perf_counter() - began) / args.jobs * 1000
        steps = read_steps(work, args.jobs) if args.steps else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tree is not None:
            for cgroup in tree.glob("job-*"):
                cgroup.rmdir()
            tree.rmdir()
    print(machine_line())
    print(f"src: {args.src}; {args.jobs} shims running {args.command!r}")
    print(f"CPU per shim with its job: {cpu_ms:.2f} ms; wall {wall_ms:.2f} ms")
    print(f"minor page faults per shim with its job: {faults_each:.0f}")
    if args.cgroup:
        print("each shim in a cgroup v2 of its own")
    for step, ms in sorted(steps.items(), key=lambda kv: -kv[1]):
        print(f"  {step}: {ms:.3f} ms of the shim's CPU")
    print(f"python -c pass: {floor:.1f} ms; load {os.getloadavg()[0]:.1f}")


CGROUP_V2 = (
    "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
)
# The shim's steps timed with --steps: (module, function) as the shim's modules name them.
STEPS = [
    ("shim", "handle_signals"),
    ("shim", "wait_for_worker"),
    ("shim", "job_identity"),
    ("shim", "become_subreaper"),
    ("shim", "run_batch"),
    ("shim_record", "reserve_record"),
    ("shim_record", "finish"),
    ("shim_batch", "fork_job"),
    ("shim_procs", "kill_everything"),
    ("shim_log", "CappedLog"),
    ("shim_tmp", "fresh"),
    ("shim_tmp", "remove"),
]
SPENT: dict[str, float] = {}


def time_steps(shim: Any) -> None:
    """Wrap the shim's steps so that each shim adds up its own CPU in each (in SPENT)."""
    for module_name, name in STEPS:
        module = shim if module_name == "shim" else sys.modules.get(module_name)
        if module is None:  # a step of another tree's shim
            continue
        original = getattr(module, name)

        def wrapper(*a: Any, _f: Any = original, _n: str = name, **k: Any) -> Any:
            began = time.process_time()
            try:
                return _f(*a, **k)
            finally:
                SPENT[_n] = SPENT.get(_n, 0.0) + time.process_time() - began

        setattr(module, name, wrapper)


def run_one(shim: Any, work: Path, i: int, command: str, tree: Path | None, with_tmp: bool) -> None:
    """Fork one shim for a fresh job folder, as the fork server does; wait for it."""
    folder = work / str(i)
    folder.mkdir()
    argv = ["--job-dir", str(folder), "--log", str(folder / "output.log")]
    argv += ["--record", str(folder / "exit.json"), "--cwd", str(work)]
    argv += ["--grace", "5", "--log-cap", "1000000"]
    if with_tmp:  # as the daemon starts it: the job's TMPDIR made and removed
        argv += ["--tmp", str(folder / "tmp")]
    argv += ["--", command]
    cgroup = None
    if tree is not None:
        cgroup = tree / f"job-{i}"
        cgroup.mkdir()
        gate_r, gate_w = os.pipe()
        os.write(gate_w, b"c")  # in its cgroup: the worker's word
        os.close(gate_w)
        argv = ["--wait-fd", str(gate_r), "--cgroup", str(cgroup), *argv]
    pid = os.fork()
    if pid == 0:
        os.setsid()
        began = time.process_time()
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text("0")
            SPENT["join (its cgroup.procs written)"] = time.process_time() - began
        code = shim.main(argv)
        if SPENT:
            SPENT["all of the shim"] = time.process_time() - began
            (folder / "steps.json").write_text(json.dumps(SPENT))
        os._exit(code)
    if tree is not None:
        os.close(gate_r)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"shim {i} exited {os.waitstatus_to_exitcode(status)}")


def read_steps(work: Path, jobs: int) -> dict[str, float]:
    """The mean of each step over the shims, in ms."""
    total: dict[str, float] = {}
    for i in range(jobs):
        for step, seconds in json.loads((work / str(i) / "steps.json").read_text()).items():
            total[step] = total.get(step, 0.0) + seconds
    return {step: seconds / jobs * 1000 for step, seconds in total.items()}


if __name__ == "__main__":
    main()
