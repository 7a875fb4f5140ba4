"""The fork server on its own: shims it forks, how they show, and what it does when refused."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpq.executors.local import procs
from ddpq.executors.local.forkclient import (
    ForkServer,
    ForkServerLost,
    ForkServerUnavailable,
    Ticket,
)
from ddpq.executors.local.shim_command import shim_args
from ddpq.jobdir import JobDir
from tests.helpers import wait_for


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    fs = ForkServer(sys.executable, tmp_path / "jobs")
    yield fs
    fs.close()


def fork(server: ForkServer, folder: JobDir, command: list[str], **kw: object) -> tuple[int, int]:
    """A shim for ``command`` in ``folder``, waiting at its gate: its PID and the gate."""
    ticket, gate = ask(server, folder, command, **kw)
    return server.answer(ticket), gate


def ask(server: ForkServer, folder: JobDir, command: list[str], **kw: object) -> tuple[Ticket, int]:
    """The request for ``fork``'s shim, sent and not answered yet; its ticket and gate."""
    folder.path.mkdir(parents=True, exist_ok=True)
    gate_r, gate_w = os.pipe()
    with open(folder.log, "ab") as err:  # the shim's stderr is its log, as spawn gives it
        ticket = server.send(
            [*shim_args(folder, "/", 1.0, 1 << 20, None), *command],
            {**os.environ, "DDPQ_ATTEMPT": "1", "DDPQ_JOB_DIR": str(folder.path)},
            uid=None,
            gid=None,
            umask=0o022,
            cgroup=kw.get("cgroup"),  # type: ignore[arg-type]
            gate=gate_r,
            stderr=err.fileno(),
        )
    os.close(gate_r)
    return ticket, gate_w


def test_a_forked_shim_runs_its_job_once_let_go_and_shows_as_a_shim(
    server: ForkServer, tmp_path: Path
) -> None:
    folder = JobDir(tmp_path / "jobs" / "7")
    pid, gate = fork(server, folder, ["sh", "-c", "echo ran"])
    ident = procs.identity(pid)
    assert ident is not None
    # ps and a restarted worker's search see what it is, not the server it came from
    # (once the child has retitled itself, right after the fork).
    title = b"ddpq-shim\x00--job-dir\x00" + str(folder.path).encode() + b"\x00"
    wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title), what="its title")
    assert procs.find_shim(str(folder.path)) == pid
    assert folder.log.read_bytes() == b""  # nothing ran before its word
    os.write(gate, b"s")
    os.close(gate)
    wait_for(lambda: not procs.is_alive(ident), what="the shim to end")
    record = folder.read_exit_record(1)
    assert record is not None and record.exit_code == 0 and record.launched
    assert folder.log.read_text().splitlines()[-1] == "ran"


def test_a_shim_whose_gate_closes_records_that_nothing_ran(
    server: ForkServer, tmp_path: Path
) -> None:
    folder = JobDir(tmp_path / "jobs" / "8")
    marker = tmp_path / "ran"
    pid, gate = fork(server, folder, ["touch", str(marker)])
    ident = procs.identity(pid)
    assert ident is not None
    os.close(gate)  # the worker went away before its word
    wait_for(lambda: not procs.is_alive(ident), what="the shim to end")
    record = folder.read_exit_record(1)
    assert record is not None and not record.launched and not marker.exists()
    # Said on its stderr, which is the job's log: no file of its own in the folder.
    assert "ddpq shim: the worker went away before the job started" in folder.log.read_text()
    assert sorted(os.listdir(folder.path)) == ["exit.json", "output.log"]


def test_a_shim_that_cannot_join_its_cgroup_never_runs_and_says_why(
    server: ForkServer, tmp_path: Path
) -> None:
    folder = JobDir(tmp_path / "jobs" / "9")
    marker = tmp_path / "ran"
    missing = tmp_path / "no-such-cgroup"
    pid, gate = fork(server, folder, ["touch", str(marker)], cgroup=missing)
    wait_for(lambda: folder.read_exit_record(1), what="the shim's record")
    os.close(gate)
    record = folder.read_exit_record(1)
    assert record is not None and record.error is not None
    assert f"cannot join its cgroup {missing}" in record.error and not marker.exists()
    assert record.error.startswith("cannot start the job")
    assert pid > 0


def test_the_server_ends_with_its_worker_and_a_new_one_starts_on_demand(
    server: ForkServer, tmp_path: Path
) -> None:
    fork_pid, gate = fork(server, JobDir(tmp_path / "jobs" / "10"), ["true"])
    os.close(gate)
    first = server.pid
    assert first is not None
    server.close()  # our end closed: it exits (and is reaped)
    assert not procs.is_alive(procs.Identity(first, 0)) and server.pid is None
    _, gate = fork(server, JobDir(tmp_path / "jobs" / "11"), ["true"])
    os.close(gate)
    assert server.pid not in (None, first)
    assert fork_pid > 0


def test_a_server_that_cannot_start_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    fs = ForkServer(str(tmp_path / "no-python"), tmp_path / "jobs")
    with pytest.raises(ForkServerUnavailable):
        fork(fs, JobDir(tmp_path / "jobs" / "1"), ["true"])
    fs.close()


def shim_of(folder: str, pid: int, n: int) -> None:
    """Wait until ``pid`` shows as the shim of ``folder`` (once it has retitled itself)."""
    wait_for(lambda: procs.find_shim(folder) == pid, what=f"shim {n}")


def test_requests_sent_together_are_answered_each_with_its_own_shim(
    server: ForkServer, tmp_path: Path
) -> None:
    # Three requests before any answer, the middle one refused by the server (not a
    # request it can read): the answers come in order, each for its own request.
    first, gate_1 = ask(server, JobDir(tmp_path / "jobs" / "1"), ["true"])
    assert server._sock is not None
    server._sock.sendmsg([b"not a request"])
    refused = Ticket(server._sock)
    third, gate_3 = ask(server, JobDir(tmp_path / "jobs" / "3"), ["true"])
    pids = {1: server.answer(first)}
    with pytest.raises(OSError, match="could not fork"):
        server.answer(refused)
    pids[3] = server.answer(third)
    for n, pid in pids.items():
        folder = str(tmp_path / "jobs" / str(n))
        shim_of(folder, pid, n)
    for gate in (gate_1, gate_3):
        os.close(gate)  # nothing runs: each shim records that and ends


def test_a_request_the_server_went_away_from_is_lost(server: ForkServer, tmp_path: Path) -> None:
    ticket, gate = ask(server, JobDir(tmp_path / "jobs" / "1"), ["true"])
    os.close(gate)
    server.close()  # a new server would never answer the old one's requests
    with pytest.raises(ForkServerLost):
        server.answer(ticket)
    _, gate = fork(server, JobDir(tmp_path / "jobs" / "2"), ["true"])  # a new one serves
    os.close(gate)


def test_a_send_that_fails_leaves_the_answers_already_sent_to_be_read(
    server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The third request of a pass cannot be sent (the server is gone, say): the first
    # two were forked and answered, and their answers are still read; only then is the
    # connection given up, and the next request starts a new server.
    tickets, gates = [], []
    for n in (1, 2):
        ticket, gate = ask(server, JobDir(tmp_path / "jobs" / str(n)), ["true"])
        tickets.append(ticket)
        gates.append(gate)
    first = server.pid
    real_sendmsg = socket.socket.sendmsg

    def broken(self: socket.socket, *args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(socket.socket, "sendmsg", broken)
    with pytest.raises(ForkServerUnavailable):
        ask(server, JobDir(tmp_path / "jobs" / "3"), ["true"])
    with pytest.raises(ForkServerUnavailable):  # nothing more goes on that connection
        ask(server, JobDir(tmp_path / "jobs" / "4"), ["true"])
    monkeypatch.setattr(socket.socket, "sendmsg", real_sendmsg)
    for n, ticket in enumerate(tickets, 1):
        pid = server.answer(ticket)
        folder = str(tmp_path / "jobs" / str(n))
        shim_of(folder, pid, n)
    assert server.pid is None  # given up once its answers were read
    for gate in gates:
        os.close(gate)
    _, gate = fork(server, JobDir(tmp_path / "jobs" / "5"), ["true"])
    os.close(gate)
    assert server.pid not in (None, first)
