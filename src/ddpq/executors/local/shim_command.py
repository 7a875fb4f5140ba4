"""The shim's command line: its flags for one attempt, and how it is started by exec.

Shared by the local executor's spawner (forked by the fork server, or by exec) and the
Slurm executor's batch script, which runs the same shim on the allocated node.
"""

from __future__ import annotations

from pathlib import Path

from ddpq.config import Settings
from ddpq.executors.base import Launch
from ddpq.executors.contract import job_argv, own_tmp
from ddpq.jobdir import JobDir

SHIM = Path(__file__).with_name("shim.py")


def shim_args(
    folder: JobDir, cwd: str, grace_s: float, log_cap: int, tmp: Path | None
) -> list[str]:
    """The shim's flags, up to and with ``--``; every one is required (the daemon's settings
    are the one place their values come from). ``tmp``: the attempt's own temporary folder
    (``contract.own_tmp``), None where the job chose its TMPDIR."""
    return [
        "--job-dir",
        str(folder.path),
        "--log",
        str(folder.log),
        "--record",
        str(folder.exit_record),
        "--cwd",
        cwd,
        "--grace",
        repr(grace_s),
        "--log-cap",
        str(log_cap),
        "--tmp",
        "" if tmp is None else str(tmp),
        "--",
    ]


def shim_argv(
    python: str, folder: JobDir, cwd: str, grace_s: float, log_cap: int, tmp: Path | None
) -> list[str]:
    """``python -S shim.py`` and its flags: -S, no site-packages, so the shim starts in
    ~10 ms (it needs only the standard library)."""
    return [python, "-S", str(SHIM), *shim_args(folder, cwd, grace_s, log_cap, tmp)]


def gated(shim: list[str], gate: int, cgroup: Path | None) -> list[str]:
    """The shim's command line plus the handshake: wait on ``gate`` before starting the
    job; ``cgroup`` is where the worker puts it (when it says so on the pipe)."""
    at = shim.index("--job-dir")
    extra = ["--wait-fd", str(gate)] + (["--cgroup", str(cgroup)] if cgroup is not None else [])
    return shim[:at] + extra + shim[at:]


def attempt_args(launch: Launch, folder: JobDir, cfg: Settings) -> list[str]:
    """The shim's flags for ``launch`` in ``folder`` and, after ``--``, the job's own
    command: with the preemption it may get and, for a session, its terminal."""
    args = shim_args(folder, launch.spec.cwd, cfg.grace_s, cfg.log_cap_bytes, own_tmp(launch))
    if launch.preempt_with is not None:
        at = args.index("--")
        shield = "1" if launch.spec.launcher == "torchrun" else "0"
        preempt = ["--preempt-signal", launch.preempt_with, "--preempt-shield", shield]
        args[at:at] = [*preempt, "--preempt-grace", repr(cfg.preempt_grace_s)]
    if launch.spec.interactive:
        at = args.index("--")
        term = ["--pty", "1", "--socket", str(folder.tty_socket), "--notice"]
        args[at:at] = [*term, str(folder.notice)]
    return args + job_argv(launch, cfg.python)
