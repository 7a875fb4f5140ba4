"""``ddpq usage``: its table, CSV and JSON from the API's answer, its exit codes and one-line
errors for bad options and refusals, and hostile text kept inert (a stand-in API)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest

from ddpq.client.usage import CSV_COLUMNS
from tests.cli_inprocess import run_in_process
from tests.helpers import free_port
from tests.stub_api import Answer, Request, StubApi, json_answer

FINAL = {"succeeded": 3, "failed": 1, "cancelled": 0, "timed_out": 2}


def a_row(key: str, kind: str, **over: Any) -> dict[str, Any]:
    return {
        "key": key,
        "kind": kind,
        "gpu_hours_jobs": 24.25,
        "gpu_hours_outside": 1.5,
        "jobs": FINAL,
        "jobs_started": 4,
        "wait_p50_s": 90.0,
        "wait_p90_s": 7200.0,
        "mem_reserved_gib_h": None,
        "mem_used_gib_h": None,
        "mem_used_peak_gib": None,
        "core_hours": 6.5,
        **over,
    }


def report(*rows: dict[str, Any], by: str = "user") -> dict[str, Any]:
    return {
        "since": "2026-11-01T00:00:00Z",
        "until": "2026-12-01T00:00:00Z",
        "by": by,
        "outside_use": "count",
        "rows": list(rows),
        "total": a_row("total", "total", gpu_hours_jobs=48.5),
    }


class Stub:
    def __init__(self) -> None:
        self.answer: Answer = json_answer(200, report(a_row("alice", "user")))
        self.requests: list[Request] = []


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    state = Stub()

    def answer(request: Request) -> Answer:
        state.requests.append(request)
        return state.answer

    with StubApi(answer) as api:
        monkeypatch.setenv("DDPQ_URL", api.url)
        monkeypatch.delenv("DDPQ_TOKEN", raising=False)
        yield state


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """``ddpq usage ARGS`` in this process against the stub (its exit status, out, err)."""
    del monkeypatch, capsys  # the stub's fixture set the environment; output is captured
    done = run_in_process("usage", *args, env={"COLUMNS": "200"})
    return done.returncode, done.stdout, done.stderr


def one_line_error(code: int, err: str, expected: int, *words: str) -> None:
    assert code == expected, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


# ---- what it prints ---------------------------------------------------------------------------


def test_the_table_shows_each_group_and_the_total(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.answer = json_answer(
        200,
        report(
            a_row("alice", "user", mem_reserved_gib_h=12.5, mem_used_gib_h=7.25),
            a_row("robert", "account", gpu_hours_jobs=0.0),
        ),
    )
    code, out, err = run(monkeypatch, capsys, "--since", "30d")
    assert code == 0, err
    lines = out.splitlines()
    assert "since 30d ago; outside use counts towards fair share" in lines[0]
    assert lines[1].split() == [
        "USER", "JOBS", "GPU-H", "OUTSIDE", "GPU-H", "CORE-H", "SUCCEEDED", "FAILED", "CANCELLED",
        "TIMED_OUT", "STARTED", "WAIT", "P50", "WAIT", "P90", "MEM", "GIB-H", "RES/USED",
    ]  # fmt: skip
    assert lines[2].split() == [
        "alice", "24.2", "1.5", "6.5", "3", "1", "0", "2", "4", "1m30s", "2h00m", "12.5/7.2",
    ]  # fmt: skip
    assert lines[3].split()[:3] == ["account", "robert", "0.0"]
    assert lines[3].split()[-1] == "-"  # nothing shared by memory
    assert lines[4].split()[:2] == ["total", "48.5"]
    (request,) = stub.requests
    assert request.path == "/v1/usage" and request.query == {"since": ["30d"], "by": ["user"]}


def test_csv_has_a_header_every_row_and_the_total_last(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.answer = json_answer(200, report(a_row("2026-11-30", "day"), by="day"))
    code, out, _ = run(monkeypatch, capsys, "--by", "day", "--csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == CSV_COLUMNS
    assert rows[1] == [
        "2026-11-30", "day", "24.25", "1.5", "3", "1", "0", "2", "4", "90", "7200", "", "", "",
        "6.5",
    ]  # fmt: skip
    assert rows[2][:3] == ["total", "total", "48.5"] and len(rows) == 3
    assert stub.requests[0].query["by"] == ["day"]


def test_json_is_the_apis_answer(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(monkeypatch, capsys, "--json", "--by", "month", "--since", "1d12h")
    assert code == 0 and json.loads(out) == report(a_row("alice", "user"))
    assert stub.requests[0].query == {"since": ["1d12h"], "by": ["month"]}


HOSTILE = [
    "\x1b]0;pwned\x07[/bold]",
    "\x1b[2J\r\u202e[red]x[/red]\x9b2J",
    '=HYPERLINK("http://evil")',
    "+1\n-2\t@3",
    "lone\ud800",
]


def inert(out: str) -> bool:
    return not any(
        unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Zl", "Zp"}
        for ch in out
        if ch not in "\n\u200c\u200d"
    )


@pytest.mark.parametrize("text", HOSTILE, ids=ascii)
@pytest.mark.parametrize("form", [(), ("--csv",)], ids=["table", "csv"])
def test_hostile_text_from_the_api_comes_out_inert(
    stub: Stub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    form: tuple[str, ...],
) -> None:
    data = report(a_row(text, text, gpu_hours_jobs=text, jobs={text: text}))
    data["by"] = text
    stub.answer = Answer(200, json.dumps(data).encode(), {"Content-Type": "application/json"})
    code, out, err = run(monkeypatch, capsys, *form)
    assert code == 0, err
    assert inert(out.replace("\x1b[1m", "").replace("\x1b[0m", ""))
    if form:  # no cell a spreadsheet would run as a formula
        for row in list(csv.reader(io.StringIO(out)))[1:]:
            assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row


# ---- bad options, refusals: exit codes and one line --------------------------------------------

BAD_SINCE = ["", " ", "0", "-1d", "abc", "nan", "inf", "1e400", "3651d", "1w", "１d", "\x1b[2J"]
BAD_BY = ["", "User", "week", "users", "user;", "\x1b[2J"]


@pytest.mark.parametrize("since", BAD_SINCE, ids=ascii)
def test_a_bad_since_is_a_usage_error_before_any_request(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], since: str
) -> None:
    code, _, err = run(monkeypatch, capsys, f"--since={since}")
    one_line_error(code, err, 2, "--since")
    assert inert(err) and stub.requests == []


@pytest.mark.parametrize("by", BAD_BY, ids=ascii)
def test_a_bad_by_is_a_usage_error_before_any_request(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], by: str
) -> None:
    code, _, err = run(monkeypatch, capsys, f"--by={by}")
    one_line_error(code, err, 2, "--by", "user, day, month")
    assert inert(err) and stub.requests == []


def test_csv_and_json_together_are_a_usage_error(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "--csv", "--json")
    one_line_error(code, err, 2, "--csv", "--json")


@pytest.mark.parametrize(
    ("status", "expected"),
    [(422, 2), (401, 5), (403, 5), (500, 1), (503, 1)],
)
def test_a_refusal_is_one_line_with_its_exit_code(
    stub: Stub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    status: int,
    expected: int,
) -> None:
    stub.answer = json_answer(status, {"detail": "since: \x1b[2Jno\nway", "code": "x"})
    code, out, err = run(monkeypatch, capsys)
    one_line_error(code, err, expected, "no")
    assert out == "" and inert(err)


def test_no_daemon_is_exit_3() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "usage"],
        capture_output=True,
        text=True,
        env={**os.environ, "DDPQ_URL": f"http://127.0.0.1:{free_port()}", "DDPQ_TOKEN": ""},
        timeout=60,
    )
    one_line_error(r.returncode, r.stderr, 3)


# ---- ddpq gpus names the person ---------------------------------------------------------------


def test_the_gpu_table_names_whose_outside_processes_they_are() -> None:
    from ddpq.client.draw import outside_text

    procs: list[dict[str, Any]] = [
        {"pid": 11, "uid": 1002, "account": "robert", "user": "bob"},
        {"pid": 12, "uid": 1000, "account": "alice", "user": "alice"},
        {"pid": 14, "uid": 1002, "account": "robert", "user": "bob"},
        {"pid": 13, "uid": 4321, "account": None, "user": None},
        {"pid": 15, "used_memory_mb": 3},  # from a daemon that named no owners
    ]
    assert outside_text(procs) == (
        "bob (robert): pid 11, 14; alice: pid 12; uid 4321: pid 13; unknown: pid 15"
    )


@pytest.mark.parametrize("args", [("--csv=yes",), ("--bogus",), ("--since",), ("--by",)])
def test_a_malformed_command_line_is_exit_2_without_a_traceback(args: tuple[str, ...]) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddpq", "usage", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DDPQ_URL": f"http://127.0.0.1:{free_port()}"},
        timeout=60,
    )
    # Click's own usage error, as for every command: "Error: ..." and how to get help.
    assert r.returncode == 2 and "Error:" in r.stderr and "Traceback" not in r.stderr
