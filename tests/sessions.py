"""Helpers for interactive sessions' tests: a shim run by hand on a terminal, a client of its
socket, and a terminal (a pty) around a command such as `ddpq shell`."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from ddpq.client import relay
from ddpq.executors.local.shim_command import shim_argv
from ddpq.jobdir import JobDir
from tests.helpers import wait_for

# A shell that says little: no rc files, a short prompt, no bracketed-paste escapes.
SHELL = ["bash", "--norc", "--noprofile", "-i"]
QUIET_ENV = {"PS1": "$ ", "TERM": "dumb", "HISTFILE": "/dev/null"}


class ShimSession:
    """``shim.py --pty 1`` started as the worker would, in a folder of the test's."""

    def __init__(
        self,
        folder: Path,
        cmd: list[str] | None = None,
        grace: float = 1.0,
        cwd: Path | None = None,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.dir = JobDir(folder)
        argv = shim_argv(sys.executable, self.dir, str(cwd or folder), grace, 1 << 20, None)
        at = argv.index("--")
        pty = ["--pty", "1", "--socket", str(self.dir.tty_socket), "--notice"]
        argv[at:at] = [*pty, str(self.dir.notice)]
        env = {**os.environ, **QUIET_ENV, "DDPQ_ATTEMPT": "1", "DDPQ_JOB_DIR": str(folder)}
        self.proc = subprocess.Popen(
            [*argv, *(cmd or SHELL)], start_new_session=True, env=env, stderr=subprocess.PIPE
        )
        served = self.dir.tty_socket.exists
        wait_for(lambda: served() or self.proc.poll() is not None, 30, "the session's socket")

    def connect(self) -> socket.socket:
        """A connection to the session's socket. The socket's name is there from its bind, a
        moment before it listens (then a connection is refused): as `ddpq attach` does, try
        again while it may be coming."""

        def connected() -> socket.socket | None:
            try:
                return relay.connect(str(self.dir.tty_socket))
            except relay.CannotAttach as exc:
                if not exc.waiting or self.proc.poll() is not None:
                    raise
                return None

        return wait_for(connected, 30, "the session's socket to listen")

    def client(self) -> Client:
        return Client(self.connect())

    def wait(self, timeout: float = 30) -> dict[str, object]:
        assert self.proc.wait(timeout) == 0, self.proc.stderr.read() if self.proc.stderr else ""
        record: dict[str, object] = json.loads(self.dir.exit_record.read_text())
        return record

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Client:
    """A client of a session's socket, speaking the relay's frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seen = b""
        self.ended: dict[str, object] | None = None
        self.closed = False
        self._inbox = b""

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        self.sock.sendall(relay.frame(kind, payload))

    def type(self, text: str) -> None:
        self.send(relay.INPUT, text.encode())

    def size(self, rows: int, cols: int) -> None:
        self.send(relay.WINSIZE, struct.pack("!HH", rows, cols))

    def pump(self, timeout: float) -> None:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return
        self._inbox += data
        while len(self._inbox) >= relay.HEADER.size:
            kind, length = relay.HEADER.unpack_from(self._inbox)
            if len(self._inbox) < relay.HEADER.size + length:
                break
            payload = self._inbox[relay.HEADER.size : relay.HEADER.size + length]
            self._inbox = self._inbox[relay.HEADER.size + length :]
            if kind == relay.OUTPUT:
                self.seen += payload
            elif kind == relay.ENDED:
                self.ended = json.loads(payload)

    def expect(self, pattern: str, timeout: float = 30) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern.encode(), self.seen)
            if found:
                return found
            if self.closed or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in {self.seen[-2000:]!r}")
            self.pump(0.1)

    def until_closed(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.closed:
            assert time.monotonic() < deadline, f"still open; saw {self.seen[-500:]!r}"
            self.pump(0.1)

    def close(self) -> None:
        self.sock.close()


class Terminal:
    """A command on a pseudo-terminal of its own (its controlling one), as a user's."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        rows: int = 24,
        cols: int = 80,
        sigint_ignored: bool = False,
    ):
        """``sigint_ignored``: started as by a parent that ignores SIGINT (some test
        runners' workers), which Python keeps: ^C must still do what it promises."""
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        def own_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if sigint_ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=own_terminal,
        )
        os.close(slave)
        self.seen = b""
        self.matched = 0  # where the previous expect's match ended

    def type(self, text: str | bytes) -> None:
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.killpg(self.proc.pid, signal.SIGWINCH)

    def pump(self, timeout: float) -> str:
        """Read what is there within ``timeout``: "data", "idle" (nothing) or "eof"."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return "idle"
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the command and all it started have closed the terminal
            return "eof"
        self.seen += data
        return "data" if data else "eof"

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[bytes]:
        """The first match of ``pattern`` in what came after the previous match."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.compile(pattern.encode()).search(self.seen, self.matched)
            if found:
                self.matched = found.end()
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in {self.seen[-3000:]!r}")
            if self.pump(0.1) == "eof" and self.proc.poll() is not None:
                raise AssertionError(
                    f"ended ({self.proc.returncode}) before {pattern!r}: {self.seen[-3000:]!r}"
                )

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"still running: {self.seen[-2000:]!r}"
            self.pump(0.1)
        while self.pump(0.05) == "data":
            pass
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)
