"""Notifications of a job's end: the URL rules, the message, the sender, the notifier."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ddpq.core.notify import (
    Ended,
    MemberEnded,
    SweepEnded,
    check_url,
    message,
    next_attempt_at,
    sweep_message,
)
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.daemon import webhook
from ddpq.daemon.notifier import Notifier
from ddpq.notify_target import refused_address
from ddpq.schemas import JobSubmit
from ddpq.store import notifications as notification_store
from ddpq.store import sweeps as sweep_store
from tests.helpers import Daemon, wait_done, wait_for
from tests.stub_api import serve_in_thread
from tests.worker.rig import Rig, make_rig

# ---- the URL a user gives ------------------------------------------------------------------

BAD_URLS = [
    "ftp://example.org/x",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "http://",
    "https:///path",
    "http://user:secret@example.org/",
    "http://example.org/a b",
    "http://example.org/\r\nX-Evil: 1",
    "http://example.org:99999/",
    "http://example.org:0/",
    "http://[::1/",
    "http://example.org/" + "x" * 3000,
    "example.org/hook",
]


@pytest.mark.parametrize("url", BAD_URLS, ids=lambda u: ascii(u)[:30])
def test_a_url_that_is_not_a_plain_http_address_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        check_url(url)
    with pytest.raises(ValueError):
        JobSubmit(command=["true"], notify=url)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com/services/T000/B000/XXXX",
        "http://mattermost.lab.internal:8065/hooks/abc?x=1",
        "http://10.0.0.5/hook",
        "http://[2001:db8::1]:8080/h",
    ],
)
def test_webhook_urls_are_taken(url: str) -> None:
    assert check_url(url) == url


# ---- what is sent, and when ----------------------------------------------------------------


def test_the_message_has_the_facts_and_a_text_line_for_chat() -> None:
    progress = {"epoch": 5, "test_acc": 0.91, "phase": "done", "flag": True, "bad": float("nan")}
    sent = message(Ended(7, "exp1", "alice", JobState.SUCCEEDED, 0, "exit code 0", progress))
    assert sent["state"] == "succeeded" and sent["job_id"] == 7 and sent["exit_code"] == 0
    assert sent["metrics"] == {"epoch": 5, "test_acc": 0.91, "phase": "done"}
    assert sent["text"].startswith("ddpq: job 7 (exp1) of alice succeeded: exit code 0")
    assert "test_acc 0.91" in sent["text"]
    json.dumps(sent, allow_nan=False)  # valid JSON for any receiver


S, F, C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED


def member(
    index: int, state: JobState, progress: dict[str, Any] | None, **params: str
) -> MemberEnded:
    return MemberEnded(100 + index, index, params, state, progress)


def test_a_sweeps_message_counts_its_members_and_names_the_best() -> None:
    members = [
        member(0, S, {"epoch": 5, "test_acc": 0.81}, lr="0.05"),
        member(1, S, {"epoch": 5, "test_acc": 0.93}, lr="0.1"),
        member(2, S, {"epoch": 5, "test_acc": 0.93}, lr="0.2"),  # as good, but later
        member(3, F, {"epoch": 2, "test_acc": 0.99}, lr="0.3"),  # not a result: it failed
        member(4, C, None, lr="0.4"),
    ]
    sent = sweep_message(SweepEnded(4, "lr-scan", "alice", 5, members))
    assert sent["sweep_id"] == 4 and sent["size"] == 5
    assert sent["counts"] == {"succeeded": 3, "failed": 1, "cancelled": 1}
    assert sent["best"] == {
        "metric": "test_acc",
        "value": 0.93,
        "job_id": 101,
        "index": 1,
        "state": "succeeded",
        "params": {"lr": "0.1"},
        "metrics": {"epoch": 5, "test_acc": 0.93},
    }
    assert sent["text"] == (
        "ddpq: sweep s4 (lr-scan) of alice ended: 3 succeeded, 1 failed, 1 cancelled; "
        "best test_acc 0.93: lr=0.1 (job 101)"
    )
    json.dumps(sent, allow_nan=False)


def test_with_no_run_succeeded_the_best_is_ranked_among_all() -> None:
    timed_out = JobState.TIMED_OUT
    members = [member(0, timed_out, {"test_acc": 0.6}), member(1, F, {"test_acc": 0.7})]
    members.append(member(2, S, {"epoch": 1}))  # succeeded, but wrote no accuracy
    sent = sweep_message(SweepEnded(5, "a", "bob", 3, members))
    assert (sent["best"]["index"], sent["best"]["state"]) == (1, "failed")


def test_a_loss_ranks_lowest_first_and_an_array_names_the_index() -> None:
    members = [member(0, S, {"test_loss": 0.4}), member(1, S, {"test_loss": 0.2})]
    sent = sweep_message(SweepEnded(2, "a", "bob", 2, members))
    assert sent["best"]["metric"] == "test_loss" and sent["best"]["index"] == 1
    assert sent["text"].endswith("best test_loss 0.2: index 1 (job 101)")


# What members write is theirs: words, booleans, nulls, infinities (core.untrusted makes
# those null, but the message must not trust that) where a number is expected.
NOT_NUMBERS: list[Any] = ["0.99", True, None, float("inf"), float("nan"), [1], {"a": 1}, 10**400]


@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
def test_a_metric_that_is_not_a_finite_number_ranks_nobody(bad: Any) -> None:
    members = [member(0, S, {"test_acc": bad}), member(1, F, {"test_acc": 0.5})]
    assert sweep_message(SweepEnded(1, "a", "bob", 2, members))["best"]["index"] == 1
    alone = sweep_message(SweepEnded(1, "a", "bob", 1, [member(0, S, {"test_acc": bad})]))
    assert "best" not in alone and "best" not in alone["text"]


def test_a_sweep_without_an_obvious_metric_names_no_best() -> None:
    members = [member(i, S, {"step": i, "loss_x": 0.1}) for i in range(3)]
    sent = sweep_message(SweepEnded(9, "arr", "bob", 3, members))
    assert "best" not in sent
    assert sent["text"] == "ddpq: sweep s9 (arr) of bob ended: 3 succeeded"


def test_the_text_line_shows_parameters_short_and_on_one_line() -> None:
    params = {f"p{i}": "x" * 500 + "\n<!channel>\x1b[2J" for i in range(6)}
    sent = sweep_message(SweepEnded(1, "a", "bob", 1, [member(0, S, {"test_acc": 1}, **params)]))
    assert sent["best"]["params"] == params  # the JSON carries them whole
    line = sent["text"]
    assert len(line) < 400 and "\n" not in line and "\x1b" not in line
    assert line.count("=") == 4 and line.endswith(", … (job 100)")


def test_attempts_are_bounded_with_a_growing_delay() -> None:
    delays = (1.0, 5.0, 30.0)
    assert next_attempt_at(0, None, delays) == float("-inf")
    assert [next_attempt_at(n, 100.0, delays) for n in (1, 2, 3)] == [101.0, 105.0, 130.0]
    assert next_attempt_at(4, 100.0, delays) is None  # given up after len(delays) + 1


# ---- a receiver the tests run --------------------------------------------------------------


@dataclass
class Receiver:
    """A local webhook receiver that answers ``status`` (or hangs) and keeps what it got."""

    status: int = 200
    hang: threading.Event | None = None
    got: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            r.got.append(json.loads(body))
            if r.hang is not None:
                r.hang.wait(30)
            self.send_response(r.status)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    r.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    r.server.daemon_threads = True
    serve_in_thread(r.server)
    yield r
    if r.hang is not None:
        r.hang.set()
    r.server.shutdown()
    r.server.server_close()


def test_the_sender_reports_what_the_receiver_said(receiver: Receiver) -> None:
    assert webhook.post(receiver.url, b"{}", timeout=5, allow_loopback=True) == (200, "")
    receiver.status = 500
    assert webhook.post(receiver.url, b"{}", timeout=5, allow_loopback=True)[0] == 500


def test_the_sender_refuses_this_host_and_metadata_addresses(receiver: Receiver) -> None:
    status, why = webhook.post(receiver.url, b"{}", timeout=5, allow_loopback=False)
    assert status is None and "loopback" in why and receiver.got == []
    # Never, whatever the admin allows: cloud metadata, unspecified, multicast, link-local.
    for address in ("169.254.169.254", "0.0.0.0", "::", "224.0.0.1", "fe80::1%eth0"):
        assert refused_address(address, allow_loopback=True) is not None, address
    for address in ("127.0.0.1", "127.8.9.1", "::1", "::ffff:127.0.0.1"):
        assert refused_address(address, allow_loopback=False) is not None, address
        assert refused_address(address, allow_loopback=True) is None, address
    for address in ("10.1.2.3", "192.168.0.9", "8.8.8.8", "2001:db8::1"):
        assert refused_address(address, allow_loopback=False) is None, address


def test_the_sender_gives_up_on_a_receiver_that_hangs_or_is_not_there(
    receiver: Receiver,
) -> None:
    receiver.hang = threading.Event()
    status, why = webhook.post(receiver.url, b"{}", timeout=0.5, allow_loopback=True)
    assert status is None and why == "no answer in time"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/"
    assert webhook.post(closed, b"{}", timeout=2, allow_loopback=True) == (
        None,
        "connection refused",
    )


# ---- the notifier, in process ---------------------------------------------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(
        tmp_path / "home",
        notify_allow_loopback=True,
        # Room for a loaded machine's local receiver to answer (a hang waits this long).
        notify_timeout_s=5.0,
        notify_retry_s=(0.1, 0.1),
    )
    yield r
    r.close()


def notifier_of(rig: Rig) -> Notifier:
    return Notifier(rig.settings, clock=rig.clock)


def attempts(rig: Rig, job_id: int) -> list[notification_store.Attempt]:
    with rig.api.read() as s:
        return notification_store.attempts_of(s, [job_id]).get(job_id, [])


def settle(notifier: Notifier, rig: Rig, job_id: int, count: int, step: float = 0.2) -> None:
    """Run the notifier (moving the clock past each back-off) until ``count`` attempts."""

    def done() -> bool:
        rig.clock.advance(step)
        notifier.send_due()
        return len(attempts(rig, job_id)) >= count

    wait_for(done, timeout=20, what=f"{count} notification attempts")


def test_an_ended_job_is_notified_once(rig: Rig, receiver: Receiver) -> None:
    job = rig.submit(notify_url=receiver.url)
    quiet = rig.submit()  # no URL: nothing is sent for it
    rig.step()
    rig.host.finish(job, 0)
    rig.host.finish(quiet, 0)
    rig.step()
    notifier = notifier_of(rig)
    try:
        settle(notifier, rig, job, 1)
        for _ in range(5):  # delivered: never sent again
            rig.clock.advance(10)
            notifier.send_due()
    finally:
        notifier.stop()
    assert [a.status for a in attempts(rig, job)] == [200] and attempts(rig, quiet) == []
    assert len(receiver.got) == 1 and receiver.got[0]["state"] == "succeeded"


def test_a_receiver_that_fails_is_retried_then_given_up(rig: Rig, receiver: Receiver) -> None:
    receiver.status = 500
    job = rig.submit(notify_url=receiver.url)
    rig.step()
    rig.host.finish(job, 1)
    rig.step()
    notifier = notifier_of(rig)
    try:
        settle(notifier, rig, job, 3)
        rig.clock.advance(100)
        assert notifier.send_due() == 0  # 1 + len(notify_retry_s) attempts, then no more
    finally:
        notifier.stop()
    assert [(a.attempt, a.error) for a in attempts(rig, job)] == [
        (1, "HTTP 500"),
        (2, "HTTP 500"),
        (3, "HTTP 500"),
    ]


def test_a_receiver_that_hangs_delays_no_scheduling(rig: Rig, receiver: Receiver) -> None:
    receiver.hang = threading.Event()
    job = rig.submit(notify_url=receiver.url)
    rig.step()
    rig.host.finish(job, 0)
    rig.step()
    notifier = notifier_of(rig)
    try:
        assert notifier.send_due() == 1  # in flight, waiting on the receiver
        wait_for(lambda: receiver.got, what="the receiver to be reached")
        later = rig.submit()
        rig.step()  # the worker goes on meanwhile
        assert rig.job(later).state is JobState.RUNNING
        settle(notifier, rig, job, 1, step=0)
    finally:
        notifier.stop()
    assert attempts(rig, job)[0].error == "no answer in time"


# ---- a sweep's one message, in process -------------------------------------------------------


def new_sweep(rig: Rig, n: int, url: str | None) -> tuple[int, list[int]]:
    """A sweep of ``n`` members over ``lr`` through the store, as the API makes one."""
    job = JobSpec(name="scan", owner="alice", command=["true"], cwd="/", gpus=1, notify_url=url)
    members = [sweep_store.NewMember(i, f"scan-{i}", ["true"], {"lr": f"0.{i}"}) for i in range(n)]
    spec = sweep_store.NewSweep(job, {}, {"lr": [f"0.{i}" for i in range(n)]}, None, None, members)
    with rig.api.write() as s:
        sweep_id = sweep_store.create_sweep(s, spec, rig.clock()).id
    with rig.api.read() as s:
        return sweep_id, [m.id for m in sweep_store.members(s, sweep_id)]


def sweep_attempts(rig: Rig, sweep_id: int) -> list[notification_store.Attempt]:
    with rig.api.read() as s:
        return notification_store.sweep_attempts_of(s, [sweep_id]).get(sweep_id, [])


def settle_sweep(notifier: Notifier, rig: Rig, sweep_id: int, count: int) -> None:
    def done() -> bool:
        rig.clock.advance(0.2)
        notifier.send_due()
        return len(sweep_attempts(rig, sweep_id)) >= count

    wait_for(done, timeout=20, what=f"{count} attempts of sweep {sweep_id}'s message")


def write_progress(rig: Rig, job_id: int, record: dict[str, Any]) -> None:
    folder = rig.job(job_id).job_dir
    assert folder is not None
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def test_a_sweep_sends_one_message_once_every_member_has_ended(
    rig: Rig, receiver: Receiver
) -> None:
    sweep_id, ids = new_sweep(rig, 3, receiver.url)
    notifier = notifier_of(rig)
    try:
        rig.step()  # two GPUs: two members run, the third waits
        for i, job_id in enumerate(ids[:2]):
            write_progress(rig, job_id, {"epoch": 1, "test_acc": [0.7, 0.9][i]})
        rig.clock.advance(5)
        rig.step()
        rig.host.finish(ids[0], 0)
        rig.host.finish(ids[1], 0)
        rig.step()  # two members ended, the third started: the sweep has not ended
        assert [rig.job(i).state for i in ids] == [S, S, JobState.RUNNING]
        for _ in range(5):
            rig.clock.advance(10)
            assert notifier.send_due() == 0
        rig.host.finish(ids[2], 1)
        rig.step()
        settle_sweep(notifier, rig, sweep_id, 1)
        for _ in range(5):  # delivered: never again, and never one of a member's own
            rig.clock.advance(10)
            notifier.send_due()
    finally:
        notifier.stop()
    assert [a.status for a in sweep_attempts(rig, sweep_id)] == [200]
    assert all(attempts(rig, i) == [] for i in ids)
    assert len(receiver.got) == 1
    got = receiver.got[0]
    assert got["sweep_id"] == sweep_id and got["counts"] == {"succeeded": 2, "failed": 1}
    assert got["best"]["job_id"] == ids[1] and got["best"]["params"] == {"lr": "0.1"}
    assert got["text"].startswith(f"ddpq: sweep s{sweep_id} (scan) of alice ended: 2 succeeded")


def test_a_sweep_cancelled_as_a_whole_sends_one_message(rig: Rig, receiver: Receiver) -> None:
    sweep_id, ids = new_sweep(rig, 3, receiver.url)
    quiet, _ = new_sweep(rig, 2, None)  # no URL: nothing is sent for it
    notifier = notifier_of(rig)
    try:
        rig.step()  # two members run
        with rig.api.write() as s:
            sweep_store.cancel_sweep(s, sweep_id, rig.clock())
            sweep_store.cancel_sweep(s, quiet, rig.clock())
        # The waiting member ended at once; the running ones are still being stopped.
        assert notifier.send_due() == 0
        rig.step(3)  # stopped (SIGTERM ends them on the fake host) and recorded
        assert {rig.job(i).state for i in ids} == {C}
        settle_sweep(notifier, rig, sweep_id, 1)
        rig.clock.advance(100)
        assert notifier.send_due() == 0
    finally:
        notifier.stop()
    assert len(receiver.got) == 1 and receiver.got[0]["counts"] == {"cancelled": 3}
    assert sweep_attempts(rig, quiet) == []


def test_a_sweeps_message_is_retried_each_attempt_recorded_then_given_up(
    rig: Rig, receiver: Receiver
) -> None:
    receiver.status = 500
    sweep_id, ids = new_sweep(rig, 2, receiver.url)
    rig.step()
    for job_id in ids:
        rig.host.finish(job_id, 0)
    rig.step()
    notifier = notifier_of(rig)
    try:
        settle_sweep(notifier, rig, sweep_id, 3)
        rig.clock.advance(100)
        assert notifier.send_due() == 0  # 1 + len(notify_retry_s) attempts, then no more
    finally:
        notifier.stop()
    assert [(a.attempt, a.status, a.error) for a in sweep_attempts(rig, sweep_id)] == [
        (1, 500, "HTTP 500"),
        (2, 500, "HTTP 500"),
        (3, 500, "HTTP 500"),
    ]
    assert len(receiver.got) == 3 and {g["sweep_id"] for g in receiver.got} == {sweep_id}


# ---- end to end ------------------------------------------------------------------------------


def test_a_daemon_posts_a_jobs_end_to_its_default_url_and_shows_the_attempt(
    make_daemon: Callable[..., Daemon], receiver: Receiver
) -> None:
    d = make_daemon("--fake-gpus", "1", "--notify-url", receiver.url, "--notify-allow-loopback")
    c = d.client()
    job = c.submit(JobSubmit(command=["sh", "-c", "exit 3"]))
    assert wait_done(c, job.id).state == "failed"
    wait_for(lambda: c.show(job.id).notifications, what="the notification attempt")
    shown = c.show(job.id)
    assert shown.notify and [n.status for n in shown.notifications] == [200]
    assert receiver.got[0]["exit_code"] == 3 and receiver.got[0]["job_id"] == job.id
    assert "delivered (HTTP 200)" in d.cli("show", str(job.id)).stdout
    # The URL may hold a webhook's secret: not in what the API serves, nor in the log.
    assert receiver.url not in shown.model_dump_json()
    assert receiver.url not in (d.home / "daemon.log").read_text()


def test_a_daemon_posts_a_sweeps_end_once_to_its_default_url_and_shows_the_attempt(
    make_daemon: Callable[..., Daemon], receiver: Receiver
) -> None:
    d = make_daemon("--fake-gpus", "2", "--notify-url", receiver.url, "--notify-allow-loopback")
    c = d.client()
    sweep = c.json.submit_sweep({"template": {"command": ["sh", "-c", "exit 0"]}, "array": "0-2"})
    detail = wait_for(
        lambda: s if (s := c.json.sweep(sweep["id"]))["notifications"] else None,
        what="the sweep's notification attempt",
    )
    assert detail["done"] and detail["notify"]
    assert [n["status"] for n in detail["notifications"]] == [200]
    members = [c.show(m["id"]) for m in detail["members"]]
    assert all(not m.notify and m.notifications == [] for m in members)
    # A plain job after it still gets its own message: the receiver's second, and last.
    job = c.submit(JobSubmit(command=["true"]))
    wait_for(lambda: c.show(job.id).notifications, what="the job's notification attempt")
    assert [g.get("sweep_id", g.get("job_id")) for g in receiver.got] == [sweep["id"], job.id]
    assert receiver.got[0]["counts"] == {"succeeded": 3} and "best" not in receiver.got[0]
    # The URL may hold a webhook's secret: not in what the API serves, nor in the log.
    assert receiver.url not in json.dumps(c.json.sweep(sweep["id"]))
    assert receiver.url not in (d.home / "daemon.log").read_text()
    shown = d.cli("show", f"s{sweep['id']}").stdout
    assert "notify" in shown and "#1" in shown and "delivered (HTTP 200)" in shown
