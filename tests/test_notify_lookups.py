"""A notification URL's lookup at submission never holds the API: a name that does not
answer is taken after a short wait (each delivery checks it again), a caller's lookups and
everyone's are bounded (beyond that the URL is taken unchecked), and only a definite answer
refuses."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient

from ddpq import notify_target
from ddpq.daemon import webhook
from ddpq.server import notify_lookups
from ddpq.server.notify_lookups import IN_ALL, PER_CALLER
from tests.inprocess import client_with_gpus

REAL_GETADDRINFO = socket.getaddrinfo
DEADLINE_S = 60.0  # for a condition that holds at once on a sound daemon
SECRET = "T0-B0-SECRET"
PUBLIC = "198.51.100.7"


class HungResolver:
    """``socket.getaddrinfo`` whose name lookups wait until ``release`` (then answer a
    public address); addresses written out are read as the real one reads them."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.changed = threading.Condition()
        self.waiting = 0

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        with self.changed:
            self.waiting += 1
            self.changed.notify_all()
        try:
            self.released.wait(DEADLINE_S)
        finally:
            with self.changed:
                self.waiting -= 1
                self.changed.notify_all()
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port))]

    def wait_for(self, waiting: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.waiting == waiting, DEADLINE_S), (
                f"{self.waiting} lookups waiting, not {waiting}"
            )


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungResolver]:
    resolver = HungResolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        yield resolver
    finally:
        resolver.released.set()
        resolver.wait_for(0)  # every lookup thread has ended before the next test


def submission(url: str) -> dict[str, Any]:
    return {"command": ["true"], "notify": f"{url.rstrip('/')}/hooks/{SECRET}"}


@pytest.fixture
def long_wait_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """An API whose submissions would wait for a lookup as long as a test needs: a lookup
    in flight stays so until the test releases it, whatever the machine's speed."""
    monkeypatch.setattr(notify_lookups, "SUBMISSION_WAIT_S", 3 * DEADLINE_S)
    yield from client_with_gpus(tmp_path / "home", gpus=1, notify_timeout_s=3 * DEADLINE_S)


class Requests:
    """Requests sent each from a thread of its own, their answers counted as they come."""

    def __init__(self) -> None:
        self.answered = threading.Condition()
        self.answers: list[httpx2.Response] = []
        self.threads: list[threading.Thread] = []

    def send(self, call: Callable[[], httpx2.Response]) -> None:
        def run() -> None:
            answer = call()
            with self.answered:
                self.answers.append(answer)
                self.answered.notify_all()

        self.threads.append(threading.Thread(target=run, daemon=True))
        self.threads[-1].start()

    def wait_for(self, answers: int) -> list[httpx2.Response]:
        with self.answered:
            assert self.answered.wait_for(lambda: len(self.answers) >= answers, DEADLINE_S), (
                f"{len(self.answers)} answers, not {answers}"
            )
            return list(self.answers)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(DEADLINE_S)


def submit_as(c: TestClient, who: str, url: str) -> Callable[[], httpx2.Response]:
    return lambda: c.post("/v1/jobs", json=submission(url), headers={"X-Ddpq-User": who})


@pytest.mark.parametrize(
    ("callers", "held"),
    [(["mallory"], PER_CALLER), ([f"user{i}" for i in range(45)], IN_ALL)],
    ids=["one-caller", "many-callers"],
)
def test_submissions_whose_names_never_answer_leave_the_api_to_everyone_else(
    long_wait_api: TestClient, hung: HungResolver, callers: list[str], held: int
) -> None:
    c = long_wait_api
    slow = Requests()
    for i in range(45):
        slow.send(submit_as(c, callers[i % len(callers)], "http://slow.example/"))
    hung.wait_for(held)  # as many lookups as the bounds let start, each holding its request
    assert len(slow.wait_for(45 - held)) == 45 - held  # the others taken, without waiting
    # Another client is answered while those still wait for their lookups.
    other = Requests()
    other.send(lambda: c.get("/v1/jobs", headers={"X-Ddpq-User": "alice"}))
    assert other.wait_for(1)[0].status_code == 200
    assert hung.waiting == held and len(slow.answers) == 45 - held
    hung.released.set()
    assert [r.status_code for r in slow.wait_for(45)] == [201] * 45
    slow.join()
    assert c.get("/v1/jobs").json()["total"] == 45


def test_a_callers_lookups_count_until_they_end_and_then_free_their_place(
    long_wait_api: TestClient, hung: HungResolver
) -> None:
    lookups = c_lookups(long_wait_api)
    first = Requests()
    for _ in range(PER_CALLER):
        first.send(submit_as(long_wait_api, "bob", "http://a.example/"))
    hung.wait_for(PER_CALLER)
    assert lookups.in_flight("bob") == lookups.in_flight() == PER_CALLER
    hung.released.set()
    assert [r.status_code for r in first.wait_for(PER_CALLER)] == [201] * PER_CALLER
    first.join()
    assert lookups.in_flight() == 0  # ended as answered: the next submissions are checked


def c_lookups(c: TestClient) -> notify_lookups.NotifyLookups:
    app: Any = c.app
    lookups: notify_lookups.NotifyLookups = app.state.notify_lookups
    return lookups


REFUSED_LITERALS = ["http://127.0.0.1:8765/", "http://127.1/", "http://0x7f.0.0.1/"]
REFUSED_LITERALS += ["http://[::ffff:127.0.0.1]/", "http://0.0.0.0/", "http://169.254.169.254/"]
REFUSED_LITERALS += ["http://[fd00:ec2::254]/", "http://localhost/", "http://metadata.goog/"]


def test_addresses_written_out_are_refused_even_while_the_callers_lookups_are_all_busy(
    long_wait_api: TestClient, hung: HungResolver
) -> None:
    busy = Requests()
    for _ in range(PER_CALLER):
        busy.send(submit_as(long_wait_api, "anonymous", "http://x.example/"))
    hung.wait_for(PER_CALLER)
    for url in REFUSED_LITERALS:
        r = long_wait_api.post("/v1/jobs", json=submission(url))
        assert r.status_code == 422 and "notify: refused" in r.json()["detail"], (url, r.text)
        assert SECRET not in r.text
    assert hung.waiting == PER_CALLER  # none of them waited for, or asked, the resolver
    hung.released.set()
    busy.wait_for(PER_CALLER)
    busy.join()


def test_a_name_that_never_answers_is_taken_at_submission_and_refused_at_delivery(
    tmp_path: Path, hung: HungResolver
) -> None:
    for c in client_with_gpus(tmp_path / "home", gpus=1, notify_timeout_s=0.5):
        assert c.post("/v1/jobs", json=submission("http://slow.example/")).status_code == 201
    status, why = webhook.post("http://slow.example/x", b"{}", timeout=0.5, allow_loopback=False)
    assert status is None and "slow.example" in why and "no answer within 0.5 s" in why


def gaierror(code: int, text: str) -> Callable[..., list[tuple[Any, ...]]]:
    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        raise socket.gaierror(code, text)

    return getaddrinfo


@pytest.mark.parametrize(
    ("code", "taken"),
    [
        (socket.EAI_AGAIN, True),  # SERVFAIL, the resolver's own timeout: ask again later
        (socket.EAI_SYSTEM, True),
        (socket.EAI_NONAME, False),  # NXDOMAIN: the name does not exist
        (socket.EAI_FAIL, False),
    ],
)
def test_only_a_definite_answer_refuses_a_name_at_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, taken: bool
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", gaierror(code, "what the resolver said"))
    for c in client_with_gpus(tmp_path / "home", gpus=1):
        r = c.post("/v1/jobs", json=submission("http://hook.example/"))
        assert r.status_code == (201 if taken else 422), r.text
        if not taken:
            assert "cannot resolve hook.example: what the resolver said" in r.json()["detail"]
    with pytest.raises(notify_target.Unanswered if taken else notify_target.Refused):
        notify_target.resolve("hook.example", 80, 5.0)
