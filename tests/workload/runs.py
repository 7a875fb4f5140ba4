"""Running the built-in workload as ddpq would: its own session, the job's environment, one
thread per rank, under torchrun or plainly; waiting on conditions with deadlines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.helpers import free_port
from tests.helpers import wait_for as until
from tests.zygote import READ_AS_TORCH_LOADS, TRAINING, Forked, Zygote

SRC = Path(__file__).resolve().parents[2] / "src"
RUN_TIMEOUT_S = 120.0
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
PREEMPT_ENV = ("DDPQ_PREEMPT_SIGNAL", "DDPQ_PREEMPT_GRACE", "DDPQ_REQUEUE_EXIT", "DDPQ_ATTEMPT")
# A preemptible job's environment. Grace 0: the ranks meet after every step, so every step
# but an epoch's last has a record.
PREEMPTIBLE = {"DDPQ_PREEMPT_SIGNAL": "USR1", "DDPQ_PREEMPT_GRACE": "0"}
# The narrow network (``--width 16``: a sixteenth of ResNet18's weights, of each step's
# compute and of the gradients all-reduced) for the tests where the network is not the
# point: retries, the mid-epoch preemption (its epochs of 40 cheap steps give the signal
# over a second to land in the first), a SIGTERM and a rerun, the evaluation's split,
# torchrun's report. 4 ranks of 3 short epochs (`bench/width_cost.py`): 47 s of CPU at
# width 64, 30 s at 16. The published width is trained where a signal must land while the
# job trains and more steps would cost as much as wider ones (a narrow run lasting as long
# costs as much: bench/RESULTS.md, "The suite, fifth pass"): test_resize_runs, and
# tests/test_workload_ddpq.py's grow and preemption.
NARROW = ["--width", "16"]
# A plain run, a rank started here or torchrun itself, forked with torch imported: a ~3-5 s
# start fewer each (tests/zygote.py; torchrun's ranks are its own, new processes). Started
# with the first run's environment; a new process where a run's would be read differently
# at its start.
TRAINING_ZYGOTE = Zygote(TRAINING, read_first=READ_AS_TORCH_LOADS)
Process = subprocess.Popen[bytes] | Forked


def job_env(job_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*TORCHRUN_ENV, *PREEMPT_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["DDPQ_JOB_DIR"] = str(job_dir)
    # As ddpq gives it (executors.contract.own_tmp): torchrun's log folder, which it never
    # removes, goes into the test's folder rather than the host's /tmp.
    env["TMPDIR"] = str(job_dir / "tmp")
    (job_dir / "tmp").mkdir(parents=True, exist_ok=True)
    env.pop("DDPQ_CIFAR_DIR", None)
    env.update(extra or {})
    return env


def workload_module(args: list[str], nproc: int | None) -> list[str]:
    """What follows ``python -m``. ``nproc=None``: the module run plainly (world size 1);
    else under torchrun."""
    if nproc is None:
        return ["ddpq.workloads.resnet18", *args]
    return [
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "ddpq.workloads.resnet18",
        *args,
    ]


def start(
    args: list[str],
    job_dir: Path,
    nproc: int | None,
    log: Path,
    env: Mapping[str, str] | None = None,
    ignore: signal.Signals | None = None,
) -> Process:
    """``env``: added to the job's environment; ``ignore``: a signal the started program
    (torchrun) runs with ignored, as ddpq starts it with the preemption signal."""
    job_dir.mkdir(parents=True, exist_ok=True)
    environment = job_env(job_dir, env)
    ignored = () if ignore is None else (ignore,)
    with log.open("ab") as out:
        module, *argv = workload_module(args, nproc)
        if TRAINING_ZYGOTE.accepts(environment):
            return TRAINING_ZYGOTE.spawn(module, argv, environment, out.fileno(), ignored)

        def ignoring() -> None:
            for number in ignored:
                signal.signal(number, signal.SIG_IGN)

        # Own session: the test can signal (and on failure kill) the whole group.
        return subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ignoring if ignored else None,
        )


def finish(proc: Process, timeout: float = RUN_TIMEOUT_S) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc, signal.SIGKILL)
        proc.wait()
        raise


def kill_group(proc: Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun's ranks; serve's worker half), from
    /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def signal_ranks(proc: Process, sig: signal.Signals) -> list[int]:
    """Send ``sig`` to each rank torchrun started: they run in sessions of their own, so a
    signal to torchrun's group never reaches them."""
    ranks = children(proc.pid)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return ranks


def kill_job(proc: Process, sig: signal.Signals) -> None:
    """``sig`` to torchrun's group and to its ranks (each in a session of its own)."""
    ranks = children(proc.pid)
    kill_group(proc, sig)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


def run(
    args: list[str],
    job_dir: Path,
    nproc: int | None = None,
    env: Mapping[str, str] | None = None,
    log_name: str | None = None,
) -> tuple[int, str]:
    log = job_dir.with_name(log_name or job_dir.name + ".log")
    proc = start(args, job_dir, nproc, log, env)
    code = finish(proc)
    return code, log.read_text(errors="replace")


def run_ranks(args: list[str], job_dir: Path, nproc: int) -> tuple[int, str]:
    """An uninterrupted run on ``nproc`` ranks started here, without torchrun: the ranks'
    environment is the one torchrun gives them (env:// rendezvous), and a torch process
    fewer (torchrun's, ~3 s of CPU). For the runs a test compares with, whose launcher is not
    what it checks. The status: 0, or the first rank's that failed (the others killed)."""
    log = job_dir.with_name(job_dir.name + ".log")
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    rendezvous |= {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
    ranks = [
        start(args, job_dir, None, log, {**rendezvous, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(nproc)
    ]

    def ended() -> list[int] | None:
        """Every rank's status once all have ended or one has failed (the others are
        killed then, and their statuses would say so, not why)."""
        codes = [rank.poll() for rank in ranks]
        failed = any(code not in (None, 0) for code in codes)
        return [code for code in codes if code is not None] if failed or None not in codes else None

    try:
        codes = until(ended, RUN_TIMEOUT_S, "the ranks to finish")
    finally:
        for rank in ranks:
            kill_group(rank, signal.SIGKILL)
            rank.wait()
    return next((code for code in codes if code != 0), 0), log.read_text(errors="replace")


def wait_for(
    cond: Callable[[], bool], timeout: float, proc: Process, log: Path | None = None
) -> None:
    """Wait until ``cond`` holds; a failure shows the tail of ``log``, the process's output."""

    def tail() -> str:
        return f":\n{log.read_text(errors='replace')[-4000:]}" if log else ""

    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) before the condition held{tail()}"
            )
        if time.monotonic() > deadline:
            kill_job(proc, signal.SIGKILL)
            raise AssertionError(f"condition not met within {timeout} s{tail()}")
        time.sleep(0.02)


def signal_mask(pid: int, *fields: str) -> int:
    """The union of the process's signal masks ``fields`` of /proc/PID/status (``SigCgt``:
    the signals it has a handler for; ``SigPnd``, ``ShdPnd``: those sent and not yet taken,
    the thread's and the process's); bit ``n - 1`` is signal ``n``."""
    mask = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            mask |= int(value, 16)
    return mask


def records(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return []
    # A line being written right now is not a record yet.
    lines = path.read_text().splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith("\n")]


def positions(recs: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(epoch, step) of each training and epoch record."""
    return [(r["epoch"], r["step"]) for r in recs if r["phase"] in ("train", "epoch")]
