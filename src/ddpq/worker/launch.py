"""How one job is started: its environment (the job contract) and its command line."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpq.store.users import UNIX_NAME

SHIM = Path(__file__).with_name("shim.py")
# The daemon itself runs with umask 077; a job gets the usual one. Its folder is 0700,
# so what it writes there stays private all the same.
JOB_UMASK = 0o022


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    job_dir: Path
    command: list[str]
    launcher: str  # plain | torchrun
    gpus: Sequence[int]
    port: int | None
    nproc: int
    cwd: str
    env: Mapping[str, str]
    attempt: int = 1


def threads_per_rank(cpu_count: int, total_gpus: int) -> int:
    """Cores divided among the most ranks this host can run at once, at least 1."""
    return max(1, cpu_count // max(1, total_gpus))


def job_env(spec: LaunchSpec, base: Mapping[str, str], omp_threads: int) -> dict[str, str]:
    env = dict(base)
    # Variables of the daemon's own that must not leak into a job.
    for key in [k for k in env if k.startswith("DDPQ_")]:
        del env[key]
    env.setdefault("OMP_NUM_THREADS", str(omp_threads))
    env.update(spec.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus),
            # NVML (which ddpq leases by) numbers GPUs in PCI bus order; CUDA's
            # default order is "fastest first". Without this, GPU 0 to ddpq
            # and GPU 0 to the job could be different cards.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "MASTER_ADDR": "127.0.0.1",
            "DDPQ_JOB_ID": str(spec.job_id),
            "DDPQ_JOB_DIR": str(spec.job_dir),
            # A retried job can tell it is a retry (e.g. to resume from a checkpoint).
            "DDPQ_ATTEMPT": str(spec.attempt),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if spec.port is not None:
        env["MASTER_PORT"] = str(spec.port)
    return env


def job_argv(spec: LaunchSpec, python: str) -> list[str]:
    if spec.launcher != "torchrun":
        return list(spec.command)
    assert spec.port is not None
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(spec.nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(spec.port),
        "--max-restarts",
        "0",
        *spec.command,
    ]


def shim_argv(
    python: str, job_dir: Path, cwd: str, grace_s: float, log_cap: int, argv: list[str]
) -> list[str]:
    # -S: no site-packages, so the shim starts in ~10 ms; it needs only the stdlib.
    return [
        python,
        "-S",
        str(SHIM),
        "--job-dir",
        str(job_dir),
        "--cwd",
        cwd,
        "--grace",
        repr(grace_s),
        "--log-cap",
        str(log_cap),
        "--",
        *argv,
    ]


class NoAccount(LookupError):
    pass


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def account_for(owner: str, mapped: str | None) -> Account | None:
    """The Unix account a job runs as; None means "as the daemon itself".

    Only a root daemon can switch users. Then a job runs as the account its owner
    is explicitly mapped to (``ddpq admin user add NAME --unix-user ACCOUNT``), and
    never as one that merely shares the owner's name: a ddpq user called ``root``
    or ``daemon`` gets no system account by accident.
    """
    if os.geteuid() != 0:
        return None
    if mapped is None or not UNIX_NAME.match(mapped):
        raise NoAccount(
            f"owner {owner!r} is mapped to no Unix account on this host; map one with "
            f"`ddpq admin user map {owner} ACCOUNT`"
        )
    try:
        entry = pwd.getpwnam(mapped)
    except KeyError:
        raise NoAccount(
            f"owner {owner!r} is mapped to Unix account {mapped!r}, which does not exist here"
        ) from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
