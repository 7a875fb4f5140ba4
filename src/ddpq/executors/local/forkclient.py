"""The worker's end of the fork server (``forkserver.py``): one request, one shim; a
pass's requests may be sent before their answers are read."""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FORKSERVER = Path(__file__).with_name("forkserver.py")
REPLY_TIMEOUT_S = 10.0
# Requests larger than this travel in a memory file beside the datagram (see fork).
INLINE_REQUEST_MAX = 64 * 1024


class ForkServerUnavailable(OSError):
    """The request did not reach a fork server: no shim was started, the exec path may be."""


class ForkServerLost(OSError):
    """The fork server went away after it got the request: whether a shim started is unknown."""


@dataclass(frozen=True)
class Ticket:
    """A request sent and not yet answered: the connection it went on, where its answer
    comes (a server started again since then will never answer it)."""

    sock: socket.socket


class ForkServer:
    """Started on first use; started again after it went away."""

    def __init__(self, python: str, jobs_dir: Path) -> None:
        self.python = python
        # Room on the server's command line for each forked shim's title (its job folder).
        self.room = f"{jobs_dir}/{'#' * 20}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._unanswered = 0  # requests sent on _sock whose answers are still to be read
        self._gone = False  # a send on _sock failed: no more requests go on it

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [
                    self.python,
                    "-S",
                    str(FORKSERVER),
                    "--socket-fd",
                    str(theirs.fileno()),
                    "--room",
                    self.room,
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            raise ForkServerUnavailable(f"cannot start the fork server: {exc}") from exc
        finally:
            theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        self._sock = ours
        return ours

    def send(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        uid: int | None,
        gid: int | None,
        groups: Sequence[int] | None = None,
        umask: int,
        cgroup: Path | None,
        gate: int,
        stderr: int,
        limits: Sequence[Path] = (),
        private_shm: bool = False,
        shm_size: int | None = None,
    ) -> Ticket:
        """Ask for a shim that waits on ``gate``, without waiting for the answer: the
        server forks while the caller prepares the next. Answers come in the order of
        the requests (``answer``: its PID). Raises ForkServerUnavailable. The descriptors
        travel with the request: the caller may close its own as soon as this returns.
        ``private_shm``: the shim and its job get a /dev/shm of their own (``shim_shm``),
        of ``shm_size`` bytes."""
        request = {
            "argv": list(argv),
            "env": dict(env),
            "uid": uid,
            "gid": gid,
            "groups": list(groups) if groups is not None else [],
            "umask": umask,
            "cgroup": str(cgroup) if cgroup is not None else None,
            "limits": [str(path) for path in limits],
        }
        if private_shm:  # a /dev/shm of its own, of that size (None: tmpfs's default)
            request["shm"] = shm_size
        data = json.dumps(request).encode()
        passed = [gate, stderr]
        body_fd = None
        if len(data) > INLINE_REQUEST_MAX:
            # A datagram cannot be larger than the socket's send buffer, which an
            # unprivileged process may raise only to net.core.wmem_max (208 KiB by default):
            # a large environment goes in a memory file passed along instead.
            body_fd = os.memfd_create("ddpq-fork-request", os.MFD_CLOEXEC)
            with open(body_fd, "wb", closefd=False) as body:
                body.write(data)
            passed.append(body_fd)
            data = json.dumps({"request_fd": True}).encode()
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passed))]
        try:
            if self._gone:
                raise ForkServerUnavailable("the fork server is gone")
            sock = self._sock or self._start()
            try:
                sock.sendmsg([data], fds)
            except OSError as exc:
                # The answers it sent before it went are still to be read: the socket is
                # closed once they have been.
                self._gone = True
                self._close_if_answered()
                raise ForkServerUnavailable(f"the fork server is gone: {exc}") from exc
        finally:
            if body_fd is not None:
                os.close(body_fd)
        self._unanswered += 1
        return Ticket(sock)

    def answer(self, ticket: Ticket) -> int:
        """The PID of the shim ``ticket``'s request asked for; each ticket is answered
        once, in the order they were given. Raises ForkServerLost (the server went away
        after the request: whether that shim started is unknown) or OSError (it could not
        fork)."""
        sock = ticket.sock
        if sock is not self._sock:
            raise ForkServerLost("the fork server went away before it answered")
        self._unanswered -= 1
        try:
            reply = sock.recv(64 * 1024)
        except OSError as exc:  # hung (no answer in REPLY_TIMEOUT_S), or broken
            self.close()
            raise ForkServerLost(f"no answer from the fork server: {exc}") from exc
        if not reply:  # it went away, and every answer it sent has been read
            self.close()
            raise ForkServerLost("the fork server went away before it answered")
        self._close_if_answered()
        answer = json.loads(reply)
        if "pid" in answer:
            return int(answer["pid"])
        raise OSError(f"the fork server could not fork: {answer.get('error')}")

    def _close_if_answered(self) -> None:
        if self._gone and self._unanswered == 0:
            self.close()

    def close(self) -> None:
        """Close our end: the server exits (the shims it started run on)."""
        self._unanswered = 0
        self._gone = False
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None
