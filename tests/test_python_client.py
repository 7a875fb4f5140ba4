"""``from ddpq import Client`` against a real daemon: submit → wait → logs → history, a
sweep, cancel, the errors it raises (HTTP status and reason), and ``import ddpq`` left
light (the client is imported when first named)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddpq import Client, DdpqError, Unreachable
from ddpq.core.states import JobState
from tests.helpers import Daemon, free_port, wait_for


@pytest.fixture(scope="module")
def daemon(module_daemons: Callable[..., Daemon]) -> Daemon:
    return module_daemons("--fake-gpus", "2", "--grace", "1s")


@pytest.fixture
def q(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.url) as client:
        yield client


def test_submit_wait_logs_history(q: Client, tmp_path: Path) -> None:
    job = q.submit(
        ["sh", "-c", 'echo "hi $GREETING from $(pwd)"; echo err >&2; printf "no end"'],
        name="py-e2e",
        cwd=tmp_path,
        env={"GREETING": "hello"},
        time_limit="10m",
    )
    assert job.name == "py-e2e" and job.time_limit_s == 600
    done = q.wait(job.id, timeout=60)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    lines = list(q.logs(job.id))
    assert f"hi hello from {tmp_path}" in lines and "err" in lines
    assert lines[-1] == "no end"  # the last line, though it has no newline
    assert list(q.logs(job.id, follow=True)) == lines  # an ended job: the same, then done
    rows = q.history(name="py-e2e")
    assert [r.id for r in rows] == [job.id]
    assert rows[0].state is JobState.SUCCEEDED and rows[0].attempts == 1
    assert 0 <= rows[0].elapsed_s < 60
    assert q.history(name="py-e2e", states=["failed"]) == []
    assert q.history(name="py-e2e", since="1h", until=2e9)[0].id == job.id


def test_follow_streams_a_running_jobs_lines(q: Client, tmp_path: Path) -> None:
    job = q.submit(["sh", "-c", "echo one; sleep 1; echo two"], cwd=tmp_path)
    assert [line for line in q.logs(job.id, follow=True) if "[ddpq]" not in line] == [
        "one",
        "two",
    ]
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED


def test_a_sweep_and_its_members_in_history(q: Client, tmp_path: Path) -> None:
    sweep = q.sweep(
        ["sh", "-c", "echo lr={lr}"], params={"lr": ["0.1", "0.2"]}, name="py-sw", cwd=tmp_path
    )
    members = wait_for(
        lambda: rows if len(rows := q.history(name="py-sw*", everyone=True)) == 2 else None,
        60,
        "the sweep's two jobs to finish",
    )
    assert {r.sweep_id for r in members} == {sweep.id}
    outputs = {line for r in members for line in q.logs(r.id) if line.startswith("lr=")}
    assert outputs == {"lr=0.1", "lr=0.2"}


def test_wait_times_out_and_cancel_ends_it(q: Client, tmp_path: Path) -> None:
    job = q.submit(["sleep", "60"], cwd=tmp_path)
    with pytest.raises(TimeoutError, match=f"job {job.id} is still"):
        q.wait(job.id, timeout=0.3)
    q.cancel(job.id)
    assert q.wait(job.id, timeout=30).state is JobState.CANCELLED


def test_refusals_carry_the_http_status_and_the_reason(q: Client) -> None:
    with pytest.raises(DdpqError) as missing:
        q.show(10**9)
    assert missing.value.status == 404 and "no job" in missing.value.detail
    with pytest.raises(DdpqError) as invalid:
        q.submit(["true"], gpus=-1)
    assert invalid.value.status == 422 and "gpus" in invalid.value.detail
    with pytest.raises(ValueError, match="since"):
        q.history(since="yesterday")
    with pytest.raises(ValueError, match="not a finished state"):
        q.history(states=["queued"])
    with pytest.raises(TypeError, match="list"):
        q.submit("echo hi")  # a string (a Sequence[str] too), by mistake


def test_an_unreachable_daemon_raises_unreachable() -> None:
    with Client(f"http://127.0.0.1:{free_port()}") as q, pytest.raises(Unreachable) as err:
        q.show(1)
    assert err.value.status is None


def test_import_ddpq_stays_light() -> None:
    code = (
        "import sys, ddpq; assert not [m for m in sys.modules if m.startswith('ddpq.')], "
        "sorted(sys.modules); from ddpq import Client; assert 'ddpq.client.library' in "
        "sys.modules; assert 'pydantic' not in sys.modules and 'typer' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_with_no_url_it_finds_the_daemons_socket_as_the_cli_does(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import getpass

    monkeypatch.delenv("DDPQ_URL", raising=False)
    monkeypatch.delenv("DDPQ_TOKEN", raising=False)
    monkeypatch.setenv("DDPQ_SOCKET", str(daemon.home / "ddpq.sock"))
    with Client() as q:
        assert q.url == f"unix:{daemon.home / 'ddpq.sock'}"
        job = q.submit(["true"], name="py-socket", cwd=tmp_path)
        assert job.owner == getpass.getuser()  # the socket's caller, not a name sent
        q.wait(job.id, timeout=60)
        assert [r.id for r in q.history(name="py-socket")] == [job.id]  # "yours"
