"""Starting one attempt on this host: its folder, its shim, its cgroup.

The shim (``shim.py``, standard library only) is the job's parent: the worker starts it
in a new session, as the job's account, with ``--wait-fd``; puts it in the attempt's
cgroup and fences its GPUs; then writes one byte on the pipe that lets it start the job.
So every process of the job starts inside its cgroup, before it could fork anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.disposition import attempt_header
from ddpq.executors.accounts import Account, NoAccount, account_for
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.contract import job_argv, job_env
from ddpq.executors.local import cgroups, gpu_fence, procs
from ddpq.jobdir import JobDir, open_for_append

SHIM = Path(__file__).with_name("shim.py")
# The daemon itself runs with umask 077; a job gets the usual one. Its folder is 0700,
# so what it writes there stays private all the same.
JOB_UMASK = 0o022

Warn = Callable[[str, str], None]  # (what, message): the executor logs each "what" once


@dataclass(frozen=True)
class Spawned:
    child: subprocess.Popen[bytes]
    ident: procs.Identity


def shim_argv(python: str, folder: JobDir, cwd: str, grace_s: float, log_cap: int) -> list[str]:
    """The shim's command line up to ``--``; every flag is required (the daemon's settings
    are the one place their values come from). -S: no site-packages, so the shim starts in
    ~10 ms; it needs only the standard library."""
    return [
        python,
        "-S",
        str(SHIM),
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
        "--",
    ]


def gated(shim: list[str], gate: int, cgroup: Path | None) -> list[str]:
    """The shim's command line plus the handshake: wait on ``gate`` before starting the
    job; ``cgroup`` is where the worker puts it (when it says so on the pipe)."""
    at = shim.index("--job-dir")
    extra = ["--wait-fd", str(gate)] + (["--cgroup", str(cgroup)] if cgroup is not None else [])
    return shim[:at] + extra + shim[at:]


def launch_error(exc: BaseException) -> str:
    """Why a launch failed, in words for the job's reason."""
    if isinstance(exc, NoAccount):
        return str(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot start the job: {exc.filename} does not exist"
    if isinstance(exc, PermissionError):
        return f"cannot start the job: permission denied ({exc.filename or exc})"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "cannot start the job: no space left on device"
    return f"cannot start the job: {exc}"


class Spawner:
    """Starts shims for one worker: the settings, cgroup tree and thread count it uses."""

    def __init__(
        self, settings: Settings, tracking: cgroups.Tracking, omp_threads: int, warn: Warn
    ) -> None:
        self.settings = settings
        self.tracking = tracking
        self.omp_threads = omp_threads
        self.warn = warn

    def spawn(self, launch: Launch) -> Spawned:
        try:
            return self._spawn(launch)
        except Exception as exc:  # whatever it is, it fails this job, not the others
            raise LaunchFailed(launch_error(exc)) from exc

    def _spawn(self, launch: Launch) -> Spawned:
        cfg = self.settings
        # Only a token says who the owner really is; without --auth jobs run as the daemon.
        account = account_for(launch.owner, launch.unix_account) if cfg.auth else None
        # Switching to the account we already are is a no-op, and asking Popen for it
        # would stop it from using vfork: a full fork of the daemon per job.
        switch = account is not None and account.uid != os.geteuid()
        folder = JobDir(launch.job_dir)
        self._prepare_folder(folder, account)
        env = job_env(launch, os.environ, self.omp_threads)
        if account is not None:
            env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        owner = (account.uid, account.gid) if account is not None and switch else None
        with open_for_append(folder.log, owner) as out:
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(attempt_header(when, launch.gpus, launch.port).encode())
        cgroup = self._new_cgroup(launch)
        argv = shim_argv(cfg.python, folder, launch.cwd, cfg.grace_s, cfg.log_cap_bytes)
        argv += job_argv(launch, cfg.python)
        # The shim waits on this pipe before it starts the job, so the job is in its
        # cgroup (and fenced to its GPUs) before it can fork anything.
        gate_r, gate_w = os.pipe()
        try:
            with open_for_append(folder.shim_errors, owner) as err:
                child = subprocess.Popen(
                    gated(argv, gate_r, cgroup),
                    # No cwd here: the shim enters it once it runs as the job's account.
                    cwd="/",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(gate_r,),
                    umask=JOB_UMASK,
                    user=account.uid if account and switch else None,
                    group=account.gid if account and switch else None,
                    extra_groups=[] if account and switch else None,
                )
        except BaseException:
            os.close(gate_w)
            if cgroup is not None:
                cgroups.remove(cgroup)
            raise
        finally:
            os.close(gate_r)
        self._admit(child, launch, cgroup, gate_w)
        # The shim waits for our word, so it cannot have exited yet: its identity is there.
        ident = procs.identity(child.pid) or procs.Identity(child.pid, 0)
        return Spawned(child, ident)

    def _prepare_folder(self, folder: JobDir, account: Account | None) -> None:
        folder.path.mkdir(parents=True, exist_ok=True)
        folder.path.chmod(0o700)  # its owner's (and the daemon's) alone
        folder.exit_record.unlink(missing_ok=True)  # an earlier attempt's
        if account is not None:
            os.chown(folder.path, account.uid, account.gid)

    def _new_cgroup(self, launch: Launch) -> Path | None:
        tree = self.tracking.tree
        if tree is None:
            return None
        path = cgroups.job_cgroup(tree, launch.job_id, launch.attempt)
        try:
            cgroups.create(path)
        except OSError as exc:
            self.warn("cgroup", f"cannot create job cgroups ({exc}): tracking by session")
            return None
        return path

    def _admit(
        self, child: subprocess.Popen[bytes], launch: Launch, cgroup: Path | None, gate: int
    ) -> None:
        """Move the shim into the job's cgroup, fence its GPUs, then let it start the job."""
        word = b"s"
        try:
            if cgroup is not None:
                try:
                    cgroups.add(cgroup, child.pid)
                    word = b"c"
                except OSError as exc:
                    if exc.errno != errno.ESRCH:  # not "the shim has exited already"
                        self.warn("cgroup-add", f"cannot move a shim into {cgroup}: {exc}")
                    cgroups.remove(cgroup)
            if cgroup is not None and word == b"c" and self.tracking.fence_error is None:
                try:
                    gpu_fence.attach(cgroup, launch.gpus)
                    # Real GPUs: CUDA now sees only the leased ones, numbered from 0; the
                    # shim renumbers CUDA_VISIBLE_DEVICES to match.
                    word = b"c" if self.settings.fake_gpus is not None else b"f"
                except gpu_fence.FenceUnavailable as exc:
                    self.warn("fence", f"jobs run without a GPU fence: {exc}")
            with contextlib.suppress(OSError):  # the shim is gone already: gathered as lost
                os.write(gate, word)
        finally:
            os.close(gate)
