"""`ddpq shell -- CMD` where CMD ends at once (issue 26, item 8): its output is printed and
`ddpq shell` exits with its status, as an attached session would; no stray ^@ on attach."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.helpers import Daemon
from tests.sessions import QUIET_ENV, Terminal


@pytest.fixture(scope="module")
def daemon(module_daemons: Callable[..., Daemon]) -> Daemon:
    """The module's daemon: each test runs its own session and waits for its end."""
    return module_daemons("--fake-gpus", "2", "--grace", "1s")


@pytest.fixture
def terminals() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_one(d: Daemon, *args: str) -> Terminal:
        env = {**os.environ, **QUIET_ENV, "DDPQ_URL": d.url, "TERM": "xterm"}
        t = Terminal([sys.executable, "-m", "ddpq", *args], env)
        opened.append(t)
        return t

    yield open_one
    for t in opened:
        t.close()


# (the command, what it prints, the status `ddpq shell` must exit with)
QUICK = [
    pytest.param(["echo", "hello-from-the-session"], "hello-from-the-session", 0, id="ok"),
    pytest.param(["sh", "-c", "echo it-failed; exit 7"], "it-failed", 7, id="exit-7"),
    pytest.param(["sh", "-c", "echo killed; kill -TERM $$"], "killed", 128 + 15, id="signal"),
    pytest.param(["true"], "", 0, id="silent"),
]


@pytest.mark.parametrize(("cmd", "prints", "status"), QUICK)
def test_a_command_that_ends_at_once_prints_its_output_and_exits_with_its_status(
    daemon: Daemon,
    terminals: Callable[..., Terminal],
    cmd: list[str],
    prints: str,
    status: int,
) -> None:
    t = terminals(daemon, "shell", "--gpus", "1", "--", *cmd)
    assert t.wait() == status, t.seen
    seen = t.seen.decode(errors="replace")
    assert prints in seen and "attach failed" not in seen and "cannot attach" not in seen
    assert "ended:" in seen and "Traceback" not in seen
    assert "[ddpq] attempt" not in seen  # the log's own lines are not the command's output


def test_into_a_pipe_too(daemon: Daemon) -> None:
    env = {**os.environ, "DDPQ_URL": daemon.url}
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "shell", "--gpus", "0", "--", "sh", "-c", "echo x; exit 3"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 3, r.stderr
    assert r.stdout.strip() == "x"  # the output on stdout, ddpq's lines on stderr


@pytest.mark.parametrize(("given", "status"), [("", 0), ("echo piped\nexit 4\n", 4)])
def test_a_shell_ends_where_its_input_does(daemon: Daemon, given: str, status: int) -> None:
    """Input from a file or a pipe that ends: its end reaches the shell as its terminal's
    EOF key, as ssh sends it (`ddpq shell < /dev/null` waited for good)."""
    env = {**os.environ, "DDPQ_URL": daemon.url}
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "shell", "--gpus", "0", "--", "sh"],
        input=given,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == status, r.stderr
    assert ("piped" in r.stdout) is bool(given)


def test_attaching_shows_no_stray_nul(daemon: Daemon, terminals: Callable[..., Terminal]) -> None:
    t = terminals(daemon, "shell", "--gpus", "1", "--", "sh", "-c", "sleep 2; echo done-here")
    t.expect("attached")
    assert t.wait() == 0
    assert b"done-here" in t.seen
    assert b"^@" not in t.seen and b"\x00" not in t.seen, t.seen


def test_attach_to_a_session_that_has_ended_says_so(
    daemon: Daemon, terminals: Callable[..., Terminal]
) -> None:
    t = terminals(daemon, "shell", "--gpus", "1", "--", "true")
    assert t.wait() == 0
    said = re.search(rb"job (\d+): a session", t.seen)
    assert said is not None, t.seen
    r = daemon.cli("attach", said.group(1).decode(), check=False)
    assert r.returncode == 1 and "has ended: succeeded" in r.stderr


@pytest.mark.parametrize(
    ("told", "record", "status"),
    [
        ((0, None), {"exit_code": 5, "exit_signal": None}, 0),  # the shim's word first
        ((None, 9), None, 128 + 9),
        ((None, None), {"exit_code": 0, "exit_signal": None}, 0),  # let go untold: the record
        ((None, None), {"exit_code": None, "exit_signal": 15}, 128 + 15),
        ((None, None), {"exit_code": None, "exit_signal": None}, 1),  # nothing to go by
        ((None, None), None, 1),
    ],
)
def test_shell_exits_as_the_shim_said_else_as_the_record_says(
    told: tuple[int | None, int | None], record: dict[str, int | None] | None, status: int
) -> None:
    from ddpq.client.sessions import exit_status

    assert exit_status(*told, record) == status
