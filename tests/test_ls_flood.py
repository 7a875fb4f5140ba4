"""`ddpq ls` with thousands of someone else's held jobs in the queue asks the daemon for
one screen: one request, an answer whose size does not grow with the jobs it does not
show, the same as on an empty queue (issue 23: six held arrays of 10,000 made another
user's `ls` page through 60,000 jobs). Counted, not timed: requests and bytes."""

from __future__ import annotations

import getpass
import json
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest
from sqlalchemy import Table, insert

from ddpq import entry
from ddpq.client import transport
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store.db import Database
from ddpq.store.models import Job, new_row
from tests.helpers import Daemon

FOREIGN = 3_000  # bob's plain held jobs, and as many again in one held array


def run_ls(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, *args: str
) -> tuple[str, int, int]:
    """`ddpq ls ARGS` in this process: what it printed, its requests and the bytes of
    their answers."""
    seen = {"requests": 0, "bytes": 0}
    real: Callable[..., Any] = transport.Transport.request

    def counting(self: transport.Transport, *a: Any, **kw: Any) -> Any:
        answer = real(self, *a, **kw)
        seen["requests"] += 1
        seen["bytes"] += len(answer.body)
        return answer

    monkeypatch.setattr(transport.Transport, "request", counting)
    monkeypatch.setenv("DDPQ_URL", url)
    monkeypatch.delenv("DDPQ_TOKEN", raising=False)
    monkeypatch.setattr(sys, "argv", ["ddpq", "ls", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        entry.main()
        raise SystemExit(0)
    assert not exc.value.code
    return capsys.readouterr().out, seen["requests"], seen["bytes"]


def flood(d: Daemon) -> None:
    """bob's held jobs: one array through the API, the plain ones written straight into
    the store as held rows in one statement (3,000 submissions would take the test's time
    for nothing it checks)."""
    body = {
        "template": {"command": ["true"], "gpus": 0, "hold": True, "owner": "bob"},
        "array": f"0-{FOREIGN - 1}",
    }
    assert httpx.post(f"{d.url}/v1/sweeps", json=body, timeout=60).status_code == 201
    spec = JobSpec(name="flood", owner="bob", command=["true"], cwd="/tmp", gpus=0, hold=True)
    db = Database(d.home / "ddpq.db")
    try:
        with db.write() as s:
            row = new_row(spec, JobState.HELD, "held", time.time())
            s.connection().execute(insert(cast(Table, Job.__table__)), [row] * FOREIGN)
    finally:
        db.dispose()


def test_ls_asks_for_one_screen_however_long_the_queue(
    make_daemon: Callable[..., Daemon],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir("/tmp")
    d = make_daemon("--fake-gpus", "2", "--max-queued-per-user", "0")
    me = getpass.getuser()
    _, empty_requests, empty_bytes = run_ls(monkeypatch, capsys, d.url)
    mine = httpx.post(
        f"{d.url}/v1/jobs",
        json={"command": ["true"], "gpus": 0, "hold": True, "name": "my-own"},
        headers={"X-Ddpq-User": me},
    ).json()["id"]
    flood(d)

    out, requests, size = run_ls(monkeypatch, capsys, d.url)
    assert requests == empty_requests == 1
    assert size < empty_bytes + 4096, size  # my one row and a line of counts, not 6,000 rows
    assert "my-own" in out and str(mine) in out
    assert f"bob {2 * FOREIGN} held" in out and "flood" not in out

    # Asking for bob's: one screen of them (100 rows and the array), the rest counted.
    out, requests, size = run_ls(monkeypatch, capsys, d.url, "--user", "bob")
    assert requests == 1 and size < 200_000, size
    assert out.count("flood") == 100 and f"bob {2 * FOREIGN - 100} held" not in out
    assert f"bob {FOREIGN - 100} held" in out  # the array is its one row, counted there
    out, requests, _ = run_ls(monkeypatch, capsys, d.url, "--user", "bob", "--expand")
    assert requests == 1 and f"bob {2 * FOREIGN - 100} held" in out

    # --json is every matching job, page after page: what a script asked for.
    out, requests, _ = run_ls(monkeypatch, capsys, d.url, "--json", "--user", "bob")
    assert requests == (2 * FOREIGN) // 1000 and len(json.loads(out)) == 2 * FOREIGN


def test_a_limit_past_what_the_daemon_gives_is_one_line_of_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DDPQ_URL", "http://127.0.0.1:9")  # never reached
    monkeypatch.setattr(sys, "argv", ["ddpq", "ls", "--limit", "5000"])
    with pytest.raises(SystemExit) as exc:
        entry.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--limit: at most 1,000 rows" in err, err
