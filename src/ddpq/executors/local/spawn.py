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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from ddpq.config import Settings
from ddpq.core.disposition import attempt_header
from ddpq.executors.accounts import Account, account_for
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.contract import job_env
from ddpq.executors.local import cgroups, gpu_fence, limits, procs, shim_shm
from ddpq.executors.local.forkclient import (
    ForkServer,
    ForkServerLost,
    ForkServerUnavailable,
    Ticket,
)
from ddpq.executors.local.launch_errors import FolderFull, folder_writes, launch_error
from ddpq.executors.local.shim_command import SHIM, attempt_args, gated
from ddpq.executors.local.shim_record import RECORD_SPACE
from ddpq.jobdir import SHIM_SCRATCH, JobDir, make_folder, open_for_append

SPAWN_ENV = "DDPQ_SPAWN"  # fork (the fork server, the default) | exec
# The daemon itself runs with umask 077; a job gets the usual one. Its folder is 0700,
# so what it writes there stays private all the same.
JOB_UMASK = 0o022
# How long a failed start waits for a shim forked meanwhile to be gone from its cgroup.
UNDO_TIMEOUT_S = 2.0
# Requests sent to the fork server ahead of their answers, at most. Unread datagrams count
# against their sender's socket buffer: with ~290 answers unread (Linux's default 208 KiB)
# the server waited to answer while the worker waited to send it the next request, until
# REPLY_TIMEOUT_S sent the rest of a large pass to the exec path. A few ahead are enough
# for the server to fork while the worker prepares the next job.
AHEAD = 4

_T = TypeVar("_T")
_R = TypeVar("_R")
Warn = Callable[[str, str], None]  # (what, message): the executor logs each "what" once
# A shim's PID, its Popen if we are its parent, and whether it is in its cgroup.
Started = tuple[int, subprocess.Popen[bytes] | None, bool]


# What a job runs as: uid, primary gid, and every group of the account (a login's).
Credentials = tuple[int, int, list[int]]


def credentials(account: Account) -> Credentials:
    """The account's ids with its supplementary groups, as ``initgroups`` would give them:
    a job reads what its owner can read, group-shared data sets included."""
    return account.uid, account.gid, os.getgrouplist(account.name, account.gid)


@dataclass(frozen=True)
class Asked:
    """A shim asked for: ``how``, the fork server's answer still to come (its ticket), or
    the shim already started by exec; ``gate`` is the write end of its gate."""

    launch: Launch
    gate: int
    cgroup: Path | None
    how: Ticket | Started


@dataclass(frozen=True)
class Spawned:
    """A shim waiting at its gate: ``word`` written to ``gate`` lets it start the job."""

    ident: procs.Identity
    gate: int
    word: bytes
    child: subprocess.Popen[bytes] | None  # ours to reap (the exec path), else the server's


class Spawner:
    """Starts shims for one worker: through the fork server, or by exec where that fails
    (``DDPQ_SPAWN=exec`` asks for the exec path)."""

    def __init__(
        self,
        settings: Settings,
        tracking: cgroups.Tracking,
        omp_threads: int,
        warn: Warn,
        confines: limits.Limits | None = None,
    ) -> None:
        self.settings = settings
        self.tracking = tracking
        self.limits = confines if confines is not None else limits.Limits()
        self.omp_threads = omp_threads
        self.warn = warn
        wanted = os.environ.get(SPAWN_ENV, "fork").strip().lower()
        self.forkserver: ForkServer | None = (
            ForkServer(settings.python, settings.jobs_dir) if wanted != "exec" else None
        )
        # A /dev/shm of each job's own (shim_shm): mounting one needs root, and the fork
        # server's child is root until it becomes the job's account. A shim started by
        # exec (the fork server gone) runs as the account from its start: the host's.
        self.private_shm = settings.private_shm and os.geteuid() == 0
        if self.private_shm and under_shm(str(settings.jobs_dir)):
            # A job's own /dev/shm would hide its folder from its shim (benchmarks put a
            # state folder on that tmpfs): every job would be lost.
            self.private_shm = False
            warn("private-shm", "job folders under /dev/shm: jobs get the host's /dev/shm")

    def describe(self) -> str:
        return "shims forked by a fork server" if self.forkserver else "shims started by exec"

    def close(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()

    def spawn_many(self, launches: Sequence[Launch]) -> list[Spawned | LaunchFailed]:
        """Start a shim for each launch, in order; each a waiting shim or why it failed.

        Requests go to the fork server ahead of their answers, ``AHEAD`` at most: it
        forks one shim while this thread prepares the next job's folder and cgroup,
        instead of each job waiting for its fork in turn (bench/RESULTS.md, "a pass's
        forks")."""
        spawned: list[Spawned | LaunchFailed] = []
        asked: deque[Asked | LaunchFailed] = deque()
        for launch in launches:
            if len(asked) >= AHEAD:
                spawned.append(self._answered_alone(asked.popleft()))
            asked.append(self._failing_alone(self._ask, launch))
        spawned += [self._answered_alone(a) for a in asked]
        return spawned

    def _answered_alone(self, asked: Asked | LaunchFailed) -> Spawned | LaunchFailed:
        return (
            asked if isinstance(asked, LaunchFailed) else self._failing_alone(self._answered, asked)
        )

    def _failing_alone(self, step: Callable[[_T], _R], given: _T) -> _R | LaunchFailed:
        try:
            return step(given)
        except Exception as exc:  # whatever it is, it fails this job, not the others
            # A lost fork: its gate is closed, so a shim forked for it ends without running
            # the job, which may start again. No room: nothing started, it waits for room.
            lost = isinstance(exc, ForkServerLost)
            full = isinstance(exc, FolderFull)
            failed = LaunchFailed(launch_error(exc), interrupted=lost, put_off=full)
            failed.__cause__ = exc
            return failed

    def _ask(self, launch: Launch) -> Asked:
        """Everything up to the shim's fork: its folder, log, cgroup and limits, and the
        request to the fork server (or the shim itself, started by exec)."""
        cfg = self.settings
        # Only a token says who the owner really is; without --auth jobs run as the daemon.
        account = account_for(launch.spec.owner, launch.unix_account) if cfg.auth else None
        # Switching to the account we already are is a no-op, and asking Popen for it
        # would stop it from using vfork: a full fork of the daemon per job.
        switch = account is not None and account.uid != os.geteuid()
        folder = JobDir(launch.job_dir)
        owner = (account.uid, account.gid) if account is not None and switch else None
        env = job_env(launch, os.environ, self.omp_threads, cfg.preempt_grace_s)
        if account is not None:
            env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        ids = credentials(account) if account is not None and switch else None
        with folder_writes():  # a full disk here puts the launch off (FolderFull)
            # A folder that was there before the first attempt is not this job's: aside.
            make_folder(folder, launch.attempt == 1, owner)
            # The exit record's room, taken before anything runs (shim_record.RESERVED): a
            # disk filled later still lets the end be recorded.
            with open_for_append(folder.path / SHIM_SCRATCH[0], owner) as room:
                room.write(b" " * RECORD_SPACE)
            # The log, its attempt's header written, is also the shim's stderr: what the
            # shim itself has to say (a record it cannot write) is read where the job's
            # output is, and no file more is made per attempt.
            log = open_for_append(folder.log, owner)
            try:
                when = time.strftime("%Y-%m-%d %H:%M:%S")
                log.write(attempt_header(when, launch.gpus, launch.port).encode())
                log.flush()
            except BaseException:
                log.close()
                raise
        with log:
            return self._request(launch, folder, log, env, ids)

    def _request(
        self,
        launch: Launch,
        folder: JobDir,
        log: BinaryIO,
        env: dict[str, str],
        ids: Credentials | None,
    ) -> Asked:
        """``_ask``'s rest, in the job's folder with its log open: the attempt's cgroup
        and limits, and the shim asked for."""
        cfg = self.settings
        cgroup = self._new_cgroup(launch)
        try:
            # Its cores, memory and processes: set before anything of the job runs.
            joins = limits.confine(self.limits, launch, cgroup)
        except OSError:
            if cgroup is not None:
                cgroups.remove(cgroup)
            raise
        args = attempt_args(launch, folder, cfg)
        # The shim waits on this pipe before it starts the job: until the worker has stored
        # its handle (so a restarted worker finds it), and until it is in its cgroup and
        # fenced to its GPUs (so nothing of the job starts outside).
        gate_r, gate_w = os.pipe()
        try:
            # A job working under /dev/shm keeps the host's: its own would hide that folder.
            shm = (not under_shm(launch.spec.cwd), launch.ram_bytes)
            how = self._send(
                args, env, ids, (cgroup, joins), (gate_r, log.fileno()), shm
            ) or self._exec(args, env, ids, (cgroup, joins), gate_r, log)
        except BaseException:
            self._undo(launch, gate_w, cgroup)
            raise
        finally:
            os.close(gate_r)
        return Asked(launch, gate_w, cgroup, how)

    def _answered(self, asked: Asked) -> Spawned:
        """The shim of ``asked``, once the fork server has said it forked it."""
        started = asked.how
        if isinstance(started, Ticket):
            assert self.forkserver is not None  # only it gives tickets
            try:
                pid = self.forkserver.answer(started)
            except BaseException:
                self._undo(asked.launch, asked.gate, asked.cgroup)
                raise
            # The child joins its cgroup itself, before it waits at the gate.
            started = (pid, None, asked.cgroup is not None)
        pid, child, joined = started
        word = self._fence(asked.launch, asked.cgroup) if joined else b"s"
        # The shim waits for our word, so it has not started the job: its identity is there
        # (unless it failed before, as one that cannot join its cgroup does: then it reads
        # as ended, and its record says why).
        ident = procs.identity(pid) or procs.Identity(pid, 0)
        return Spawned(ident, asked.gate, word, child)

    def _undo(self, launch: Launch, gate: int, cgroup: Path | None) -> None:
        """A start that failed: its gate closed (a shim forked meanwhile would record that
        nothing ran), its cgroup and its limits' given back. A fork whose answer failed
        may have left a shim in its cgroup, which could then not be removed: it is killed
        first (nothing of the job ran, and nobody watches that attempt)."""
        os.close(gate)
        if cgroup is not None and not cgroups.destroy(cgroup, UNDO_TIMEOUT_S):
            self.warn("cgroup-undo", f"cannot empty {cgroup} after a failed start")
        limits.release(self.limits, launch.job_id, launch.attempt)

    def _send(
        self,
        args: list[str],
        env: dict[str, str],
        ids: Credentials | None,
        where: tuple[Path | None, list[Path]],
        fds: tuple[int, int],
        shm: tuple[bool, int | None],
    ) -> Ticket | None:
        """The request to the fork server; None if there is none (then the exec path is
        taken). ``where``: the attempt's cgroup (v2) and the cgroups of its limits (v1);
        ``fds``: the shim's gate and stderr; ``shm``: whether the job may have a /dev/shm
        of its own, and its size (the job's memory limit; None: tmpfs's default)."""
        cgroup, joins = where
        gate, stderr = fds
        if self.forkserver is None:
            return None
        argv = args if cgroup is None else ["--cgroup", str(cgroup), *args]
        try:
            return self.forkserver.send(
                argv,
                env,
                uid=ids[0] if ids else None,
                gid=ids[1] if ids else None,
                groups=ids[2] if ids else None,
                umask=JOB_UMASK,
                cgroup=cgroup,
                gate=gate,
                stderr=stderr,
                limits=joins,
                private_shm=self.private_shm and shm[0],
                shm_size=shm[1],
            )
        except ForkServerUnavailable as exc:
            self.warn("forkserver", f"{exc}; starting shims by exec until it is back")
            return None

    def _exec(
        self,
        args: list[str],
        env: dict[str, str],
        ids: Credentials | None,
        where: tuple[Path | None, list[Path]],
        gate: int,
        stderr: BinaryIO,
    ) -> Started:
        cgroup, joins = where
        argv = gated([self.settings.python, "-S", str(SHIM), *args], gate, cgroup)
        child = subprocess.Popen(
            argv,
            # No cwd here: the shim enters it once it runs as the job's account.
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            pass_fds=(gate,),
            umask=JOB_UMASK,
            user=ids[0] if ids else None,
            group=ids[1] if ids else None,
            extra_groups=ids[2] if ids else None,
        )
        try:
            for path in joins:  # the shim waits at its gate: nothing of the job runs yet
                cgroups.add(path, child.pid)
        except OSError:
            child.kill()  # a job is never run without the limits it was given
            child.wait()
            raise
        joined = False
        if cgroup is not None:
            try:
                cgroups.add(cgroup, child.pid)
                joined = True
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # not "the shim has exited already"
                    self.warn("cgroup-add", f"cannot move a shim into {cgroup}: {exc}")
                cgroups.remove(cgroup)
        return child.pid, child, joined

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

    def _fence(self, launch: Launch, cgroup: Path | None) -> bytes:
        """The word for a shim in its cgroup: b"c", or b"f" once its GPUs are fenced."""
        if cgroup is None or self.tracking.fence_error is not None:
            return b"c"
        try:
            gpu_fence.attach(
                cgroup, launch.gpus if launch.device_gpus is None else launch.device_gpus
            )
        except gpu_fence.FenceUnavailable as exc:
            self.warn("fence", f"jobs run without a GPU fence: {exc}")
            return b"c"
        # Real GPUs: CUDA now sees only the leased ones, numbered from 0; the shim
        # renumbers CUDA_VISIBLE_DEVICES to match.
        return b"c" if self.settings.fake_gpus is not None else b"f"


def under_shm(path: str) -> bool:
    """Whether ``path`` lies on the host's /dev/shm, which a job's own would hide. As
    text, never by looking: the worker is root and a job's cwd is its user's word (a link
    there would be followed with root's rights, a hung mount would hang the pass). A
    path that reaches /dev/shm only through a link finds the job's own, empty, and the
    job fails to enter it, saying so."""
    shm = os.fsdecode(shim_shm.SHM)
    where = os.path.normpath(path)
    return where == shm or where.startswith(shm + "/")


def let_run(spawned: Spawned) -> None:
    """Give the shim its word: it starts the job."""
    with contextlib.suppress(OSError):  # the shim is gone already: gathered as ended
        os.write(spawned.gate, spawned.word)
    os.close(spawned.gate)


def abandon(spawned: Spawned) -> None:
    """Close the shim's gate without a word: it records that nothing ran, and exits."""
    os.close(spawned.gate)
