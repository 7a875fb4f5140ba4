"""A real Slurm for the tests: munged, slurmctld and two slurmd on loopback, up in well
under a second, all state in one temporary folder.

Debian's ``slurm-wlm`` and ``munge`` (installed by ``make slurm``; nothing is installed
here). Two nodes, ``n1`` and ``n2``, each with 4 GPUs declared as GRES and backed by
character devices made with ``mknod`` (major 195, as NVIDIA's): Slurm sets
``CUDA_VISIBLE_DEVICES`` from them as it would from real ones, and a job on both nodes is a
real multi-node allocation, though both are this machine. Process tracking by
``/proc`` (``proctrack/linuxproc``), no task plugin: what works in a container. Every
port is picked free; ``SLURM_CONF`` points Slurm's commands at this cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import free_port

NODES = ("n1", "n2")
GPUS_PER_NODE = 4
CPUS_PER_NODE = 16  # more than the machine has (config_overrides): many small jobs at once
PARTITION = "debug"
DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why this machine cannot run the test Slurm; None if it can."""
    absent = [name for name in (*DAEMONS, "sbatch") if shutil.which(name) is None]
    if absent:
        return (
            f"Slurm is not installed here ({', '.join(absent)} not found): `make slurm` "
            "installs Debian's slurm-wlm and munge (as root, with apt-get)"
        )
    if os.geteuid() != 0:
        return "the test Slurm runs slurmd, which starts jobs as their users: it needs root"
    return None


class CannotRunHere(RuntimeError):
    """This machine lets Slurm's daemons start but not run (the message says why)."""


@dataclass
class SlurmCluster:
    root: Path
    quick: bool = True
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_in_s: float = 0.0

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, **kw: str) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster (``input=`` as standard input)."""
        done = subprocess.run(
            argv,
            input=kw.get("input", ""),
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=30,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {done.returncode}: {done.stderr}")
        return done

    # ---- start -------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, timeout: float = 30.0, *, quick: bool = True) -> SlurmCluster:
        """``quick``: Slurm schedules a released job at its next second, not after its
        default ``batch_sched_delay`` of 3 s, and backfills every second, not every 30 s
        (which is when it tells a job's reason to wait): the tests wait less. ``bench/``
        measures both."""
        began = time.monotonic()
        cluster = cls(root, quick=quick)
        try:
            cluster._write_files()
            cluster._start_munge(timeout)
            cluster._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)])
            for node in NODES:
                argv = ["slurmd", "-D", "-N", node, "-f", str(cluster.conf)]
                cluster._spawn(f"slurmd-{node}", argv)
            cluster._wait_idle(timeout)
        except BaseException:
            cluster.stop()
            raise
        cluster.started_in_s = time.monotonic() - began
        return cluster

    def _write_files(self) -> None:
        r = self.root
        for sub in ("munge-key", "state", "spool", "log", "dev"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "munge-key").chmod(0o700)
        # Other accounts (a job's owner) must reach the config and munge's socket.
        r.chmod(0o755)
        key = r / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(GPUS_PER_NODE):
            dev = r / "dev" / f"nvidia{i}"
            with contextlib.suppress(FileExistsError):
                try:
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(195, i))
                except PermissionError:  # a container without mknod: a file stands in
                    dev.touch(0o666)
        ctld, *slurmd = (free_port() for _ in range(1 + len(NODES)))
        gpus = f"{r}/dev/nvidia[0-{GPUS_PER_NODE - 1}]"
        nodes = [
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} RealMemory=4000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for node, port in zip(NODES, slurmd, strict=True)
        ]
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=ddpqtest",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={ctld}",
                    "SlurmUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool/%n",
                    f"SlurmctldPidFile={r}/slurmctld.pid",
                    f"SlurmdPidFile={r}/slurmd-%n.pid",
                    f"SlurmctldLogFile={r}/log/slurmctld.log",
                    f"SlurmdLogFile={r}/log/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "SchedulerType=sched/backfill",
                    *(
                        ["SchedulerParameters=batch_sched_delay=0,bf_interval=1"]
                        if self.quick
                        else []
                    ),
                    "KillWait=2",
                    "MinJobAge=300",
                    "SlurmdTimeout=300",
                    "InactiveLimit=0",
                    *nodes,
                    f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES "
                    "MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        lines = [f"NodeName={node} Name=gpu File={gpus}" for node in NODES]
        (r / "gres.conf").write_text("\n".join(lines) + "\n")
        # Slurm 22.05's slurmd loads a cgroup plugin whatever the tracking; the jobs here
        # use none of it.
        (r / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge.socket"

    def _start_munge(self, timeout: float) -> None:
        r = self.root
        argv = ["munged", "--foreground", "--force", f"--socket={self.munge_socket}"]
        argv += [f"--key-file={r}/munge-key/munge.key", f"--pid-file={r}/munged.pid"]
        argv += [f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge-key/seed"]
        self._spawn("munged", argv)
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged's socket")

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    logs = self.logs()
                    if "Unable to initialize cgroup plugin" in logs:
                        # Slurm 22.05's slurmd needs a cgroup hierarchy it may write
                        # (a container without one cannot host a slurmd at all).
                        raise CannotRunHere(
                            f"{name} cannot start here: Slurm's cgroup plugin finds no "
                            "cgroup hierarchy it may use (a restricted container?)"
                        )
                    raise RuntimeError(f"{name} exited ({proc.returncode}):\n{logs}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{self.logs()}")
            time.sleep(0.02)

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            done = self.run("sinfo", "--Node", "--noheader", "--format=%N %T", check=False)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            return done.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

        self._wait(idle, timeout, "both nodes to be idle (sinfo)")

    def logs(self, lines: int = 15) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(out)

    # ---- use -----------------------------------------------------------------------

    def job_ids(self) -> list[str]:
        done = self.run("squeue", "--noheader", "--format=%i", check=False)
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def state(self, job_id: str) -> tuple[str, str]:
        """squeue's state and reason of one job ("" if it does not know it)."""
        argv = ["squeue", "--noheader", "--states=all", "--format=%T|%r", f"--jobs={job_id}"]
        done = self.run(*argv, check=False)
        state, _, reason = done.stdout.strip().partition("|")
        return state, reason

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until Slurm has ended them all."""
        ids = self.job_ids()
        if ids:
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + timeout
        while self.job_ids() and time.monotonic() < deadline:
            time.sleep(0.05)

    # ---- stop ----------------------------------------------------------------------

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.cancel_all()
        for name in reversed(list(self.procs)):  # slurmd first, munged last
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
