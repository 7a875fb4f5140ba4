"""Daemons for the tests, forked from one process that has already imported them.

Most of a ``ddpq serve`` start is importing FastAPI, pydantic, SQLAlchemy and ddpq's own
tables and routes (~1.4 s of CPU here), and the suite starts ~150 daemons. This process
(one per pytest process, started at its first daemon) imports those modules once; each
daemon is then a fork of it that runs ``ddpq.entry.main`` as ``python -m ddpq`` would, in
a session of its own, with the test's environment, folder and log. Whatever the import
list misses, the child imports itself: the list decides the speed, never the behaviour.

Where a fork cannot stand for a new interpreter (another ``python``, ``PYTHON*`` variables
that a new interpreter would read at its start), ``helpers.Daemon`` starts a process as
before; ``DDPQ_TESTS_FRESH_DAEMONS=1`` makes it do so for every daemon.

The protocol, on a Unix socket pair: the test sends one JSON request (argv, env, cwd) with
two file descriptors, its end of a new socket pair for the answer and the daemon's log;
the answer is the child's pid, then, when the child ends, its status as ``Popen`` writes it
(negative: killed by that signal). The test's side of it is ``Forked``.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# What a daemon's start imports (``python -X importtime -m ddpq serve``): the roots.
PRELOADED = (
    "ddpq.entry",
    "ddpq.client.cli",
    "ddpq.client.runtime",
    "ddpq.daemon.commands",
    "ddpq.daemon.run",
    "ddpq.daemon.heap",
    "ddpq.daemon.janitor",
    "ddpq.daemon.notifier",
    "ddpq.daemon.quota",
    "ddpq.server.app",
    "ddpq.server.protocol",
    "ddpq.worker.loop",
    "ddpq.executors.choose",
    "ddpq.executors.local",
    "ddpq.store.models",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.lifespan.on",
    "uvicorn.loops.asyncio",
)
MAX_REQUEST = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def serve(control: socket.socket) -> None:
    """Fork a daemon per request until the test's end of ``control`` closes."""
    import importlib

    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import gc

    gc.collect()
    answers: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, answer socket)
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    request = _receive(control)
                    if request is None:
                        return
                    pidfd, entry = _fork(request, control, selector)
                    answers[pidfd] = entry
                    selector.register(pidfd, selectors.EVENT_READ)
                else:
                    pidfd = int(key.fd)
                    selector.unregister(pidfd)
                    pid, answer = answers.pop(pidfd)
                    _, status = os.waitpid(pid, 0)
                    os.close(pidfd)
                    with contextlib.suppress(OSError):
                        answer.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                    answer.close()


def _receive(control: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    fds = array.array("i")
    data, ancillary, _, _ = control.recvmsg(MAX_REQUEST, socket.CMSG_LEN(2 * fds.itemsize))
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _fork(
    request: tuple[dict[str, Any], list[int]],
    control: socket.socket,
    selector: selectors.BaseSelector,
) -> tuple[int, tuple[int, socket.socket]]:
    spec, (answer_fd, log_fd) = request
    answer = socket.socket(fileno=answer_fd)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the daemon; it never returns
        _become_daemon(spec, log_fd)
    os.close(log_fd)
    answer.sendall(b"%d\n" % pid)
    return os.pidfd_open(pid), (pid, answer)


def _become_daemon(spec: dict[str, Any], log_fd: int) -> None:
    """In the child: what ``Popen(start_new_session=True, stdout=log, stderr=STDOUT)`` and
    ``python -m ddpq`` would have set up, then ``ddpq.entry.main``; never returns."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # Popen's close_fds
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        sys.argv = [_as_python_dash_m_ddpq(), *spec["argv"]]
        code = _run_as_main()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_as_main() -> int:
    """``ddpq.entry.main`` as an interpreter runs its main module: the exit status it
    would end with, the traceback it would print, and what was asked to run at exit."""
    import atexit
    import signal
    import traceback

    from ddpq import entry

    try:
        entry.main()
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt:  # an interpreter ends by the signal itself
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _as_python_dash_m_ddpq() -> str:
    """Make ``__main__`` look as ``python -m ddpq`` makes it (what Click names the program
    after in its usage lines), without running it; its file is ``sys.argv[0]``."""
    import importlib.util
    import types

    spec = importlib.util.find_spec("ddpq.__main__")
    assert spec is not None and spec.origin is not None
    main = types.ModuleType("__main__")
    main.__spec__, main.__package__, main.__file__ = spec, "ddpq", spec.origin
    sys.modules["__main__"] = main
    return spec.origin


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Forked:
    """The test's handle on a forked daemon: the part of ``subprocess.Popen`` tests use."""

    def __init__(self, args: list[str], pid: int, answer: socket.socket) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._answer = answer

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> bool:
        """Take the child's status if the zygote has sent it within ``timeout``."""
        self._answer.settimeout(timeout)
        try:
            line = self._answer.recv(64)
        except (TimeoutError, BlockingIOError):
            return False
        self._answer.close()
        self.returncode = int(line) if line.strip() else -9  # the zygote gone: lost
        return True


# What a new process reads of its environment at its start, and a fork would not read
# again: the interpreter's variables, the dynamic loader's (a fake libnvidia-ml found
# through LD_LIBRARY_PATH) and the C library's.
READ_AT_START = ("PYTHON", "LD_", "GLIBC_TUNABLES", "MALLOC_")


def interpreter_variables(env: dict[str, str]) -> dict[str, str]:
    """What of ``env`` a new process reads at its start, where a fork would differ."""
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START)}


class Zygote:
    """The pytest process's side: starts the forking process at its first use, with the
    interpreter's variables of the moment ``Zygote()`` was made."""

    def __init__(self) -> None:
        self.interpreter = interpreter_variables(dict(os.environ))
        self._control: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], env: dict[str, str], log_fd: int) -> Forked:
        control = self._started()
        ours, theirs = socket.socketpair()
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        fds = array.array("i", [theirs.fileno(), log_fd])
        control.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        theirs.close()
        ours.settimeout(60)
        pid = int(_line(ours))
        return Forked(argv, pid, ours)

    def _started(self) -> socket.socket:
        if self._control is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env = {k: v for k, v in os.environ.items() if not k.startswith(READ_AT_START)}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote", str(theirs.fileno())],
                cwd=ROOT,  # where ``-m tests.zygote`` is found, whatever a test's folder
                env={**env, **self.interpreter},
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            theirs.close()
            self._control = ours
        return self._control

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            self._proc.wait(30)
            self._proc = None


def _line(sock: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + 60
    while not data.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk or time.monotonic() > deadline:
            raise RuntimeError("the zygote did not answer")
        data += chunk
    return data


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
