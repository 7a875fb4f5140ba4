"""What a hostile or careless job writes into its folder never stops ddpq for others.

Each case is a job that leaves one kind of junk where ddpq reads (its progress file,
its exit record); the job must still end, free its GPU for the next job, and the
queue must still be served to everyone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ddpq.core.untrusted import clean_record, clean_text, nesting_depth, parse_progress
from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_done

DEEP = '{"a":' + "[" * 5000 + "]" * 5000 + "}"
# Lines a job may write into metrics.jsonl; each one broke or could break a reader.
HOSTILE_PROGRESS = {
    "deeply nested": DEEP,
    "deep object": '{"a":' * 3000 + "1" + "}" * 3000,
    "lone surrogate": '{"epoch": 1, "note": "\\ud800"}',
    "surrogate key": '{"\\udfff": 1}',
    "NaN": '{"epoch": NaN, "test_acc": Infinity}',
    "huge integer": '{"step": ' + "9" * 400 + "}",
    "a megabyte": '{"x": "' + "y" * (1 << 20) + '"}',
    "not an object": "[1, 2, 3]",
    "binary": "\x00\xff\xfe garbage \x1b[2J",
    "nested values": '{"epoch": 2, "extra": {"a": [1, 2]}}',
}


@pytest.mark.parametrize("line", HOSTILE_PROGRESS.values(), ids=HOSTILE_PROGRESS.keys())
def test_parse_progress_never_raises_and_returns_servable_records(line: str) -> None:
    record = parse_progress(line)
    if record is not None:
        # Whatever is kept can be stored and served back as strict JSON in UTF-8.
        json.dumps(record, allow_nan=False).encode("utf-8")
        assert all(not isinstance(v, dict | list) for v in record.values())


def test_clean_helpers() -> None:
    assert clean_text("ok\ud800") == "ok\ufffd"
    assert clean_text("x" * 1000, 10) == "x" * 10
    assert nesting_depth('{"a": "[[[[" , "b": [1, {"c": 2}]}') == 3
    assert nesting_depth('"\\"[[["') == 0
    record = clean_record({"epoch": 3, "nan": math.nan, "big": 2**80, "s": "\udc80"})
    assert record == {"epoch": 3, "nan": None, "big": float(2**80), "s": "\ufffd"}
    assert clean_record({f"k{i}": i for i in range(1000)}) is not None
    assert len(clean_record({f"k{i}": i for i in range(1000)}) or {}) == 64


@pytest.fixture(scope="module")
def one_gpu(module_daemons: Callable[..., Daemon]) -> Daemon:
    """The module's daemon, for tests that look only at their own jobs (each waits for its
    own to end)."""
    return module_daemons("--fake-gpus", "1", "--grace", "1s")


def test_hostile_progress_lines_never_hold_the_queue(one_gpu: Daemon, tmp_path: Path) -> None:
    """Every hostile line, one job each, on the only GPU: each must end and hand it on."""
    c = one_gpu.client()
    jobs = []
    for i, line in enumerate(HOSTILE_PROGRESS.values()):
        (tmp_path / f"line{i}").write_bytes(line.encode("latin-1", "replace") + b"\n")
        script = f'cat {tmp_path}/line{i} >> "$DDPQ_JOB_DIR/metrics.jsonl"; sleep 1.2'
        jobs.append(c.submit(JobSubmit(command=["sh", "-c", script], gpus=1)))
    after = c.submit(JobSubmit(command=["true"], gpus=1))
    for job in [*jobs, after]:
        done = wait_done(c, job.id, timeout=60)
        assert done.state == "succeeded", (job.id, done.reason)
    # The listing works for everyone, strictly as JSON, and the page's data too.
    r = httpx.get(one_gpu.url + "/v1/jobs", params={"state": ["succeeded"], "limit": 100})
    assert r.status_code == 200
    listed = {item["id"] for item in r.json()["items"]}  # the module's other jobs too
    assert {job.id for job in [*jobs, after]} <= listed
    assert one_gpu.cli("ls", "--all").returncode == 0


def test_progress_is_cleaned_before_it_is_stored(one_gpu: Daemon) -> None:
    c = one_gpu.client()
    line = '{"epoch": 2, "epochs": 5, "note": "\\ud800", "acc": NaN, "deep": [[1]]}'
    script = 'printf "%s\\n" "$LINE" >> "$DDPQ_JOB_DIR/metrics.jsonl"; sleep 1.5'
    job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=1, env={"LINE": line}))
    done = wait_done(c, job.id)
    assert done.state == "succeeded"
    assert done.progress == {"epoch": 2, "epochs": 5, "note": "\ufffd", "acc": None}


HOSTILE_RECORDS = {
    "deeply nested": DEEP,
    "surrogate error": '{"exit_code": null, "signal": null, "started_at": 1, "ended_at": 2, '
    '"error": "\\ud800", "attempt": "1"}',
    "infinite time": '{"exit_code": 0, "signal": null, "started_at": 1, "ended_at": 1e999, '
    '"attempt": "1"}',
    "huge exit code": '{"exit_code": ' + "9" * 100 + ', "signal": null, "started_at": 1, '
    '"ended_at": 2, "attempt": "1"}',
}


@pytest.mark.parametrize("record", HOSTILE_RECORDS.values(), ids=HOSTILE_RECORDS.keys())
def test_a_forged_exit_record_ends_only_that_job(one_gpu: Daemon, record: str) -> None:
    """The job writes a hostile exit.json and kills its shim: it ends (lost or failed),
    its GPU goes to the next job, and the listing still works."""
    c = one_gpu.client()
    script = 'printf "%s" "$REC" > "$DDPQ_JOB_DIR/exit.json"; kill -9 $PPID; sleep 5'
    job = c.submit(JobSubmit(command=["sh", "-c", script], gpus=1, env={"REC": record}))
    nxt = c.submit(JobSubmit(command=["true"], gpus=1))
    done = wait_done(c, job.id)
    assert done.state == "failed"
    assert wait_done(c, nxt.id).state == "succeeded"
    assert httpx.get(one_gpu.url + "/v1/jobs").status_code == 200
