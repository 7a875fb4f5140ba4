"""Processes for the tests, forked from one that has already done their imports.

Most of a ``ddpq serve`` start is importing FastAPI, pydantic, SQLAlchemy and ddpq's own
tables and routes (~1.4 s of CPU here), and the suite starts ~150 daemons; most of a
training rank's start is importing torch (~5 s with what its optimiser imports). A zygote
is a process that imports such modules once (``DAEMON`` and ``TRAINING`` list them); each
process asked of it is then a fork of it that runs a module as ``python -m MODULE ARGS``
would, as ``__main__``, in a session of its own, with the test's environment, folder and
log. Whatever a list misses, the child imports itself: the list decides the speed, never
the behaviour.

A fork cannot stand for a new process where the new one would read its environment
differently at its start (``READ_AT_START``: the interpreter's, the loader's and the C
library's variables; ``READ_AS_TORCH_LOADS``: OpenMP's and torch's too).
``Zygote.accepts`` says so, and the caller starts a process as before;
``DDPQ_TESTS_FRESH_PROCESSES=1`` asks for new processes throughout.

The protocol, on a Unix socket pair: the test sends one JSON request (module, argv, env,
cwd, signals to ignore) with two file descriptors, its end of a new socket pair for the
answer and the log; the answer is the child's pid, then, when the child ends, its status
as ``Popen`` writes it (negative: killed by that signal). The test's side of it is
``Forked``.
"""

from __future__ import annotations

import array
import contextlib
import faulthandler
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# What a daemon's start imports (``python -X importtime -m ddpq serve``): the roots.
DAEMON = (
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
    # What a forked daemon still imported after the fork (its sys.modules, before and
    # after a start, a request and a stop): its options and settings, and what uvicorn,
    # anyio and Typer import as they run.
    "ddpq.client.quick",
    "ddpq.daemon.options",
    "ddpq.daemon.settings",
    "anyio._backends._asyncio",
    "anyio.streams.stapled",
    "anyio.streams.tls",
    "fastapi.telemetry._runtime",
    "typer._adapters",
    "typer._click.decorators",
    "uvicorn.loops.auto",
    "uvicorn.protocols.websockets.auto",
)
# What a rank of the built-in workload imports before it trains: torch, and the
# ``torch._dynamo`` that a ``torch.optim`` optimiser imports at its first step.
# Not the workload's module itself: ``runpy`` warns of a main module imported before.
TRAINING = (
    "numpy",
    "torch",
    "torch.distributed",
    "torch.nn.functional",
    "torch.nn.parallel",
    "torch.optim",
    "torch._dynamo",
    "ddpq.workloads.cifar",
    "ddpq.workloads.preemption",
    "ddpq.workloads.resize",
    "ddpq.workloads.resnet18_cli",
    "ddpq.workloads.resnet_model",
)
MAX_REQUEST = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def serve(control: socket.socket, preload: list[str]) -> None:
    """Fork a child per request until the test's end of ``control`` closes."""
    import importlib

    for name in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if "ddpq.server.app" in preload:  # the daemons' zygote: what each daemon builds alike
        from tests import prepared_daemon

        prepared_daemon.prepare()
    import gc

    # What the imports made lives as long as any child: frozen, a child's collections
    # (a daemon's at its start, as it freezes its own) never walk it, nor copy its pages.
    gc.collect()
    gc.freeze()
    answers: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, answer socket)
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    request = _receive(control)
                    if request is None:
                        return
                    pidfd, entry = _fork(request)
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


def _fork(request: tuple[dict[str, Any], list[int]]) -> tuple[int, tuple[int, socket.socket]]:
    """Fork the child asked for; its pidfd, its pid and the socket its status goes to."""
    spec, (answer_fd, log_fd) = request
    answer = socket.socket(fileno=answer_fd)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; it never returns
        _become(spec, log_fd)
    os.close(log_fd)
    answer.sendall(b"%d\n" % pid)
    return os.pidfd_open(pid), (pid, answer)


def _become(spec: dict[str, Any], log_fd: int) -> None:
    """In the child: what ``Popen(start_new_session=True, stdout=log, stderr=STDOUT)``
    would have set up, then the module run as ``python -m`` runs it; never returns."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # Popen's close_fds
        faulthandler.enable()  # as `python -X faulthandler`: stacks into the log on SIGABRT
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        tempfile.tempdir = None  # read from TMPDIR again, as a new process would
        for number in spec["ignore"]:  # as a preexec_fn would, and exec keeps
            signal.signal(number, signal.SIG_IGN)
        sys.argv = [spec["module"], *spec["argv"]]  # runpy puts the file first
        code = _run_as_main(spec["module"])
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_as_main(module: str) -> int:
    """``module`` run as an interpreter runs its main module (``runpy``, as ``-m`` does):
    the exit status it would end with, the traceback it would print, and what was asked
    to run at exit."""
    import atexit
    import runpy
    import traceback

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
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


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Forked:
    """The test's handle on a forked child: the part of ``subprocess.Popen`` tests use."""

    def __init__(self, args: list[str], pid: int, answer: Answer) -> None:
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
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> bool:
        """Take the child's status if the zygote has sent it within ``timeout``."""
        line = self._answer.line(timeout, f"child {self.pid}'s status")
        if line is None:
            return False
        self._answer.close()
        self.returncode = int(line)
        return True


class ZygoteGone(RuntimeError):
    """The zygote ended before it answered."""


class Answer:
    """A request's answer socket, read a line at a time: the child's pid, later its
    status. Both may come in one read (a child that ends at once)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def line(self, timeout: float | None, what: str) -> bytes | None:
        """The next line, or None if none came within ``timeout`` (0: do not wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(64)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:
                raise ZygoteGone(f"the zygote ended: {what} is lost")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def close(self) -> None:
        self._sock.close()


# What a new process reads of its environment at its start, and a fork would not read
# again: the interpreter's variables, the dynamic loader's (a fake libnvidia-ml found
# through LD_LIBRARY_PATH) and the C library's; for a process that loads torch, OpenMP's
# and torch's too. (Not TORCHINDUCTOR_CACHE_DIR: torch sets it in its own environment as
# it loads, so a test process that imported torch has it and a new process is given it.)
READ_AT_START = ("PYTHON", "LD_", "GLIBC_TUNABLES", "MALLOC_")
READ_AS_TORCH_LOADS = (*READ_AT_START, "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_")


def read_at_start(env: dict[str, str], prefixes: tuple[str, ...] = READ_AT_START) -> dict[str, str]:
    """What of ``env`` a new process reads at its start, where a fork would differ."""
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


class Zygote:
    """The pytest process's side: starts the forking process at its first use, with
    ``start_env`` or, if none was given, the first request's environment."""

    def __init__(
        self,
        preload: tuple[str, ...],
        start_env: dict[str, str] | None = None,
        read_first: tuple[str, ...] = READ_AT_START,
        python: str = sys.executable,
    ):
        self.preload = preload
        self.python = python  # its interpreter, and every child's: the install it imports
        self.read_first = read_first
        self._start_env = start_env
        self._control: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def accepts(self, env: dict[str, str]) -> bool:
        """Whether a child forked with ``env`` is what a new process would be."""
        if os.environ.get("DDPQ_TESTS_FRESH_PROCESSES") == "1":
            return False
        if self._start_env is None:
            return True
        first = self.read_first
        return read_at_start(env, first) == read_at_start(self._start_env, first)

    def spawn(
        self,
        module: str,
        argv: list[str],
        env: dict[str, str],
        log_fd: int,
        ignore: tuple[int, ...] = (),
    ) -> Forked:
        """``python -m module *argv`` with ``env`` (``accepts`` it), output into ``log_fd``,
        in a session of its own, ``ignore``'s signals ignored."""
        assert self.accepts(env)
        request = {
            "module": module,
            "argv": argv,
            "env": env,
            "cwd": os.getcwd(),
            "ignore": [int(number) for number in ignore],
        }
        try:
            return self._ask(request, env, log_fd)
        except (ConnectionError, ZygoteGone):  # it died (killed, out of memory): anew, once
            self.close(kill=True)
            return self._ask(request, env, log_fd)

    def _ask(self, request: dict[str, Any], env: dict[str, str], log_fd: int) -> Forked:
        control = self._started(env)
        ours, theirs = socket.socketpair()
        with theirs:
            fds = array.array("i", [theirs.fileno(), log_fd])
            control.sendmsg(
                [json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
            )
        answer = Answer(ours)
        try:
            pid = answer.line(60, "the child's pid")
        except BaseException:
            answer.close()
            raise
        if pid is None:
            answer.close()
            raise TimeoutError("the zygote did not answer in 60 s")
        return Forked([request["module"], *request["argv"]], int(pid), answer)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _started(self, env: dict[str, str]) -> socket.socket:
        if self._control is None:
            if self._start_env is None:
                self._start_env = dict(env)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._proc = subprocess.Popen(
                [self.python, "-m", "tests.zygote", str(theirs.fileno()), *self.preload],
                # Where ``-m tests.zygote`` is found, whatever a test's folder. Not ddpq: it
                # lies in src/, so each interpreter imports its own install's.
                cwd=ROOT,
                env=self._start_env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # not a terminal: a child's buffers as a new one's
                start_new_session=True,
            )
            theirs.close()
            self._control = ours
        return self._control

    def close(self, kill: bool = False) -> None:
        """End the forking process (its children run on); ``kill``: one that has gone
        astray, so that the next request starts another."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            if kill:
                self._proc.kill()
            self._proc.wait(30)
            self._proc = None


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
