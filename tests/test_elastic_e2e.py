"""An elastic job through a real daemon on 4 fake GPUs (docs/elastic.md): it starts on the
2 a blocker leaves, grows to 4 at a checkpoint once the blocker ends, and shrinks back to 2
when a 2-GPU job is submitted; each attempt's environment says its size."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from ddpq.schemas import JobSubmit
from tests.helpers import Daemon, wait_for, wait_state

# Honours the preemption contract: saves its count on the signal and exits "requeue me";
# each attempt logs its size and resumes from what it saved.
JOB = """
import os, signal, sys, time
state = os.path.join(os.environ["DDPQ_JOB_DIR"], "state")
done = int(open(state).read()) if os.path.exists(state) else 0
def save(*_):
    open(state, "w").write(str(done))
    sys.exit(int(os.environ["DDPQ_REQUEUE_EXIT"]))
signal.signal(getattr(signal, "SIG" + os.environ["DDPQ_PREEMPT_SIGNAL"]), save)
visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
print("attempt", os.environ["DDPQ_ATTEMPT"], "gpus", os.environ["DDPQ_GPUS"],
      "visible", len(visible), "world", os.environ.get("WORLD_SIZE", "-"), "from", done, flush=True)
while True:
    done += 1
    time.sleep(0.05)
"""
SIZE = re.compile(rb"attempt (\d+) gpus (\d+) visible (\d+)")


def sizes(log: bytes) -> list[tuple[int, int]]:
    """Each attempt's number and its DDPQ_GPUS, checked against the GPUs it sees."""
    found = [tuple(map(int, m.groups())) for m in SIZE.finditer(log)]
    assert all(gpus == visible for _, gpus, visible in found), found
    return [(attempt, gpus) for attempt, gpus, _ in found]


def test_an_elastic_job_grows_when_a_blocker_ends_and_shrinks_for_a_new_job(
    make_daemon: Callable[..., Daemon],
) -> None:
    # The default policy (srpt-progress); no resize before a job has run 1 s.
    d = make_daemon("--fake-gpus", "4", "--preempt-min-run", "1s", "--preempt-grace", "10s")
    c = d.client()
    blocker = c.submit(JobSubmit(command=["sleep", "300"], gpus=2))
    wait_state(c, blocker.id, "running")
    # Submitted as a user would: the CLI's range.
    out = d.cli("submit", "--gpus", "2-4", "--", sys.executable, "-c", JOB).stdout
    job_id = int(out)
    wait_for(lambda: sizes(c.log_tail(job_id)) == [(1, 2)], what="the first attempt on 2")
    shown = c.show(job_id)
    assert (shown.gpus, shown.gpus_max, shown.preemptible) == (2, 4, True)
    assert re.search(rf"\b{job_id}\b.*2-4:\d,\d", d.cli("ls").stdout)

    c.cancel(blocker.id)  # 2 GPUs free, nobody waits for them: it grows at a checkpoint
    wait_for(lambda: sizes(c.log_tail(job_id))[-1:] == [(2, 4)], what="the job grown to 4")
    grown = c.show(job_id)
    first = grown.attempts[0]
    assert first.state == "preempted" and first.reason == "growing to 4 GPUs: checkpointed"
    assert any(e.reason == "grown to 4 GPUs" for e in grown.events)

    small = c.submit(JobSubmit(command=["sleep", "300"], gpus=2))  # it shrinks for this one
    wait_state(c, small.id, "running")
    wait_for(lambda: sizes(c.log_tail(job_id))[-1:] == [(3, 2)], what="the job shrunk to 2")
    shrunk = c.show(job_id)
    assert f"shrinking to 2 GPUs for job {small.id}" in shrunk.attempts[1].reason
    assert any(e.reason == "shrunk to 2 GPUs" for e in shrunk.events)
    theirs = c.show(small.id).leases.gpus
    assert len(shrunk.leases.gpus) == 2 and not set(shrunk.leases.gpus) & set(theirs)
    log = c.log_tail(job_id).decode()
    assert "attempt 3 gpus 2 visible 2 world - from " in log
    resumed = int(log.split("attempt 3 gpus 2 visible 2 world - from ")[1].split()[0])
    assert resumed > 0  # it went on from its checkpoint
    for job in (job_id, small.id):
        c.cancel(job)


def test_bad_ranges_are_refused_with_one_line(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "4")
    cases = [
        (["--gpus", "4-2"], "--gpus: the range 4-2 ends below its start"),
        (["--gpus", "0-2"], "--gpus: the range 0-2 starts at 0"),
        (["--gpus", "2-x"], "--gpus: '2-x' is not a number of GPUs nor a range MIN-MAX"),
        (["--gpus", "2-8"], "asked for 8 GPUs but this server has 4"),
        (["--gpus", "1-2", "--gpu-mem", "1G"], "--gpus: a job sharing GPUs by memory"),
    ]
    for flags, said in cases:
        r = d.cli("submit", *flags, "--", "true", check=False)
        assert r.returncode != 0 and said in r.stderr, (flags, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # A range of one size is a fixed size.
    assert d.client().submit(JobSubmit(command=["true"], gpus=2, gpus_max=2)).gpus_max is None
