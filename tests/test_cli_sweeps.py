"""Sweeps, arrays and preemption as a user types them: `ddpq submit --sweep/--array`, `ls`
folding a sweep into one line, `show sN --sort`, cancel/hold/release of a sweep, `--after sN`;
and the class of bad input each takes (exit 2, one line, nothing queued)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from ddpq.client.sweeps import BadRef, fold, parse_ref, sweep_params
from tests.cli_inprocess import ddpq_in_process
from tests.helpers import Daemon, wait_done, wait_for

# Each member writes its own metric, then waits for its gate file (the test holds it).
SCRIPT = (
    'echo "lr={lr} bs={bs} index=$DDPQ_SWEEP_INDEX"; '
    'echo "{\\"epoch\\": 1, \\"test_acc\\": {lr}}" > "$DDPQ_JOB_DIR/metrics.jsonl"; '
    "while [ ! -e {gate} ]; do sleep 0.05; done"
)


def said(d: Daemon, *args: str) -> str:
    """What ``ddpq ARGS`` prints against ``d``, which must succeed. In this process (as the
    usage errors below): what is checked is what the command says, not the process."""
    r = ddpq_in_process(d.url, *args)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def sweep_detail(d: Daemon, ref: str, *args: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(said(d, "show", ref, "--json", *args))
    return out


def test_a_sweep_from_the_cli_is_one_line_in_ls_and_a_table_in_show(
    daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    script = SCRIPT.replace("{gate}", shlex.quote(str(gate)))
    out = said(
        daemon,
        "submit",
        "--sweep", "lr=0.3,0.1,0.2",
        "--sweep", "bs=8,16",
        "--max-running", "2",
        "--", "sh", "-c", script,
    ).strip()  # fmt: skip
    assert out == "s1"
    c = daemon.client()
    jobs = c.list().items
    assert len(jobs) == 6 and {j.sweep_id for j in jobs} == {1}
    # The first --sweep varies slowest: members 0..5 are lr 0.3/8, 0.3/16, 0.1/8, ...
    detail = sweep_detail(daemon, "s1")
    members = detail["members"]
    assert isinstance(members, list)
    assert [(m["params"]["lr"], m["params"]["bs"]) for m in members] == [
        ("0.3", "8"), ("0.3", "16"), ("0.1", "8"), ("0.1", "16"), ("0.2", "8"), ("0.2", "16"),
    ]  # fmt: skip
    wait_for(lambda: "2 running" in said(daemon, "ls"), what="two members running")
    listing = said(daemon, "ls")
    assert "s1" in listing and "6 (2 at once)" in listing and "4 queued" in listing
    assert not any(line.startswith(str(j.id) + " ") for j in jobs for line in listing.splitlines())
    expanded = said(daemon, "ls", "--expand")
    assert all(any(line.startswith(f"{j.id} ") for line in expanded.splitlines()) for j in jobs)
    after = int(said(daemon, "submit", "--after", "s1", "--", "echo", "after"))
    assert c.show(after).state == "held"
    gate.touch()
    for j in jobs:
        assert wait_done(c, j.id, timeout=90).state == "succeeded"
    assert wait_done(c, after).state == "succeeded"
    best_first = sweep_detail(daemon, "s1", "--sort", "-test_acc")["members"]
    assert isinstance(best_first, list)
    assert [m["params"]["lr"] for m in best_first] == ["0.3", "0.3", "0.2", "0.2", "0.1", "0.1"]
    shown = said(daemon, "show", "s1", "--sort", "-test_acc")
    assert "6 succeeded" in shown and "TEST_ACC" in shown
    log = c.log_tail(jobs[1].id).decode()
    assert "lr=0.3 bs=16 index=1" in log


def test_an_array_is_held_released_and_cancelled_as_one(daemon: Daemon) -> None:
    assert said(daemon, "submit", "--hold", "--array", "0-9:3", "--", "echo", "{index}") == ("s1\n")
    c = daemon.client()
    ids = [j.id for j in c.list().items]
    assert [c.show(i).sweep_index for i in ids] == [0, 3, 6, 9]
    held = said(daemon, "hold", "s1")
    assert held.startswith("s1: ") and "4 held" in held
    released = said(daemon, "release", "s1")
    assert "released" in released or "queued" in released, released
    for i in ids:
        assert wait_done(c, i).state == "succeeded"
    assert b"9" in c.log_tail(ids[-1])
    # Ended members are not cancelled again; a sweep that does not exist is exit 4.
    assert "4 succeeded" in said(daemon, "cancel", "s1")
    missing = ddpq_in_process(daemon.url, "cancel", "s9")
    assert missing.returncode == 4 and "no sweep 9" in missing.stderr


BAD_SUBMISSIONS = [
    (["--sweep", "lr"], "--sweep 'lr': expected NAME=VALUE"),
    (["--sweep", "=1,2"], "expected NAME=VALUE"),
    (["--sweep", "lr=1", "--sweep", "lr=2"], "--sweep lr: given twice"),
    (["--max-running", "2"], "--max-running: only with --sweep or --array"),
    (["--after", "sx"], "'sx' is not a job id (12) or a sweep (s3)"),
    (["--after", "s0"], "ids start at 1"),
    (["--after", "٣"], "is not a job id"),  # a digit of another script
    (["--array", "5-1"], "array"),  # the daemon's 422, said as the option
    (["--sweep", "unused=1,2"], "unused"),  # a parameter the command never names
    (["--after", "s7"], "sweep 7"),  # the daemon's 404 for an unknown sweep
]


@pytest.mark.parametrize(("options", "shown"), BAD_SUBMISSIONS, ids=lambda x: str(x)[:30])
def test_bad_sweep_submissions_are_one_line_and_queue_nothing(
    shared_daemon: Daemon, options: list[str], shown: str
) -> None:
    # In this process: what is checked is what the command says, not the process.
    queued = shared_daemon.client().list().total
    r = ddpq_in_process(shared_daemon.url, "submit", *options, "--", "echo", "x")
    assert r.returncode != 0 and shown in r.stderr, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert shared_daemon.client().list().total == queued  # nothing queued


@pytest.mark.parametrize("command", [["show"], ["cancel"], ["hold"], ["release"]])
@pytest.mark.parametrize("ref", ["x", "s", "s-1", "1.5", "ss2", "s 2", "0", "9" * 19])
def test_bad_references_are_usage_errors(
    shared_daemon: Daemon, command: list[str], ref: str
) -> None:
    r = ddpq_in_process(shared_daemon.url, *command, ref)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r


def test_references_parse_as_jobs_or_sweeps() -> None:
    assert (parse_ref("12").id, parse_ref("12").sweep) == (12, False)
    assert (parse_ref("s3").id, parse_ref("S3").sweep) == (3, True)
    for bad in ("", "s", "-1", "s-1", "1e3", "0x1", "s٣"):
        with pytest.raises(BadRef):
            parse_ref(bad)
    assert sweep_params(["a=1,2", "b=x"]) == {"a": ["1", "2"], "b": ["x"]}
    with pytest.raises(BadRef, match="an empty value"):  # a slip (issue 26): never a value
        sweep_params(["a=1,2", "b="])
    jobs: list[dict[str, Any]] = [{"id": 1, "sweep_id": None}, {"id": 2, "sweep_id": 5}]
    jobs.append({"id": 3, "sweep_id": 4})
    assert fold([*jobs, {"id": 4, "sweep_id": 5}]) == ([jobs[0]], [5, 4])


def test_an_admin_preempts_from_the_cli_and_refusals_are_one_line(shared_daemon: Daemon) -> None:
    job = int(said(shared_daemon, "submit", "--hold", "--", "true"))
    r = ddpq_in_process(shared_daemon.url, "preempt", str(job))
    assert r.returncode == 1 and "only a running job is preempted" in r.stderr, r
    missing = ddpq_in_process(shared_daemon.url, "preempt", "999")
    assert missing.returncode == 4, missing
