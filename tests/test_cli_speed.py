"""The CLI as quick as the shell (issue 11): what its hot commands import, run for real.

`ddpq submit` and `ddpq ls` are run in shell loops, so each is a whole interpreter start;
httpx (~100 ms) and pydantic (~100 ms with our schemas, and through Typer's option
conversion) would each cost more than everything else such a command does. Each command
runs against a real daemon under `python -X importtime`, which names every module it
imports, lazy ones included. bench/cli_latency.py measures the time itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon

HEAVY = ("httpx", "httpcore", "pydantic", "pydantic_core", "ddpq.schemas", "typer._adapters")
# A client command needs none of the daemon's commands (ddpq.entry mounts them only for theirs).
DAEMON = ("ddpq.daemon",)
# The standard library's HTTP brings the email package and ssl (~12 ms): not needed.
STDLIB_HTTP = ("http.client", "email", "ssl")
NO_DRAWING = ("rich",)  # what only prints a line needs no Rich
NO_TABLE = ("rich.table",)  # the queue and the GPUs are drawn by client.grid
# `submit` and `ls` are read by client.quick, without Typer (or the click it carries), and
# the queue goes into a pipe without Rich; no dataclasses (inspect) nor argparse either.
# Nor the standard library's modules that ddpq does without on their path (issue 26 item
# 15): typing and pathlib, socket.py (``_socket``), urllib.parse (``client.urls``), getpass.
QUICK = (
    *("typer", "click", "rich", "dataclasses", "inspect", "argparse"),
    *("typing", "pathlib", "socket", "urllib", "getpass"),
)


def imported(d: Daemon, *args: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ddpq", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DDPQ_URL": d.url},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    names = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "ddpq.entry" in names  # the probe sees the imports at all
    return names


def under(names: set[str], packages: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in packages)}


@pytest.fixture
def job(shared_daemon: Daemon) -> int:
    """A held job of this test's own, on the module's daemon."""
    return shared_daemon.client().submit(JobSubmit(command=["sleep", "30"], hold=True)).id


COMMANDS = {
    "submit": (["submit", "--hold", "--", "true"], QUICK),
    "submit a sweep": (["submit", "--hold", "--sweep", "x=1,2", "--", "echo", "{x}"], QUICK),
    "ls": (["ls"], QUICK),
    "ls --all": (["ls", "--all", "--state", "held"], QUICK),
    "ls --json": (["ls", "--all", "--json"], NO_DRAWING),
    "show": (["show", "{job}"], ()),
    "show --env": (["show", "{job}", "--env"], ()),
    "logs": (["logs", "{job}"], NO_DRAWING),
    "hold": (["hold", "{job}"], NO_DRAWING),
    "release": (["release", "{job}"], NO_DRAWING),
    "whoami": (["whoami"], NO_DRAWING),
    "gpus": (["gpus"], NO_TABLE),
    "usage": (["usage"], NO_TABLE),
    "cancel": (["cancel", "{job}"], NO_DRAWING),
    "history": (["history", "--all"], NO_TABLE),
    "history --output csv": (["history", "--output", "csv"], NO_DRAWING),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_hot_command_imports_neither_httpx_nor_pydantic(
    command: str, shared_daemon: Daemon, job: int
) -> None:
    args, also_not = COMMANDS[command]
    names = imported(shared_daemon, *(a.replace("{job}", str(job)) for a in args))
    assert not under(names, HEAVY + STDLIB_HTTP + DAEMON + also_not)


def test_the_probe_sees_a_command_that_does_import_pydantic(shared_daemon: Daemon) -> None:
    # `serve --help` reads the settings' defaults (pydantic-settings): the probe must see it.
    names = imported(shared_daemon, "serve", "--help")
    assert under(names, ("pydantic",))


def test_bad_option_values_are_still_usage_errors(shared_daemon: Daemon) -> None:
    # The client's options are converted without Typer's pydantic adapters.
    queued = shared_daemon.client().list().total  # the module's held job
    for args, shown in (
        (["show", "seven"], "'seven' is not a job id (12) or a sweep (s3)"),
        (["submit", "--gpus", "2.5", "--", "true"], "'2.5' is not a number of GPUs nor a range"),
        (["cancel", "1", "x"], "'x' is not a job id (12) or a sweep (s3)"),
        (["preempt", "x"], "'x' is not a whole number"),
        (["watch", "--interval", "nan"], "'nan' is not a finite number"),
        # Declared bounds (typer.Option(min=...)), checked by the client's own converter.
        (["watch", "--interval", "0"], "0.0 is not 0.1 or more"),
        (["ls", "--limit", "-2"], "-2 is not 0 or more"),
        (["history", "--limit", "-1"], "-1 is not 0 or more"),
    ):
        r = shared_daemon.cli(*args, check=False)
        assert r.returncode == 2 and shown in r.stderr and "Traceback" not in r.stderr, r
        # One line, whether the command's own check or the option's reading refused it.
        assert r.stderr.startswith("ddpq: ") and r.stderr.count("\n") == 1, r.stderr
    assert shared_daemon.client().list().total == queued  # nothing queued


@pytest.mark.parametrize(
    ("argv", "name", "with_daemon"),
    [
        (["ls"], "ls", False),
        (["--url", "http://x", "--debug", "show", "1"], "show", False),
        (["--url=http://x", "--token", "ls", "cancel", "2"], "cancel", False),
        (["serve", "--fake-gpus", "2"], "serve", True),
        (["admin", "user", "add", "x"], "admin", True),
        (["--help"], None, True),
        ([], None, True),
        (["--no-such-option", "ls"], None, True),
    ],
)
def test_the_command_line_builds_the_daemons_commands_only_for_them(
    argv: list[str], name: str | None, with_daemon: bool
) -> None:
    from ddpq import entry

    cli = entry.command_line(argv)
    assert entry.invoked(cli, argv) == name
    assert ("serve" in cli.commands and "admin" in cli.commands) is with_daemon
    assert "ls" in cli.commands and "submit" in cli.commands


def test_the_quick_commands_end_at_once_but_run_what_asked_to_run_at_exit(
    shared_daemon: Daemon,
) -> None:
    # The `ddpq` script ends `submit` and `ls` with os._exit once their output is flushed
    # (entry.exit_at_once): not where an atexit callback (a coverage run's) is waiting.
    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('at exit', flush=True))\n"
        "from ddpq.entry import main\n"
        "sys.argv = ['ddpq', 'ls', '--all']\n"
        "main()\n"
    )
    env = {**os.environ, "DDPQ_URL": shared_daemon.url}
    for code, said in ((script, "at exit\n"), (script.replace("atexit.register(", "("), "")):
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert r.returncode == 0 and r.stdout.startswith("ID  NAME"), r
        assert r.stdout.endswith(f"\n{said}") and "at exit" not in r.stderr, r
