"""Who listens on a session's port (issue 21, item 8): the job itself, someone else, or
nobody yet; and what `ddpq shell` prints for each (a tunnel only to the job's own server).

Real listeners in child processes for the look (``portholders.who_listens``, the API's
``portuse``); a scripted API for the CLI's part. The end-to-end run is in
test_sessions_e2e.py."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq import portholders
from ddpq.client import session_port, sessions
from ddpq.client.api import DdpqError
from ddpq.config import Settings
from ddpq.portholders import who_listens
from ddpq.server import portuse

LISTEN = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"
)


class Listener:
    """A process listening on a port of its own, with ``env`` as its environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LISTEN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), **env},
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def job_7() -> Iterator[Listener]:
    """A server of job 7's attempt 2, as the job contract's variables say."""
    listener = Listener({"DDPQ_JOB_ID": "7", "DDPQ_ATTEMPT": "2"})
    yield listener
    listener.close()


def test_the_jobs_own_listener_is_the_job(job_7: Listener) -> None:
    found = who_listens(job_7.port, 7, 2, os.getuid())
    assert found.who == "job" and found.holder is not None
    assert (found.holder.pid, found.holder.uid) == (job_7.proc.pid, os.getuid())


@pytest.mark.parametrize(
    ("job_id", "attempt", "uid"),
    [
        (8, 2, os.getuid()),  # another job's server
        (7, 1, os.getuid()),  # an earlier attempt's
        (7, 2, os.getuid() + 1),  # the job's variables, but another account's process
        (7, 2, None),  # an account that does not exist here: none of its jobs runs
    ],
)
def test_any_other_listener_is_someone_else(
    job_7: Listener, job_id: int, attempt: int, uid: int | None
) -> None:
    found = who_listens(job_7.port, job_id, attempt, uid)
    assert found.who == "other" and found.holder is not None
    assert found.holder.pid == job_7.proc.pid


def test_a_listener_whose_process_the_look_did_not_reach_is_not_taken_for_the_job(
    job_7: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(portholders, "MAX_LINKS", 0)  # the bounded look finds no PID
    assert who_listens(job_7.port, 7, 2, os.getuid()).who == "unknown"  # its account: unsure
    assert who_listens(job_7.port, 7, 2, os.getuid() + 1).who == "other"  # another's: not it


def test_a_listener_outside_any_job_is_someone_else_and_nobody_is_nobody() -> None:
    plain = Listener({})
    try:
        assert who_listens(plain.port, 7, 2, os.getuid()).who == "other"
    finally:
        plain.close()
    assert who_listens(plain.port, 7, 2, os.getuid()).who == "nobody"


def test_the_api_answer_names_whoever_listens(tmp_path: Path, job_7: Listener) -> None:
    cfg = Settings(home=tmp_path)
    mine = portuse.port_use(cfg, 7, 2, job_7.port, True, None)
    assert (mine.listener, mine.pid, mine.uid) == ("job", job_7.proc.pid, os.getuid())
    theirs = portuse.port_use(cfg, 9, 1, job_7.port, True, None)
    assert (theirs.listener, theirs.pid) == ("other", job_7.proc.pid)
    assert f"is not job 9's: {job_7.port} held by uid {os.getuid()}" in theirs.detail
    ended = portuse.port_use(cfg, 7, 2, None, False, None)
    assert (ended.listener, ended.detail) == ("nobody", "job 7 is not running")
    slurm = portuse.port_use(Settings(home=tmp_path, executor="slurm"), 7, 2, 29600, True, None)
    assert slurm.listener == "unknown"


# ---- what `ddpq shell` prints -----------------------------------------------------------


class ScriptedApi:
    """``port_use`` answers in turn (the last one again and again), or raises them."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked = 0

    def port_use(self, job_id: int) -> Any:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, DdpqError):
            raise answer
        return answer


NOBODY = {"port": 29601, "listener": "nobody", "detail": "nobody listens on port 29601"}
JOB = {"port": 29601, "listener": "job", "uid": 1000, "user": "alice", "pid": 99, "command": "x"}
OTHER = {
    "port": 29601,
    "listener": "other",
    "uid": 1002,
    "user": "bob",
    "pid": 4242,
    "command": "python",
    "detail": "port 29601 is not job 9's",
}


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_port, "LISTEN_POLL_S", 0.001)
    monkeypatch.setattr(session_port, "LISTEN_WAIT_S", 0.2)


def test_the_tunnel_is_printed_once_the_job_listens(capsys: pytest.CaptureFixture[str]) -> None:
    api = ScriptedApi(NOBODY, NOBODY, JOB)
    session_port.reach(api, 9, 29601, sessions.say)
    err = capsys.readouterr().err
    assert "waiting for its server to listen on port 29601" in err
    assert "ssh -N -L 29601:127.0.0.1:29601 " in err and api.asked == 3


@pytest.mark.parametrize("before", [[], [NOBODY], [NOBODY, NOBODY]])
def test_someone_else_on_the_port_is_a_warning_and_no_tunnel(
    capsys: pytest.CaptureFixture[str], before: list[dict[str, Any]]
) -> None:
    session_port.reach(ScriptedApi(*before, OTHER), 9, 29601, sessions.say)
    err = capsys.readouterr().err
    assert "ssh" not in err
    assert (
        "warning: port 29601 of " in err and "not job 9's: uid 1002 (bob), pid 4242 python" in err
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (NOBODY, "job 9 does not listen on port 29601 yet; `ddpq attach 9` prints how"),
        ({**NOBODY, "port": None}, "job 9 does not listen on port 29601 yet"),  # it ended
        (DdpqError("not found", status=404), "no tunnel printed: this daemon cannot tell"),
        ({"port": 1, "listener": "unknown", "detail": "on a Slurm node"}, "on a Slurm node"),
        ({"port": 1, "listener": "mine, trust me"}, "no tunnel printed"),  # nonsense
        ({"port": 1}, "no tunnel printed"),
        (["not", "an", "object"], "no tunnel printed: the daemon's answer made no sense"),
    ],
)
def test_no_listener_the_cli_can_trust_prints_no_tunnel(
    capsys: pytest.CaptureFixture[str], answer: Any, said: str
) -> None:
    session_port.reach(ScriptedApi(answer), 9, 29601, sessions.say)
    err = capsys.readouterr().err
    assert said in err and "ssh" not in err


def test_a_hostile_listener_name_is_shown_inert(capsys: pytest.CaptureFixture[str]) -> None:
    hostile = {**OTHER, "user": "bob\x1b]0;pwned\x07", "command": "\x1b[2Jpython"}
    session_port.reach(ScriptedApi(hostile), 9, 29601, sessions.say)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "ssh" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root --auth daemon runs jobs as accounts")
def test_an_unreadable_account_database_is_no_answer_about_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short of descriptors, pwd says "not found": that is the machine's state (503), not
    "the job's account does not exist" (which would call any listener someone else's)."""
    from ddpq.server import exhaustion

    def not_found(_name: str) -> Any:
        raise KeyError(_name)

    def exhausted() -> None:
        raise exhaustion.Exhausted("the ddpq daemon has no file descriptor left (EMFILE)")

    settings = Settings(home=tmp_path, auth=True)
    monkeypatch.setattr(pwd, "getpwnam", not_found)
    monkeypatch.setattr(exhaustion, "check", exhausted)
    with pytest.raises(exhaustion.Exhausted, match="EMFILE"):
        portuse.account_uid(settings, "alice")
    monkeypatch.setattr(exhaustion, "check", lambda: None)  # readable: really no account
    assert portuse.account_uid(settings, "alice") is None
