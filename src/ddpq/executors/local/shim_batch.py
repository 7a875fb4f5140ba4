"""A batch job under its shim: the job forked with its output on a pipe, and the relay that
writes that output into the capped log until the job and everything holding the pipe are
gone, stopping the job (and preempting it) as the shim is asked to.

Standard library only, beside the shim and imported by it (``shim.py`` says how it is
found when run by its path with ``python -S``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

if __package__:
    from ddpq.executors.local import shim_log, shim_procs, shim_record, shim_signals
else:
    import shim_log  # type: ignore[import-not-found,no-redef]
    import shim_procs  # type: ignore[import-not-found,no-redef]
    import shim_record  # type: ignore[import-not-found,no-redef]
    import shim_signals  # type: ignore[import-not-found,no-redef]

# The signals the shim handles, and the two Python ignores for itself: an ignored signal
# stays ignored across exec, and `yes | head` in a job would then never end.
RESET_IN_JOB = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGCHLD,
    signal.SIGUSR1,
    *sorted(shim_signals.PYTHON_IGNORES),
)
STARTED: list[subprocess.Popen[bytes]] = []  # the job started, kept (fork_job says why)
NOT_RUN_EXIT = 127  # a command that could not be run, as a shell says it
MAX_WHY_BYTES = 1024  # of why a forked job's exec failed (a pipe's buffer holds it whole)
POLL_S = 0.5  # the longest the relay sleeps without looking at its signals and children


def fork_job(
    cmd: list[str], out_w: int, preempt_with: int | None, shield: bool
) -> tuple[int, str | None]:
    """Start ``cmd`` as the leader of its own process group, its stdout and stderr on
    ``out_w``, stdin from /dev/null; the child's pid, and why the command could not be
    run, if it could not (the child then says it into the log too, and exits 127).
    ``shield``: the job's first process is a launcher (torchrun) that
    ignores ``preempt_with`` and lets its ranks handle it.

    Started by ``subprocess`` where it can be: its child shares this process's memory
    until it has exec'd (vfork), where a fork copies the shim's page tables and then
    faults on every page either side writes: 2.5–3 ms of CPU of a short job's start
    (bench/RESULTS.md, "the shim's share"). Not ``os.posix_spawn``: the C library's leaves
    its own two real-time signals ignored in the job. Forked where neither can say it: a
    signal to ignore in the job, or a command that cannot start (the fork's child writes
    why into the log and to this process, exit 127)."""
    if not (preempt_with is not None and shield):
        try:
            job = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                close_fds=False,  # as a fork's child: descriptors not marked to close stay
                process_group=0,
                restore_signals=True,  # SIGPIPE and SIGXFSZ back to their defaults
            )
        except OSError:
            pass  # said by the fork below, as for any command that cannot start
        else:
            # Kept for the shim's life: a Popen collected would wait for the job itself
            # and take the exit status the relay reaps (shim_procs.reap_children).
            STARTED.append(job)
            return job.pid, None
    # The child tells why its exec failed through a pipe that the exec itself closes:
    # an empty read means the command runs.
    said_r, said_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError:
        os.close(said_r)
        os.close(said_w)
        raise
    if pid:
        os.close(said_w)
        with os.fdopen(said_r, "rb") as said:
            why = said.read(MAX_WHY_BYTES).decode(errors="replace")
        return pid, why or None
    try:  # the job
        os.close(said_r)
        os.setpgid(0, 0)
        for s in RESET_IN_JOB:
            signal.signal(s, signal.SIG_DFL)
        if preempt_with is not None and shield:
            # Ignored by the launcher and inherited so by its ranks, which install a
            # handler of their own (a Python one may; a shell could not trap it then).
            signal.signal(preempt_with, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
    except OSError as exc:
        why = f"could not start the job: {exc}"
        os.write(2, f"ddpq: {why}\n".encode())
        os.write(said_w, why.encode()[:MAX_WHY_BYTES])
        os._exit(NOT_RUN_EXIT)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        why = not_run(cmd[0], exc)
        os.write(2, f"ddpq: {why}\n".encode())
        os.write(said_w, why.encode()[:MAX_WHY_BYTES])
    os._exit(NOT_RUN_EXIT)


def not_run(program: str, exc: OSError) -> str:
    """Why ``program`` could not be run: the job's log and its reason say the same."""
    return f"cannot run {program!r}: {exc.strerror}"


class Relay:
    """The job's output into its log until the job has ended and no process holds its pipe.

    ``stop`` is the shim's record of what it was asked (its signal handlers write it):
    ``at``, when a stop came (SIGTERM to the job's group, then SIGKILL to every process of
    the job after ``grace``); ``preempt_at``, when a preemption came (``preempt_with`` to
    every process of the job, then a stop if it has not ended after ``preempt_grace``).
    ``job`` is how the job's processes are found: its session, marker and start ticks.
    """

    def __init__(
        self,
        pid: int,
        out_r: int,
        wake: int,
        log: shim_log.CappedLog,
        stop: dict[str, float],
        grace: float,
        preempt: tuple[int | None, float],
        job: tuple[int, bytes, int],
    ) -> None:
        self.pid, self.out_r, self.wake, self.log, self.stop = pid, out_r, wake, log, stop
        self.grace = grace
        self.preempt_with, self.preempt_grace = preempt
        self.job = job
        self.error: str | None = None  # the log could not be written: why
        self.status: int | None = None  # the job's wait status, once reaped
        self.pipe_open = True
        self.termed = self.killed = self.preempted = False

    def run(self) -> int:
        """Relay and supervise until the job and its pipe's holders are gone; its status."""
        while self.status is None or self.pipe_open:
            self._act_on_requests()
            fds = [self.wake] + ([self.out_r] if self.pipe_open else [])
            try:
                ready, _, _ = select.select(fds, [], [], self._timeout())
            except InterruptedError:
                ready = []
            if self.wake in ready:
                try:
                    os.read(self.wake, 512)
                except BlockingIOError:
                    pass
            if self.pipe_open and self.out_r in ready:
                self._read_output()
            if self.status is None:
                shim_procs.reap_children()
                self.status = shim_procs.MAIN.get("status")
        return self.status

    def _act_on_requests(self) -> None:
        """Preempt, stop, kill: each once, when its time has come."""
        stop = self.stop
        if stop["preempt_at"] and not self.preempted and self.preempt_with is not None:
            self.preempted = True
            # Every process of the job, not its process group alone: torchrun starts each
            # rank in a session of its own. The launcher itself ignores the signal.
            for member in shim_procs.job_members(*self.job):
                try:
                    os.kill(member, self.preempt_with)
                except OSError:
                    pass
        if (
            self.preempted
            and not stop["at"]
            and time.monotonic() - stop["preempt_at"] >= self.preempt_grace
        ):
            stop["at"] = time.monotonic()  # it did not checkpoint in time: stop it
        if stop["at"] and not self.termed:
            self.termed = True
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.termed and not self.killed and time.monotonic() - stop["at"] >= self.grace:
            self.killed = True
            shim_procs.kill_everything(*self.job)
        if self.status is not None and self.pipe_open:
            # The job is gone; whatever still holds the pipe is a straggler.
            shim_procs.kill_everything(*self.job)

    def _timeout(self) -> float:
        """How long to wait for output: until the next deadline, at most POLL_S."""
        if self.termed and not self.killed:
            return max(0.0, min(POLL_S, self.stop["at"] + self.grace - time.monotonic()))
        if self.preempted and not self.termed:
            deadline = self.stop["preempt_at"] + self.preempt_grace
            return max(0.0, min(POLL_S, deadline - time.monotonic()))
        return POLL_S

    def _read_output(self) -> None:
        while True:
            try:
                chunk = os.read(self.out_r, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self.pipe_open = False
                return
            if self.error is None:
                try:
                    self.log.write(chunk)
                except OSError as exc:
                    self.error = shim_record.disk_error("writing the job's log", exc)
                    self.stop["at"] = self.stop["at"] or time.monotonic()
                    self.grace = 0.0
