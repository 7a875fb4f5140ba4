"""Output that fits (issue 26, items 1, 9 and 10): on an 80-column terminal `ls`, `gpus` and
`usage` drop whole columns by priority, never cut a header; into a pipe every column is
drawn and each job is one line; the GPUS column says "count:indices" or "-"; REASON says
why a job waits, as the daemon decided it."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console

from ddpq.client import draw as drawing
from ddpq.client.format import number_text, progress_line
from ddpq.client.usage import usage_table
from ddpq.client.watchview import render
from tests.test_usage_cli import a_row, report

NOW = datetime.now(UTC) - timedelta(minutes=5)
LONG_REASON = "waiting for 4 GPUs: 2 free; job 1 holds GPUs 0,1 until its time limit (2h)"
PROGRESS = {"epoch": 3, "epochs": 40, "test_acc": 0.712, "images_per_s": 2400, "eta_s": 70}


def job(job_id: int, state: str, **over: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": f"resnet18-lr-sweep-{job_id}",
        "owner": "alice",
        "gpus": 2,
        "state": state,
        "reason": "",
        "submitted_at": NOW.isoformat(),
        "after": [],
        "hold": False,
        "leases": {"gpus": [], "port": None},
        "progress": None,
        **over,
    }


QUEUE = [
    job(1, "running", leases={"gpus": [0, 1], "port": 29500}, progress=PROGRESS),
    job(2, "queued", gpus=4, reason=LONG_REASON),
    job(3, "held", reason="held by user", hold=True),
    job(4, "held", reason="waiting for job 2 to succeed", after=[2]),
    job(5, "queued", gpus=0, reason="waiting for a CPU slot"),
]


def drawn(renderable: Any, width: int, terminal: bool) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=terminal, color_system=None)
    console.soft_wrap = not terminal  # as draw.console() sets it
    console.print(renderable)
    return buf.getvalue().splitlines()


def header_words(line: str) -> list[str]:
    return line.split()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_ls_on_a_terminal_fits_and_drops_whole_columns(width: int) -> None:
    lines = drawn(drawing.jobs_table(QUEUE), width, terminal=True)
    assert all(len(line) <= width for line in lines), lines
    assert not any("…" in line for line in lines), lines  # nothing cut: dropped or wrapped
    header = header_words(lines[0])
    assert set(header) <= set(drawing.JOB_COLUMNS)  # whole headers only, no PROGR…
    for kept in ("ID", "NAME", "STATE", "GPUS", "PROGRESS", "REASON"):
        assert kept in header
    gone = {c for c in drawing.JOB_COLUMNS if c not in header}
    # The empty MEM goes first, then in JOB_DROP's order: never OWNER before PORT.
    assert gone == set(drawing.JOB_DROP[: len(gone)])


def test_a_wide_terminal_keeps_every_column() -> None:
    lines = drawn(drawing.jobs_table(QUEUE), 250, terminal=True)
    assert header_words(lines[0]) == list(drawing.JOB_COLUMNS)
    assert len(lines) == 1 + len(QUEUE)


@pytest.mark.parametrize("width", [40, 80])
def test_ls_into_a_pipe_is_one_line_a_job_with_every_column(width: int) -> None:
    lines = drawn(drawing.jobs_table(QUEUE), width, terminal=False)
    assert header_words(lines[0]) == list(drawing.JOB_COLUMNS)
    assert len(lines) == 1 + len(QUEUE)
    assert lines[2].endswith(LONG_REASON) and progress_line(PROGRESS) in lines[1]
    assert "\x1b" not in "".join(lines)


def test_the_reason_column_tells_a_hold_from_a_dependency_and_says_why_jobs_queue() -> None:
    lines = drawn(drawing.jobs_table(QUEUE), 250, terminal=True)
    start = lines[0].index("REASON")
    reasons = {line.split()[0]: line[start:] for line in lines[1:]}
    assert reasons == {
        "1": "",
        "2": LONG_REASON,
        "3": "held by user",
        "4": "waiting for job 2 to succeed",
        "5": "waiting for a CPU slot",
    }


@pytest.mark.parametrize(
    ("asked", "leased", "shown"),
    [
        (2, [0, 1], "2:0,1"),
        (1, [0], "1:0"),  # GPU 0, not "no GPU"
        (1, [3], "1:3"),
        (4, [], "4"),  # waiting for four
        (0, [], "-"),  # no GPU at all
    ],
)
def test_the_gpus_column_is_unambiguous(asked: int, leased: list[int], shown: str) -> None:
    assert drawing.gpu_text({"gpus": asked, "leases": {"gpus": leased}}) == shown


def devices(n: int = 4) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(n):
        items.append(
            {
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "fake": False,
                "memory_total_mb": 81559,
                "memory_used_mb": 1200,
                "status": "leased" if i else "shared",
                "job_id": 1 if i else None,
                "owner": "alice" if i else None,
                "since": NOW.isoformat(),
                "idle_since": NOW.isoformat(),
                "external_processes": [{"pid": 4242, "uid": 1001, "account": "bob"}],
            }
        )
    items[0]["shares"] = [
        {"job_id": 7, "owner": "carol", "gpu_mem": 5 << 30},
        {"job_id": 8, "owner": "dave", "gpu_mem": 5 << 30},
    ]
    return {"items": items, "ports_leased": {"29500": 1, "29501": 7}}


def test_gpus_at_80_columns_drops_columns_and_never_cuts_a_header() -> None:
    lines = drawn(drawing.gpu_table(devices()), 80, terminal=True)
    assert all(len(line) <= 80 for line in lines) and not any("…" in line for line in lines)
    header = header_words(lines[0])
    assert {"GPU", "STATUS", "JOB", "MEMORY", "OUTSIDE"} <= set(header)
    assert "NAME" not in header  # the model's name goes first
    wide = drawn(drawing.gpu_table(devices()), 80, terminal=False)
    assert len(wide) == 5 and "NVIDIA H100 80GB HBM3" in wide[1]


def test_usage_at_80_columns_drops_columns_and_into_a_pipe_keeps_them() -> None:
    data = report(a_row("alice", "user"), a_row("bob", "user"))
    narrow = drawn(usage_table(data, "30d", "user"), 80, terminal=True)
    assert all(len(line) <= 80 for line in narrow) and not any("…" in x for x in narrow)
    assert narrow[1].split()[:3] == ["USER", "JOBS", "GPU-H"]
    assert "WAIT P50" in narrow[1] and "MEM GIB-H" not in narrow[1]
    piped = drawn(usage_table(data, "30d", "user"), 80, terminal=False)
    assert "MEM GIB-H RES/USED" in piped[1] and "TIMED_OUT" in piped[1]
    assert len(piped) == 2 + 3  # title, header, two users and the total


def test_watch_shows_the_jobs_sharing_a_gpu() -> None:
    lines = drawn(render(QUEUE[:1], devices(2)), 200, terminal=True)
    shared = next(line for line in lines if line.split()[:2] == ["0", "shared"])
    assert "7,8" in shared and "carol,dave" in shared and "29501" in shared


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.9983333333333333, "0.9983"),
        (4.4, "4.4"),
        (3, "3"),
        (1.2345e-05, "1.234e-05"),
        (float("nan"), "nan"),
        ("text", "text"),
        (None, ""),
    ],
)
def test_numbers_are_rounded_for_people(value: object, shown: str) -> None:
    assert number_text(value) == shown


def test_progress_rounds_a_fractional_epoch() -> None:
    assert progress_line({"epoch": 0.9983333333333333, "epochs": 5}) == "epoch 0.9983/5"


def test_show_leaves_out_a_port_no_attempt_had(capsys: pytest.CaptureFixture[str]) -> None:
    detail = job(
        1,
        "failed",
        command=["python", "x.py"],
        launcher="exec",
        priority=0,
        time_limit_s=None,
        retries=0,
        attempt=1,
        exit_code=1,
        exit_signal=None,
        job_dir=None,
        events=[],
        attempts=[{"number": 1, "gpus": [], "port": None, "state": "failed", "reason": "x"}],
    )
    drawing.render_job(detail, b"")
    out = capsys.readouterr().out
    assert "#1 GPUs [] " in out and "None" not in out
