"""``ddpq`` run in the test's process, for tests of what the command line says, not of the
process: its parsing, its usage errors, how it words a daemon's refusal.

A ``ddpq`` process costs ~0.3 s of CPU to start (Python, Typer, httpx); these tests run
hundreds of commands. The command is the same one the ``ddpq`` script runs (``entry.main``,
through ``common.run``: one line and an exit code for a ``DdpqError``); an exception that
would have been a traceback escapes here and fails the test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpq import entry


def ddpq_in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    *args: str,
) -> subprocess.CompletedProcess[str]:
    """``ddpq ARGS`` against the daemon at ``url`` (as ``DDPQ_URL``, no token), as
    ``Daemon.cli(..., check=False)`` answers it: exit status, stdout, stderr."""
    capsys.readouterr()  # what the test printed before is not the command's
    with monkeypatch.context() as m:
        m.setenv("DDPQ_URL", url)
        m.delenv("DDPQ_TOKEN", raising=False)
        m.setattr(sys, "argv", ["ddpq", *args])
        with pytest.raises(SystemExit) as exc:
            entry.main()
            raise SystemExit(0)  # a command that returns normally exits 0
    code = exc.value.code
    said = capsys.readouterr()
    if code is None or isinstance(code, int):
        return subprocess.CompletedProcess(["ddpq", *args], code or 0, said.out, said.err)
    # sys.exit("text"): Python prints the text on stderr and exits 1.
    return subprocess.CompletedProcess(["ddpq", *args], 1, said.out, f"{said.err}{code}\n")
