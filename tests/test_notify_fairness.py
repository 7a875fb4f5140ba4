"""A slow receiver holds nobody's notifications: one attempt has one deadline for all of
it, however its receiver drips, and one user's receivers never take every sender."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpq.core.notify import take_fairly
from ddpq.daemon import webhook
from ddpq.daemon.notifier import SENDERS, Notifier
from ddpq.store import notifications as notification_store
from tests.helpers import wait_for
from tests.worker.rig import Rig, make_rig

TICK_S = 0.25  # a dripping receiver's pace: a byte each tick, for as long as it is read


@dataclass
class LoopbackReceiver:
    """A receiver on loopback that answers each request with ``answer(send)``, run on a
    thread per connection until the test ends; keeps each request's body."""

    answer: Any
    reads_request: bool = True  # False: answers at once (a TLS handshake is no request)
    got: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    listener: socket.socket = field(default_factory=socket.socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def start(self) -> None:
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self._spawn(self._accept)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if self.reads_request:
                self._read_request(conn)
            # OSError: the sender gave up and closed, as it does at its deadline.
            with contextlib.suppress(OSError):
                self.answer(conn.sendall, self.stop)

    def _read_request(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        sizes = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
        while len(body) < int(sizes[0].split(b":")[1]):
            body += conn.recv(65536)
        self.got.append(json.loads(body))

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close would not)
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=10)


def drip(prefix: bytes, unit: bytes) -> Any:
    """An answer that sends ``prefix`` then ``unit`` every tick, forever."""

    def answer(send: Any, stop: threading.Event) -> None:
        send(prefix)
        while not stop.wait(TICK_S):
            send(unit)

    return answer


def answers_at_once(send: Any, stop: threading.Event) -> None:
    send(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")


DRIPS = {
    "the status line a byte at a time": drip(b"H", b"T"),
    "a status line that never ends": drip(b"HTTP/1.1 200 OK", b" "),
    "an interim answer's headers, forever": drip(b"HTTP/1.1 100 Continue\r\nX: ", b"a"),
    "interim answers, forever": drip(b"", b"HTTP/1.1 102 Processing\r\n\r\n"),
    "nothing at all": drip(b"", b""),
}


@pytest.fixture
def receivers() -> Iterator[list[LoopbackReceiver]]:
    made: list[LoopbackReceiver] = []
    yield made
    for r in made:
        r.close()


def receiver(
    made: list[LoopbackReceiver], answer: Any, reads_request: bool = True
) -> LoopbackReceiver:
    r = LoopbackReceiver(answer, reads_request)
    r.start()
    made.append(r)
    return r


# A TLS record's header that announces 16 KiB, then its bytes one at a time: the handshake
# waits for the whole record.
TLS_DRIP = drip(b"\x16\x03\x03\x40\x00", b"\x00")


@pytest.mark.parametrize(
    ("answer", "scheme"),
    [*((answer, "http") for answer in DRIPS.values()), (TLS_DRIP, "https")],
    ids=[*DRIPS.keys(), "a TLS handshake a byte at a time"],
)
def test_a_dripping_receiver_is_given_up_at_the_attempts_deadline(
    receivers: list[LoopbackReceiver], answer: Any, scheme: str
) -> None:
    url = receiver(receivers, answer, scheme == "http").url.replace("http", scheme, 1)
    outcome: list[tuple[int | None, str]] = []
    started = time.monotonic()
    sender = threading.Thread(
        target=lambda: outcome.append(webhook.post(url, b"{}", timeout=1.0, allow_loopback=True)),
        daemon=True,
    )
    sender.start()
    # Before: each read had its own timeout, and a byte every tick reset it, forever.
    sender.join(timeout=30)
    assert outcome == [(None, "no answer in time")]
    # The bound is the attempt's (1 s); the rest is room for a loaded machine.
    assert time.monotonic() - started < 1.0 + 10


def test_an_answer_is_read_however_it_is_cut(receivers: list[LoopbackReceiver]) -> None:
    def slowly(send: Any, stop: threading.Event) -> None:
        for byte in b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n":
            send(bytes([byte]))

    assert webhook.post(
        receiver(receivers, slowly).url, b"{}", timeout=10, allow_loopback=True
    ) == (201, "")

    def not_http(send: Any, stop: threading.Event) -> None:
        send(b"SSH-2.0-OpenSSH_9.6\r\n")

    status, why = webhook.post(
        receiver(receivers, not_http).url, b"{}", timeout=10, allow_loopback=True
    )
    assert status is None and why.startswith("bad answer")


# ---- sharing the senders ---------------------------------------------------------------------


def test_owners_take_turns_for_the_senders() -> None:
    due = [("mallory", 1), ("mallory", 2), ("mallory", 3), ("alice", 4), ("bob", 5)]
    owner = lambda item: item[0]  # noqa: E731
    assert take_fairly(due, owner, {}, free=4) == [("mallory", 1), ("alice", 4), ("bob", 5)]
    assert take_fairly(due, owner, {"mallory": 1}, free=4) == [("alice", 4), ("bob", 5)]
    assert take_fairly(due, owner, {}, free=1) == [("mallory", 1)]
    # With two each allowed: everyone's first before anyone's second.
    assert take_fairly(due, owner, {}, free=4, per_owner=2) == [
        ("mallory", 1),
        ("alice", 4),
        ("bob", 5),
        ("mallory", 2),
    ]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(
        tmp_path / "home",
        notify_allow_loopback=True,
        notify_timeout_s=3.0,
        notify_retry_s=(0.1,),
    )
    yield r
    r.close()


def attempts(rig: Rig, job_id: int) -> list[notification_store.Attempt]:
    with rig.api.read() as s:
        return notification_store.attempts_of(s, [job_id]).get(job_id, [])


def test_one_users_dripping_receivers_hold_no_one_elses_notification(
    rig: Rig, receivers: list[LoopbackReceiver]
) -> None:
    # Mallory's jobs end first, more of them than there are senders, each to a receiver
    # that drips forever; then Alice's, to a receiver that answers at once.
    dripping = [
        receiver(receivers, DRIPS["a status line that never ends"]) for _ in range(SENDERS + 1)
    ]
    hers = [rig.submit(owner="mallory", notify_url=r.url) for r in dripping]
    prompt = receiver(receivers, answers_at_once)
    alices = rig.submit(owner="alice", notify_url=prompt.url)
    for job in [*hers, alices]:
        rig.cancel(job)  # a queued job cancelled: ended at once, its message owed
    notifier = Notifier(rig.settings, clock=rig.clock)
    try:
        assert notifier.send_due() == 2  # one of Mallory's, and Alice's
        wait_for(lambda: attempts(rig, alices), what="Alice's notification")
        assert [a.status for a in attempts(rig, alices)] == [204] and len(prompt.got) == 1
        # Mallory's are sent one at a time, each given up at the attempt's deadline.
        reached = wait_for(
            lambda: [a for j in hers for a in attempts(rig, j)],
            timeout=30,
            what="Mallory's first attempt to end",
        )
        assert [a.error for a in reached] == ["no answer in time"]
        assert sum(len(r.got) for r in dripping) == 1  # no other was started meanwhile
    finally:
        notifier.stop()
