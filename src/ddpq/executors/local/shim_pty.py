"""An interactive session's terminal: the job on a pseudo-terminal the shim holds, relayed
to its owner over a Unix socket in the job's folder, as ``dtach`` does.

Standard library only, imported by the shim, which runs with ``python -S``. The shim is
the session leader and takes the terminal as its session's controlling terminal; the job
(the user's shell, or a notebook server) runs in its own process group in that session,
in the foreground, so Ctrl-C, Ctrl-Z and job control work in it, and the shim's tracking
(its session, its cgroup) is that of any job. The shim keeps the terminal's master side:

* what the job writes goes to the log (capped, as any job's output), to a scrollback of
  the last ``SCROLLBACK`` bytes, and to every attached client;
* clients (``ddpq shell``, ``ddpq attach``) connect to the socket (0600, the job's
  account's, in a folder only that account may enter); the peer's uid is checked again
  with ``SO_PEERCRED``: the job's account or root. A client that attaches first gets the
  scrollback; its window size is the terminal's, and a redraw is asked for (SIGWINCH);
* a stop (cancel, time limit, idle) hangs the terminal up: SIGHUP to the job's
  foreground, SIGTERM to every process of the job, SIGKILL after the grace period;
* a line the worker left in the job's folder (``notice``, announced by SIGUSR2) is
  written into the terminal's output, where attached clients and the log see it.

The socket, its frames and what a client is sent on attaching are ``shim_wire``'s.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import termios
import time

if __package__:
    from ddpq.executors.local import shim_log, shim_procs, shim_record, shim_wire
else:
    import shim_log  # type: ignore[import-not-found,no-redef]
    import shim_procs  # type: ignore[import-not-found,no-redef]
    import shim_record  # type: ignore[import-not-found,no-redef]
    import shim_wire  # type: ignore[import-not-found,no-redef]
# The socket's side, also by the names the shim and the tests have known it by here.
Client = shim_wire.Client
NOTICE_MAX = shim_wire.NOTICE_MAX
listen = shim_wire.listen
replayable = shim_wire.replayable

SCROLLBACK = 64 * 1024  # replayed to a client that attaches
CLIENT_BACKLOG = 1 << 20  # output a client may fall behind by before it is let go
INPUT_BACKLOG = 1 << 16  # typed input waiting for the job to read it
READ_CHUNK = 65536
DEFAULT_SIZE = (24, 80)
STOPPING = b"\r\n[ddpq: stopping the session: SIGTERM now, SIGKILL after the grace period]\r\n"


class Terminal:
    """The job on a pseudo-terminal, and the clients attached to it."""

    def __init__(
        self,
        path: str,
        listener: socket.socket,
        log: shim_log.CappedLog,
        notice: str,
        stop: dict[str, float],
        wake: int,
    ) -> None:
        self.path = path  # the socket's, to remove it at the end
        self.listener = listener
        self.log = log
        self.notice = notice
        self.stop = stop
        self.wake = wake
        self.clients: list[shim_wire.Client] = []
        self.scrollback = bytearray()
        self.trimmed = False  # the scrollback lost its beginning (replayed from a new line)
        self.typed = bytearray()
        self.size = DEFAULT_SIZE
        self.error: str | None = None
        self.master = -1
        self.pid = -1

    # ---- the job ---------------------------------------------------------------------

    def start(self, cmd: list[str], reset: list[signal.Signals]) -> int:
        """Fork the job on a new terminal; its pid. ``reset``: signals it gets back to
        their defaults (the shim handles them)."""
        master, slave = os.openpty()
        # Our session's controlling terminal (the shim leads the session and has none):
        # the job's group is made its foreground, so the terminal's signals go to the job.
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        self._resize(master, DEFAULT_SIZE)
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                for s in reset:
                    signal.signal(s, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                # A background group may take the foreground only with SIGTTOU ignored.
                signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(slave, os.getpid())
                signal.signal(signal.SIGTTOU, signal.SIG_DFL)
                for fd in (0, 1, 2):
                    os.dup2(slave, fd)
                os.execvp(cmd[0], cmd)
            except OSError as exc:
                os.write(2, f"ddpq: cannot run {cmd[0]!r}: {exc.strerror}\r\n".encode())
            os._exit(127)
        os.close(slave)
        try:
            os.setpgid(pid, pid)  # also from here, so no signal can race the child's call
        except OSError:
            pass
        os.set_blocking(master, False)
        self.master, self.pid = master, pid
        return pid

    def hang_up(self, sid: int, marker: bytes, since: int) -> None:
        """A stop: as a terminal that closes (SIGHUP to the shell and the job it runs in
        the foreground), and SIGTERM (with SIGCONT, for a stopped job) to every process."""
        self.output(STOPPING)
        groups = {self.pid}
        try:
            groups.add(os.tcgetpgrp(self.master))
        except OSError:
            pass
        groups.discard(os.getpgrp())  # the terminal's until the job took it: ours
        for group in groups:
            try:
                os.killpg(group, signal.SIGHUP)
            except OSError:
                pass
        for member in shim_procs.job_members(sid, marker, since):
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.kill(member, sig)
                except OSError:
                    pass

    # ---- output: to the log, the scrollback, every client ----------------------------

    def output(self, data: bytes) -> None:
        if self.error is None:
            try:
                self.log.write(data)
            except OSError as exc:
                self.error = shim_record.disk_error("writing the job's log", exc)
        self.scrollback += data
        if len(self.scrollback) > SCROLLBACK:
            del self.scrollback[: len(self.scrollback) - SCROLLBACK]
            self.trimmed = True
        for client in list(self.clients):
            self._send(client, shim_wire.frame(shim_wire.OUTPUT, data))

    def _send(self, client: shim_wire.Client, data: bytes) -> None:
        client.outbox += data
        if len(client.outbox) > CLIENT_BACKLOG:
            self._drop(client)  # it stopped reading (a suspended `ddpq attach`): reattach

    def read_terminal(self) -> bool:
        """Relay what the job wrote; False once no process holds the terminal any more."""
        while True:
            try:
                data = os.read(self.master, READ_CHUNK)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno == errno.EIO:  # every process of the job closed it
                    return False
                raise
            if not data:
                return False
            self.output(data)

    def show_notice(self) -> None:
        """The worker's line for this session (the idle warning), into the terminal."""
        line = shim_wire.take_notice(self.notice)
        if line:
            self.output(f"\r\n[{line}]\r\n".encode())

    # ---- clients -----------------------------------------------------------------------

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors, say: the client tries again
            try:
                allowed = shim_wire.peer_uid(conn) in (os.getuid(), 0)
            except OSError:
                allowed = False
            if not allowed or len(self.clients) >= shim_wire.MAX_CLIENTS:
                conn.close()
                continue
            conn.setblocking(False)
            client = shim_wire.Client(conn)
            self.clients.append(client)
            replay = shim_wire.replay(bytes(self.scrollback), self.trimmed)
            if replay:
                self._send(client, shim_wire.frame(shim_wire.OUTPUT, replay))

    def _drop(self, client: shim_wire.Client) -> None:
        if client in self.clients:
            self.clients.remove(client)
        client.sock.close()

    def read_client(self, client: shim_wire.Client) -> None:
        try:
            data = client.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)  # detached
            return
        client.inbox += data
        frames, ours = shim_wire.take_frames(client.inbox)
        for kind, payload in frames:
            if kind == shim_wire.INPUT:
                self.typed += payload  # bounded: clients are not read while it is full
            elif len(payload) == 4:
                self._window(client, struct.unpack("!HH", payload))
        if not ours:
            self._drop(client)  # not our client: nothing more it sends is taken

    def _window(self, client: shim_wire.Client, size: tuple[int, int]) -> None:
        rows, cols = size
        if not (0 < rows < 10000 and 0 < cols < 10000):
            return
        first = not client.sized
        client.sized = True
        if (rows, cols) != self.size:
            self._resize(self.master, (rows, cols))  # the kernel sends the job SIGWINCH
            self.size = (rows, cols)
        elif first:
            # Same size, so no SIGWINCH from the kernel: a full-screen program (vim, htop)
            # redraws for the client that just attached only when asked.
            try:
                group = os.tcgetpgrp(self.master)
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGWINCH)
            except OSError:
                pass

    @staticmethod
    def _resize(fd: int, size: tuple[int, int]) -> None:
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        except OSError:
            pass

    def write_client(self, client: shim_wire.Client) -> None:
        try:
            sent = client.sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)
            return
        del client.outbox[:sent]

    def write_terminal(self) -> None:
        try:
            written = os.write(self.master, self.typed)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.typed.clear()  # the terminal is gone: nothing will read it
            return
        del self.typed[:written]

    # ---- the whole session -------------------------------------------------------------

    def run(self, sid: int, marker: bytes, since: int, grace: float) -> int:
        """Relay until the job has ended and no process holds its terminal; the job's wait
        status. Stops as the shim's batch loop does, with a hang-up first."""
        status: int | None = None
        termed = killed = False
        tty_open = True
        while status is None or tty_open:
            if self.error is not None and not self.stop["at"]:
                self.stop["at"] = time.monotonic()  # the log cannot be written: as a batch job
                grace = 0.0
            if self.stop["at"] and not termed:
                termed = True
                self.hang_up(sid, marker, since)
            if termed and not killed and time.monotonic() - self.stop["at"] >= grace:
                killed = True
                shim_procs.kill_everything(sid, marker, since)
            if status is not None and tty_open:
                shim_procs.kill_everything(sid, marker, since)  # stragglers hold it open
            if self.stop.get("notice"):
                self.stop["notice"] = 0.0
                self.show_notice()
            timeout = 0.5
            if termed and not killed:
                timeout = max(0.0, min(timeout, self.stop["at"] + grace - time.monotonic()))
            ready, ready_w = self._wait(tty_open, timeout)
            tty_open = self._serve(ready, ready_w, tty_open)
            if status is None:
                shim_procs.reap_children()
                status = shim_procs.MAIN.get("status")
        return status

    def _wait(self, tty_open: bool, timeout: float) -> tuple[list[int], list[int]]:
        """Wait at most ``timeout`` for the terminal, the clients, the listener or a signal;
        what is ready to read and to write."""
        reading = [self.wake, self.listener.fileno()]
        if len(self.typed) < INPUT_BACKLOG:  # else the clients wait: a paste is not cut
            reading += [c.sock.fileno() for c in self.clients]
        writing = [c.sock.fileno() for c in self.clients if c.outbox]
        if tty_open:
            reading.append(self.master)
            if self.typed:
                writing.append(self.master)
        try:
            ready, ready_w, _ = select.select(reading, writing, [], timeout)
        except InterruptedError:
            return [], []
        return ready, ready_w

    def _serve(self, ready: list[int], ready_w: list[int], tty_open: bool) -> bool:
        """Move what is ready between the terminal and the clients; whether any process
        still holds the terminal."""
        if self.wake in ready:
            try:
                os.read(self.wake, 512)
            except BlockingIOError:
                pass
        if tty_open and self.master in ready:
            tty_open = self.read_terminal()
        if tty_open and self.master in ready_w:
            self.write_terminal()
        for client in list(self.clients):
            fd = client.sock.fileno()
            if fd in ready:
                self.read_client(client)
            if client in self.clients and fd in ready_w:
                self.write_client(client)
        if self.listener.fileno() in ready:
            self.accept()
        return tty_open

    def abandon(self) -> None:
        """The job could not be started: no socket is left for clients to find."""
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self, status: int) -> None:
        """Tell the clients how the job ended, give them a moment to take it, let go.
        Clients that connected as the job ended, still waiting to be let in, are let in
        first: they would otherwise be dropped without being told (`ddpq shell -- true`
        then exited 1, saying nothing)."""
        try:
            os.unlink(self.path)  # no client finds it from here on
        except OSError:
            pass
        self.accept()
        ended = {
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        }
        for client in self.clients:
            client.outbox += shim_wire.frame(shim_wire.ENDED, json.dumps(ended).encode())
        deadline = time.monotonic() + 1.0
        while any(c.outbox for c in self.clients) and time.monotonic() < deadline:
            waiting = [c.sock for c in self.clients if c.outbox]
            try:
                _, ready, _ = select.select([], waiting, [], max(0.0, deadline - time.monotonic()))
            except InterruptedError:
                continue
            for client in list(self.clients):
                if client.sock in ready:
                    self.write_client(client)
        for client in list(self.clients):
            self._drop(client)
        self.listener.close()
        os.close(self.master)
