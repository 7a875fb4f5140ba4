"""``ddpq`` run in the test's process, for tests of what the command line says, not of the
process: its parsing, its usage errors, how it words a daemon's refusal.

A ``ddpq`` process costs ~0.3 s of CPU to start (Python, Typer, httpx), a ``ddpq serve``
that refuses its flags more; these tests run hundreds of commands. The command is the one
the ``ddpq`` script runs (``entry.main``, through ``common.run``: one line and an exit code
for a ``DdpqError``); an exception that would have been a traceback escapes here and fails
the test.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

from ddpq import entry


def run_in_process(
    *args: str, env: Mapping[str, str | None] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``ddpq ARGS`` with ``env`` added to the environment (None: a variable removed) and
    ``stdin`` as its input: exit status, stdout, stderr, as ``subprocess.run(...,
    capture_output=True, text=True)`` answers it."""
    out, err = io.StringIO(), io.StringIO()
    with (
        _no_daemon_started(),
        _environment(env or {}),
        _swapped(sys, "argv", ["ddpq", *args]),
        _swapped(sys, "stdin", io.StringIO(stdin)),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            entry.main()
            code: object = 0  # a command that returns normally exits 0
        except SystemExit as exc:
            code = exc.code
    said = err.getvalue()
    if code is None or isinstance(code, int):
        status = code or 0
    else:  # sys.exit("text"): Python prints the text on stderr and exits 1
        status, said = 1, f"{said}{code}\n"
    return subprocess.CompletedProcess(["ddpq", *args], status, out.getvalue(), said)


def ddpq_in_process(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ddpq ARGS`` against the daemon at ``url`` (as ``DDPQ_URL``, no token), as
    ``Daemon.cli(..., check=False)`` answers it."""
    return run_in_process(*args, env={"DDPQ_URL": url, "DDPQ_TOKEN": None})


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    before = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def _swapped(owner: object, name: str, value: object) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@contextlib.contextmanager
def _no_daemon_started() -> Iterator[None]:
    """A ``ddpq serve`` that got past its checks sets up logging and a umask of 077 in this
    process before it binds (or fails to): put them back, and fail the test. (One that
    serves blocks; pytest-timeout ends that test.)"""
    mask = os.umask(0o022)
    os.umask(mask)
    handlers = list(logging.getLogger().handlers)
    try:
        yield
    finally:
        now = os.umask(mask)
        logging.getLogger().handlers[:] = handlers
    assert now == mask, "the command started serving in the test's process"
