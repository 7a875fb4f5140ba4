"""``ddpq serve`` as two processes: the API in the process started, the worker in a child.

Why two: in one process the API and the worker share one interpreter lock, and the daemon
spends ~19 ms of CPU per job under it (the worker 13-18 ms, the API 3-7 ms): a ceiling near
50 jobs/s on one core, and every submission waits for the lock while the worker's pass
computes (bench/RESULTS.md, "the hot path on the slower kind of machine"). ``ddpq server``
beside ``ddpq worker`` already works on one state folder (the wake socket's nudges, the
write gate's ``flock``, re-adoption); ``serve`` forks its worker after the imports and the
migration and before any thread starts, so the child costs no second start-up.

What a user sees stays one daemon. The process started is the one the lock file names and
signals reach; it stops its worker (SIGTERM, then waits for it) before it exits. The child
leaves SIGINT to its parent (a terminal's Ctrl-C reaches both) and stops on SIGTERM (a
service manager may send it to both at once). If either half ends unasked, the other stops
too, with one line saying why: the parent sees its child's end (``waitid``), the child its
parent's (the end of their socket pair, which only the parent's exit closes).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import threading
from typing import NoReturn

from ddpq.config import ConfigError
from ddpq.daemon.watchdog import Shutdown, WorkerDied

log = logging.getLogger("ddpq")

READY = b"ready\n"
REFUSED = b"refused:"  # then the one line a failed start says (the worker's ConfigError)
DIED = b"died:"  # then why the worker failed, for the parent's last line
CLEAN = "exited with status 0"


def _described(code: int, status: int) -> str:
    """A process's end as ``waitid`` reports it (``si_code``, ``si_status``)."""
    if code not in (os.CLD_KILLED, os.CLD_DUMPED):
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(status).name}"
    except ValueError:
        return f"was killed by signal {status}"


class WorkerProcess:
    """The API's side: the worker child, its start, its end."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self._channel = channel  # held open while we live: its end is the child's signal
        self._said = channel.makefile("rb")
        self._lock = threading.Lock()
        self._ended: str | None = None  # how the child ended, once it has (not yet reaped)
        self._asked = False  # we asked it to stop
        self._watcher: threading.Thread | None = None

    def wait_ready(self) -> None:
        """Until the child has started its worker; ``ConfigError`` if its settings refused
        it (the child said nothing: the refusal stays a failed start's one line)."""
        said = self._said.readline()
        if said == READY:
            return
        ended = self._reap()
        if said.startswith(REFUSED):
            raise ConfigError(said[len(REFUSED) :].decode(errors="replace").strip())
        raise WorkerDied(f"the worker process {ended} while starting; see the log above")

    def watch(self, shutdown: Shutdown) -> None:
        """Stop the daemon if the child ends before it was asked to: as a failure (exit
        status 1), or, for a child stopped by a signal (a service manager's SIGTERM to
        both), as that signal would have stopped this process."""

        def wait() -> None:
            # WNOWAIT: the pid stays ours until the end is noted, so ``stop`` never signals
            # a process that reused it.
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            assert info is not None  # without WNOHANG waitid waits for the end
            with self._lock:
                self._ended = _described(info.si_code, info.si_status)
                asked = self._asked or shutdown.stopping
            os.waitpid(self.pid, 0)
            if asked:
                return
            if self._ended == CLEAN:
                log.info("the worker process (pid %d) stopped; stopping the API", self.pid)
                shutdown.stop()
                return
            said = self._said.readline()
            if said.startswith(DIED):  # the child logged it: one line, not two
                shutdown.fail(said[len(DIED) :].decode(errors="replace").strip())
                return
            why = f"the worker process (pid {self.pid}) {self._ended}"
            log.critical("%s; stopping the daemon (exit status 1)", why)
            shutdown.fail(why)

        self._watcher = threading.Thread(target=wait, name="ddpq-worker-process", daemon=True)
        self._watcher.start()

    def stop(self) -> str | None:
        """SIGTERM the child unless it has ended, and wait for it; how it ended if that was
        a failure (None for a clean stop)."""
        with self._lock:
            self._asked = True
            if self._ended is None:
                os.kill(self.pid, signal.SIGTERM)
        if self._watcher is not None:
            self._watcher.join()
        else:
            self._ended = self._reap()
        self._said.close()
        self._channel.close()
        return None if self._ended == CLEAN else self._ended

    def _reap(self) -> str:
        info = os.waitid(os.P_PID, self.pid, os.WEXITED)
        assert info is not None  # without WNOHANG waitid waits for the end
        return _described(info.si_code, info.si_status)


class ApiParent:
    """The worker child's side: telling its parent it is ready, and noticing it is gone."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self._channel = channel

    def ready(self) -> None:
        """Say the worker runs. A parent already gone (a SIGTERM before it could handle
        one) is ``watch``'s to find: the end of the socket pair."""
        with contextlib.suppress(OSError):
            self._channel.sendall(READY)

    def refuse(self, message: str) -> NoReturn:
        """The worker's settings refuse it: the parent says so (one line) and exits 2."""
        with contextlib.suppress(OSError):
            self._channel.sendall(REFUSED + message.replace("\n", " ").encode() + b"\n")
        leave(2)

    def died(self, why: str) -> None:
        """Why this worker failed (it logged it), for the parent's last line."""
        with contextlib.suppress(OSError):  # the parent's end may be what failed
            self._channel.sendall(DIED + why.replace("\n", " ").encode() + b"\n")

    def watch(self, shutdown: Shutdown) -> None:
        """Stop this worker (``shutdown.fail``) if the parent ends: a worker alone would
        go on starting jobs for an API nobody can reach, and hold the state folder's lock."""

        def wait() -> None:
            # The parent sends nothing after the start; its end is b"", or ECONNRESET
            # where it died with what we sent (READY) still unread: killed as it started.
            with contextlib.suppress(OSError):
                while self._channel.recv(64):
                    pass
            if not shutdown.stopping:
                why = f"the API process (pid {self.pid}) ended"
                log.critical("%s; stopping its worker (exit status 1)", why)
                shutdown.fail(why)

        threading.Thread(target=wait, name="ddpq-api-process", daemon=True).start()


def fork_worker() -> WorkerProcess | ApiParent:
    """Fork the worker's process: the parent's handle on it, or (in the child) the child's
    on its parent. Before any thread starts: a fork copies a lock another thread holds,
    held in the child for ever."""
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:  # none of the daemon's own: tests/test_serve_halves.py holds it so
        log.warning("forking beside threads %s: a lock one of them holds stays held", others)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = os.getpid()
    pid = os.fork()
    if pid != 0:
        theirs.close()
        return WorkerProcess(pid, ours)
    ours.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the parent stops us
    return ApiParent(parent, theirs)


def leave(code: int) -> NoReturn:
    """The child's exit: the exit handlers (its executor's cgroup cleanup; those made
    before the fork are logging's and the standard library's) and never back up the
    parent's stack, whose ``finally`` blocks are the parent's to run."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        os._exit(code)
