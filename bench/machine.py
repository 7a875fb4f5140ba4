"""Shared by the benchmark scripts: what machine a result came from, a free port, a
throwaway loopback daemon of this checkout, other versions to measure beside it."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """The first line of a result: the CPU, its cores, the interpreter."""
    return f"machine: {cpu_model()}, {os.cpu_count()} cores; python {platform.python_version()}"


def python_c_pass_ms(runs: int = 10) -> float:
    """The median wall time of ``python -c pass``: the floor of any Python process, the
    figure to give beside a result from a machine whose speed and load vary."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def busy_cpu_s() -> float:
    """The whole machine's busy CPU so far (user, nice, system, irq, softirq; /proc/stat),
    in seconds: every process counts, those no rusage of ours sees (a daemon's children,
    double-forked ones) too."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def runs_and_versions(default_runs: int) -> tuple[int, dict[str, str]]:
    """The command line of a script that measures this checkout beside other versions:
    ``--runs N`` and ``--pythonpath SRC`` (repeatable); the versions compiled."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=default_runs)
    ap.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        help="another version's src folder to measure beside this checkout's (repeatable)",
    )
    args = ap.parse_args()
    return args.runs, compiled_versions(args.pythonpath)


def compiled_versions(other_srcs: list[str]) -> dict[str, str]:
    """This checkout's src and the others asked for, by name, each compiled first: a
    version whose bytecode is written during the measurement would pay for it there."""
    versions = {"this checkout": str(ROOT / "src")}
    versions.update({path: path for path in other_srcs})
    for path in versions.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", path], check=True)
    return versions


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(
    home: Path, port: int, *extra: str, gpus: int = 2, src: str = str(ROOT / "src")
) -> subprocess.Popen[bytes]:
    """``ddpq serve --fake-gpus GPUS`` of the code under ``src`` (this checkout's by
    default) on loopback, ``extra`` flags added; returned once ``/healthz`` answers (its
    output in ``home/daemon.log``)."""
    args = ["serve", "--home", str(home), "--port", str(port), "--fake-gpus", str(gpus), *extra]
    if os.geteuid() == 0:  # a throwaway loopback daemon
        args.append("--allow-root")
    env = {**os.environ, "PYTHONPATH": src}
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpq", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    wait_healthy(proc, port, home / "daemon.log")
    return proc


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def healthy(port: int) -> bool:
    """Whether the daemon on ``port`` answers /healthz (a raw request: no HTTP client's
    import or set-up in the measuring process)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(HEALTHZ)
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until /healthz answers, looking as ``tests.helpers.wait_for`` does (at once, then
    every 20 ms growing to 100 ms), for at most 60 s; the daemon's log if it never does."""
    deadline = time.monotonic() + 60
    pause = 0.02
    while not healthy(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
        time.sleep(pause)  # a poll of a condition with a deadline, as the tests' helper
        pause = min(pause * 1.5, 0.1)


def wait_until(check: Callable[[], T], timeout: float, what: str) -> T:
    """``check()``'s first true answer, looked for every 5 ms for at most ``timeout``
    seconds (a script that waits longer says what for, and stops)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)  # a poll of a condition with a deadline
    return value


def stop_daemons(
    daemons: Iterable[subprocess.Popen[bytes]], home: Path | None, timeout: float = 60
) -> None:
    """SIGTERM each daemon and wait for it (its jobs were done or are left to it), then
    remove the throwaway state folder ``home``."""
    for daemon in daemons:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
