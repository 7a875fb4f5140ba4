"""A queued job's predicted start (``worker.forecast``), live: the job ahead of it reports
its steps, and the start the daemon predicts from their rate is the one that happens."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from ddpq.client.draw import start_text
from ddpq.schemas import JobDetail, JobSubmit
from tests.helpers import Daemon, wait_done, wait_for

STEPS = 20
STEP_S = 0.5
# Writes a progress record per step, as a training loop does, and nothing else.
STEPPER = (
    f"for i in $(seq 1 {STEPS}); do sleep {STEP_S}; "
    f'echo "{{\\"step\\": $i, \\"steps\\": {STEPS}}}" >> "$DDPQ_JOB_DIR/metrics.jsonl"; done'
)


@pytest.mark.parametrize("policy", ["las", "srpt-progress"])
def test_the_start_predicted_from_the_job_ahead_s_steps_is_the_actual_one(
    make_daemon: Callable[..., Daemon], policy: str
) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", "1s", "--policy", policy)
    c = d.client()
    ahead = c.submit(JobSubmit(command=["sh", "-c", STEPPER], gpus=1))
    wait_for(lambda: c.show(ahead.id).state == "running", 30, "the first job to run")
    queued = c.submit(JobSubmit(command=["true"], gpus=1))
    # Without a time limit or history, nothing is known until the first job's rate is.
    assert c.show(queued.id).predicted_start is None

    def predicted_midway() -> JobDetail | None:
        first, second = c.show(ahead.id), c.show(queued.id)
        step = (first.progress or {}).get("step", 0)
        return second if step >= STEPS // 2 and second.predicted_start else None

    midway = wait_for(predicted_midway, 30, "a prediction once half the steps are done")
    assert midway.predicted_start is not None
    row = next(r for r in d.cli("ls").stdout.splitlines() if r.split()[:1] == [str(queued.id)])
    assert " in " in row or " now " in row, row  # ls's START for it
    done = wait_done(c, queued.id, timeout=60)
    assert done.state == "succeeded" and done.started_at is not None
    error = abs((done.started_at - midway.predicted_start).total_seconds())
    assert error < 3.0, (midway.predicted_start, done.started_at)


def test_ls_says_when_a_queued_job_starts_or_that_nobody_knows() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    soon = (now + timedelta(seconds=130)).isoformat()
    assert start_text({"state": "queued", "predicted_start": soon}, now) == "in 2m10s"
    assert start_text({"state": "queued", "predicted_start": now.isoformat()}, now) == "now"
    assert start_text({"state": "queued", "predicted_start": None}, now) == "?"
    assert start_text({"state": "running", "predicted_start": soon}, now) == ""
