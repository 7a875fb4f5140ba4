"""`ddpq history` against a real daemon: finished jobs filtered by owner, state, name and
window; the fields --format chooses as a table, CSV and JSON (parsed back); and every class
of bad input one line and exit 2, never a traceback."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.history import history_table
from ddpq.client.history_fields import FIELDS
from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import Daemon, free_port, wait_done
from tests.test_cli_fit import drawn


@dataclass(frozen=True)
class Jobs:
    daemon: Daemon
    ok: int
    bad: int
    killed: int
    cancelled: int
    alices: int


@pytest.fixture(scope="module")
def jobs(module_daemons: Callable[..., Daemon], tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    """One daemon, five finished jobs: four of this account's, one of alice's."""
    d = module_daemons("--fake-gpus", "2", "--grace", "1s")
    cwd = str(tmp_path_factory.mktemp("jobs"))
    c = d.client()

    def submit(name: str, command: list[str], **kw: Any) -> int:
        return c.submit(JobSubmit(name=name, command=command, cwd=cwd, **kw)).id

    ok = submit("h-ok", ["true"])
    bad = submit("h-bad", ["sh", "-c", "exit 3"])
    killed = submit("h-kill", ["sh", "-c", "kill -9 $$"], gpus=1)
    cancelled = submit("h-cancel", ["sleep", "60"], hold=True)
    c.cancel(cancelled)
    alices = submit("a-ok", ["true"], owner="alice")
    for job_id in (ok, bad, killed, cancelled, alices):
        wait_done(c, job_id)
    return Jobs(d, ok, bad, killed, cancelled, alices)


def run_history(jobs: Jobs, *args: str) -> subprocess.CompletedProcess[str]:
    """``ddpq history ARGS`` against the module's daemon, in this process
    (tests/cli_inprocess.py): what it prints is checked, not its process."""
    env = {"DDPQ_URL": jobs.daemon.url, "DDPQ_TOKEN": None, "COLUMNS": "200"}
    return run_in_process("history", *args, env=env)


def history(jobs: Jobs, *args: str) -> str:
    r = run_history(jobs, *args)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def first_column(table: str) -> list[int]:
    """The ids of a table's rows (its first column), in order."""
    return [int(line.split()[0]) for line in table.splitlines()[1:] if line.strip()]


def test_yours_oldest_first_then_someone_elses_or_everyones(jobs: Jobs) -> None:
    mine = {jobs.ok, jobs.bad, jobs.killed, jobs.cancelled}
    assert set(first_column(history(jobs, "-o", "id"))) == mine
    assert first_column(history(jobs, "-o", "id", "--user", "alice")) == [jobs.alices]
    assert set(first_column(history(jobs, "-o", "id", "--all"))) == {*mine, jobs.alices}
    # Oldest end first, the newest last (as `ddpq ls`).
    ended = [r["ended_at"] for r in json.loads(history(jobs, "--all", "--output", "json"))]
    assert ended == sorted(ended) and len(ended) == 5


def test_state_name_and_window(jobs: Jobs) -> None:
    failed = history(jobs, "-o", "id", "--state", "failed")
    assert sorted(first_column(failed)) == [jobs.bad, jobs.killed]
    both = history(jobs, "-o", "id", "-s", "cancelled,succeeded")
    assert sorted(first_column(both)) == [jobs.ok, jobs.cancelled]
    assert first_column(history(jobs, "-o", "id", "--name", "h-b*")) == [jobs.bad]
    assert first_column(history(jobs, "-o", "id", "--name", "h-ok")) == [jobs.ok]
    assert len(first_column(history(jobs, "-o", "id", "--since", "1h"))) == 4
    assert first_column(history(jobs, "-o", "id", "--until", "1h")) == []  # ended before
    assert first_column(history(jobs, "-o", "id", "--since", "2999-01-01")) == []
    assert len(first_column(history(jobs, "-o", "id", "--since", "2000-01-01 09:00"))) == 4


def test_limit_keeps_the_newest_and_says_so(jobs: Jobs) -> None:
    newest = [r["id"] for r in json.loads(history(jobs, "--output", "json"))][-2:]
    r = run_history(jobs, "-o", "id", "--limit", "2")
    assert first_column(r.stdout) == newest
    assert "older jobs not listed" in r.stderr
    every = run_history(jobs, "-o", "id", "--limit", "0")
    assert len(first_column(every.stdout)) == 4 and every.stderr == ""


def test_the_default_table(jobs: Jobs) -> None:
    table = history(jobs)
    header = table.splitlines()[0].split()
    assert header == [
        "ID",
        "NAME",
        "USER",
        "STATE",
        "ENDED",
        "ELAPSED",
        "GPUS",
        "PEAK",
        "MEM",
        "EXIT",
    ]
    rows = {int(line.split()[0]): line for line in table.splitlines()[1:]}
    assert "SIGKILL" in rows[jobs.killed] and " 1:" in rows[jobs.killed]  # 1 GPU, which
    assert rows[jobs.bad].split()[-1] == "3"
    assert rows[jobs.cancelled].split()[-1] == "-"  # never ran: no exit


def test_csv_parses_with_the_fields_asked(jobs: Jobs) -> None:
    fields = "id,name,user,state,elapsed,attempts,gpus,gpu_ids,exit,reason,started,ended"
    out = history(jobs, "--format", fields, "--output", "csv")
    rows = {int(r["id"]): r for r in csv.DictReader(io.StringIO(out))}
    assert list(next(csv.reader(io.StringIO(out)))) == fields.split(",")
    assert set(rows) == {jobs.ok, jobs.bad, jobs.killed, jobs.cancelled}
    assert rows[jobs.ok]["state"] == "succeeded" and rows[jobs.ok]["exit"] == "0"
    assert rows[jobs.bad]["exit"] == "3" and rows[jobs.bad]["user"] == rows[jobs.ok]["user"]
    assert rows[jobs.killed]["exit"] == "SIGKILL" and rows[jobs.killed]["gpus"] == "1"
    assert rows[jobs.killed]["gpu_ids"] in ("0", "1")
    assert float(rows[jobs.ok]["elapsed"]) >= 0 and rows[jobs.ok]["attempts"] == "1"
    assert rows[jobs.cancelled]["started"] == "" and rows[jobs.cancelled]["attempts"] == "0"
    assert rows[jobs.ok]["ended"].endswith("Z")  # ISO 8601, UTC


def test_json_parses_whole_or_with_the_fields_asked(jobs: Jobs) -> None:
    whole = json.loads(history(jobs, "--output", "json"))
    assert {r["id"] for r in whole} == {jobs.ok, jobs.bad, jobs.killed, jobs.cancelled}
    assert {"elapsed_s", "peak_mem", "exit_code", "exit_signal", "reason"} <= set(whole[0])
    chosen = json.loads(history(jobs, "-o", "id,exit,elapsed,gpu_ids", "--output", "json"))
    by_id = {r["id"]: r for r in chosen}
    assert set(chosen[0]) == {"id", "exit", "elapsed", "gpu_ids"}
    assert by_id[jobs.bad]["exit"] == 3 and by_id[jobs.killed]["exit"] == "SIGKILL"
    assert by_id[jobs.cancelled]["exit"] is None and by_id[jobs.cancelled]["gpu_ids"] == []
    assert isinstance(by_id[jobs.ok]["elapsed"], float)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--format", "id,bogus"], "unknown field 'bogus' (known: id, name, user, state"),
        (["--format", ","], "no field given"),
        (["--state", "queued"], "--state: 'queued' is not a finished state"),
        (["--state", "bogus"], "not a finished state"),
        (["--since", "yesterday"], "--since: 'yesterday' is neither a duration"),
        (["--until", "-3d"], "--until"),
        (["--since", "1h", "--until", "2h"], "--since: not before --until"),
        (["--user", "bob", "--all"], "--user and --all"),
        (["--output", "yaml"], "--output: 'yaml' is not one of table, csv, json"),
        (["--limit", "-1"], "--limit"),
        (["--name", "x" * 200], "--name: String should have at most 128 characters"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(jobs: Jobs, args: list[str], says: str) -> None:
    r = run_history(jobs, *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("ddpq: ") and says in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_an_unreachable_daemon_is_exit_3(tmp_path: Path) -> None:
    d = Daemon(tmp_path, free_port())  # never started
    r = d.cli("history", check=False)
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr


# ---- the table's fit, without a daemon ------------------------------------------------------

EVERY_FIELD = list(FIELDS)


def a_row(job_id: int) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": f"resnet18-lr-sweep-{job_id}",
        "owner": "alice",
        "state": "failed",
        "reason": "out of memory: used its 150M, and then some more words to wrap",
        "sweep_id": None,
        "submitted_at": "2026-12-01T09:00:00Z",
        "started_at": "2026-12-01T09:00:05Z",
        "ended_at": "2026-12-01T10:00:05Z",
        "elapsed_s": 3600.0,
        "attempts": 2,
        "gpus": 2,
        "gpu_ids": [0, 1],
        "cores": 8,
        "mem": 1 << 34,
        "peak_mem": 3 << 30,
        "exit_code": None,
        "exit_signal": 9,
    }


def test_at_80_columns_whole_columns_go_and_no_header_is_cut() -> None:
    lines = drawn(history_table([a_row(1), a_row(2)], EVERY_FIELD), 80, terminal=True)
    assert all(len(line) <= 80 for line in lines), lines
    header = lines[0].split()
    assert header[:2] == ["ID", "NAME"] and "STATE" in header and "EXIT" in header
    assert "SUBMITTED" not in header and "…" not in lines[0]
    assert "SIGKILL" in lines[1] and "resnet18-lr-sweep-1" in lines[1]


def test_into_a_pipe_every_column_and_one_line_a_job() -> None:
    lines = drawn(history_table([a_row(1), a_row(2)], EVERY_FIELD), 80, terminal=False)
    assert len(lines) == 3
    assert lines[0].split()[:4] == ["ID", "NAME", "USER", "STATE"]
    for cell in ("2:0,1", "0,1", "16G", "3G", "1h00m", "SIGKILL", "out of memory"):
        assert cell in lines[1], (cell, lines[1])
