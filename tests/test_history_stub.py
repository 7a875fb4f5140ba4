"""`ddpq history` against a stand-in API: the query it sends (yours by default, the window
in UTC), the pages it follows, a daemon from before the history, and what a row holds kept
inert (control characters, a spreadsheet formula)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.cli_inprocess import run_in_process
from tests.stub_api import Answer, Request, StubApi, json_answer
from tests.test_history_cli import a_row


class Stub:
    def __init__(self) -> None:
        self.pages: dict[str | None, dict[str, Any]] = {None: {"items": [], "next": None}}
        self.status = 200
        self.requests: list[Request] = []


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    state = Stub()

    def answer(request: Request) -> Answer:
        state.requests.append(request)
        if state.status != 200:
            return json_answer(state.status, {"detail": "Not Found"})
        after = request.query.get("after", [None])[0]
        return json_answer(200, state.pages[after])

    with StubApi(answer) as api:
        monkeypatch.setenv("DDPQ_URL", api.url)
        monkeypatch.delenv("DDPQ_TOKEN", raising=False)
        yield state


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """``ddpq history ARGS`` in this process against the stub (its exit status, out, err)."""
    del monkeypatch, capsys  # the stub's fixture set the environment; output is captured
    done = run_in_process("history", *args, env={"COLUMNS": "300"})
    return done.returncode, done.stdout, done.stderr


def test_the_query_is_yours_unless_told_and_the_window_in_utc(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(monkeypatch, capsys)[0] == 0
    assert run(monkeypatch, capsys, "--user", "bob", "-s", "failed", "--name", "lr-*")[0] == 0
    args = ("--all", "--since", "2026-12-01T09:00+01:00", "--until", "2026-12-02T00:00Z")
    assert run(monkeypatch, capsys, *args)[0] == 0
    mine, bobs, everyones = (r.query for r in stub.requests)
    assert mine == {"mine": ["true"], "limit": ["100"]}
    assert bobs == {"user": ["bob"], "state": ["failed"], "name": ["lr-*"], "limit": ["100"]}
    assert "mine" not in everyones and "user" not in everyones
    since = datetime.fromisoformat(everyones["since"][0])
    assert since == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert datetime.fromisoformat(everyones["until"][0]) == datetime(2026, 12, 2, tzinfo=UTC)


def test_limit_0_follows_every_page_and_prints_oldest_first(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.pages = {
        None: {"items": [a_row(5), a_row(4)], "next": "5.0:4"},
        "5.0:4": {"items": [a_row(3), a_row(2)], "next": "3.0:2"},
        "3.0:2": {"items": [a_row(1)], "next": None},
    }
    code, out, err = run(monkeypatch, capsys, "--limit", "0", "-o", "id")
    assert code == 0 and err == "", err
    assert out.split()[1:] == ["1", "2", "3", "4", "5"]
    assert [r.query.get("after") for r in stub.requests] == [None, ["5.0:4"], ["3.0:2"]]
    assert all(r.query["limit"] == ["1000"] for r in stub.requests)
    stub.requests.clear()
    code, out, err = run(monkeypatch, capsys, "--limit", "3", "-o", "id")
    assert out.split()[1:] == ["3", "4", "5"] and "older jobs not listed" in err
    assert [r.query["limit"] for r in stub.requests] == [["3"], ["1"]]


def test_a_daemon_without_the_history_says_so_in_one_line(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.status = 404
    code, out, err = run(monkeypatch, capsys)
    assert code == 1 and out == "", err
    assert err.count("\n") == 1 and "has no history" in err and "older" in err


def test_what_a_row_holds_stays_inert(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = {**a_row(1), "name": "\x1b]0;pwned\x07[red]x[/red]", "reason": "=HYPERLINK(1)"}
    stub.pages = {None: {"items": [evil], "next": None}}
    code, out, _ = run(monkeypatch, capsys, "-o", "id,name,reason")
    assert code == 0 and "\x1b" not in out and "\\x1b]0;pwned\\x07[red]x[/red]" in out
    code, out, _ = run(monkeypatch, capsys, "-o", "id,name,reason", "--output", "csv")
    assert code == 0 and "\x1b" not in out and ",'=HYPERLINK(1)" in out
