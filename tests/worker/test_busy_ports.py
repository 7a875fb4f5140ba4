"""A rendezvous port another program holds is never leased to a job (issue 21, item 7).

The real loop and store with the fake executor and a moved clock, and real sockets: this
test's own listeners and bound sockets hold the ports, the worker's real test-bind finds
them busy, and the real look at /proc names this process as their holder. Whatever holds
them (listening, bound only, IPv4 or IPv6; all the range, part of it, or taken between the
plan and the check), no job is launched on a busy port: it gets a free one, or waits with a
reason that names the port and who holds it; once a port is free again it starts there.
"""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from ddpq.core.states import JobState
from ddpq.portholders import Holder, holders
from ddpq.procfs import process_name
from ddpq.worker.ports import (
    PORT_COOLDOWN_S,
    RECHECK_PORTS,
    RECHECK_S,
    PortGate,
    port_is_free,
)
from tests.helpers import free_block
from tests.worker.rig import Rig, make_rig

Q, R = JobState.QUEUED, JobState.RUNNING
# How a reason names this process, the holder of every socket the tests bind.
ME = (
    f"uid {os.getuid()} ({pwd.getpwuid(os.getuid()).pw_name}) pid {os.getpid()} "
    f"{process_name(os.getpid())}"
)


def listener(port: int, family: int = socket.AF_INET) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    s.listen()
    return s


def bound_only(port: int) -> socket.socket:
    """Bound and not listening: in no /proc/net/tcp line, and still EADDRINUSE to a bind."""
    s = socket.socket()
    s.bind(("0.0.0.0", port))
    return s


def named(kind: str) -> str:
    """Who a reason says holds a port held this way: this process, except a bound-only
    socket where the kernel cannot tell it (netlink does from Linux 6.9 on)."""
    if kind != "bound-only":
        return ME
    with bound_only(0) as probe:
        port = probe.getsockname()[1]
        return ME if holders([port]) else "a process ddpq cannot see"


HOLDS: dict[str, Callable[[int], socket.socket]] = {
    "listening": listener,
    "listening-v6": lambda port: listener(port, socket.AF_INET6),
    "bound-only": bound_only,
}


@pytest.fixture
def holds() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def rig_on(tmp_path: Path, lo: int, size: int) -> Rig:
    rig = make_rig(tmp_path / "home", port_range=(lo, lo + size - 1), max_user_ports=size)
    rig.worker.scheduler.ports.port_free = port_is_free  # the real test-bind
    return rig


def test_a_job_waits_while_every_port_is_held_and_says_by_whom(
    tmp_path: Path, holds: ExitStack
) -> None:
    lo = free_block(3)
    socks = [holds.enter_context(make(lo + i)) for i, make in enumerate(HOLDS.values())]
    rig = rig_on(tmp_path, lo, 3)
    try:
        job = rig.submit(gpus=1)
        rig.step(2)
        view = rig.job(job)
        assert view.state is Q and rig.host.attempts == {}  # never launched
        assert view.reason.startswith("no free rendezvous port: ")
        for port in range(lo, lo + 2):
            assert f"{port} held by {ME}" in view.reason
        bound = named("bound-only")
        assert f"{lo + 2} held by {bound}" in view.reason
        socks[1].close()  # the IPv6 listener goes: that port is free again
        rig.clock.advance(PORT_COOLDOWN_S + 1)
        rig.step()
        view = rig.job(job)
        assert view.state is R and view.port == lo + 1
        assert rig.host.attempt_of(job).launch.port == lo + 1
    finally:
        rig.close()


@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_busy_port_is_skipped_for_a_free_one(tmp_path: Path, holds: ExitStack, kind: str) -> None:
    lo = free_block(3)
    holds.enter_context(HOLDS[kind](lo))  # the first port the rotation hands out
    holds.enter_context(HOLDS[kind](lo + 1))
    rig = rig_on(tmp_path, lo, 3)
    try:
        first, second = rig.submit(gpus=1), rig.submit(gpus=1)
        rig.step()
        assert rig.job(first).state is R and rig.job(first).port == lo + 2
        waiting = rig.job(second)
        assert waiting.state is Q and rig.host.running() == [first]
        who = named(kind)
        assert all(f"{p} held by {who}" in waiting.reason for p in (lo, lo + 1))
    finally:
        rig.close()


def test_a_port_taken_between_the_plan_and_the_check_is_not_launched_with(
    tmp_path: Path, holds: ExitStack
) -> None:
    """Each port is taken by someone else just as the worker checks it: the plan's port
    and every spare one. Then one stays free: the job starts on it."""
    lo = free_block(3)
    rig = rig_on(tmp_path, lo, 3)
    taken: list[int] = []

    def racing(port: int) -> bool:
        if len(taken) < 3:
            holds.enter_context(listener(port))
            taken.append(port)
        return port_is_free(port)

    rig.worker.scheduler.ports.port_free = racing
    try:
        job = rig.submit(gpus=1)
        rig.step()
        view = rig.job(job)
        assert taken == [lo, lo + 1, lo + 2]
        assert view.state is Q and rig.host.attempts == {}
        assert all(f"{p} held by {ME}" in view.reason for p in taken)
        holds.close()
        rig.clock.advance(PORT_COOLDOWN_S + 1)
        rig.step()
        assert rig.job(job).state is R and rig.job(job).port == lo
    finally:
        rig.close()


@pytest.mark.parametrize("size", [3, RECHECK_PORTS + 4])
def test_a_port_let_go_while_no_other_is_left_is_used_after_a_recheck_not_the_cooldown(
    tmp_path: Path, size: int
) -> None:
    """Every port of the range held: the cooling ones are bound again every RECHECK_S (not
    each pass), and the first let go starts the job then, long before PORT_COOLDOWN_S. A
    range larger than RECHECK_PORTS is bound at most that many ports a recheck, the next
    ones each time: its last port, let go, is found by the second recheck."""
    lo = 29600
    rig = make_rig(tmp_path / "home", port_range=(lo, lo + size - 1), max_user_ports=size)
    held = set(range(lo, lo + size))
    tried: list[int] = []

    def free(port: int) -> bool:
        tried.append(port)
        return port not in held

    rig.worker.scheduler.ports.port_free = free
    rig.worker.scheduler.ports.look = lambda ports: {}
    try:
        job = rig.submit(gpus=1)
        rig.step()  # every port tried, each found busy: all cool down
        assert sorted(tried) == sorted(held) and rig.job(job).state is Q
        tried.clear()
        rig.step()  # nothing left but cooling ports: a recheck
        assert len(tried) == min(size, RECHECK_PORTS)
        rechecks = 1
        tried.clear()
        last = lo + size - 1  # the range's last port
        held.discard(last)
        rig.step()  # the next recheck is RECHECK_S away: no bind, the job waits
        assert tried == [] and rig.job(job).state is Q
        while rig.job(job).state is Q and rechecks < 3:
            rig.clock.advance(RECHECK_S)  # the port still cools (PORT_COOLDOWN_S): a recheck's
            assert rig.worker.scheduler.ports.cooldown.get(last, 0) > rig.clock()
            tried.clear()
            rig.step()
            assert len(set(tried)) <= RECHECK_PORTS  # (confirm binds a freed one again)
            rechecks += 1
        view = rig.job(job)
        assert view.state is R and view.port == last
        assert rechecks == 2  # the recheck after it was let go, however large the range
    finally:
        rig.close()


@pytest.mark.parametrize(("busy", "jobs"), [(8, 1), (9, 1), (19, 2), (20, 1)])
def test_however_many_ports_are_busy_none_is_launched_with(
    tmp_path: Path, busy: int, jobs: int
) -> None:
    """The old pass re-planned 8 times, then launched on the port it had: a busy one."""
    rig = make_rig(tmp_path / "home", port_range=(29600, 29619), fake_gpus=2, max_user_ports=4)
    held = set(range(29600, 29600 + busy))
    rig.worker.scheduler.ports.port_free = lambda port: port not in held
    rig.worker.scheduler.ports.look = lambda ports: {
        p: [Holder(p, 1001, True, 4242, "python")] for p in ports
    }
    try:
        ids = [rig.submit(gpus=1) for _ in range(jobs)]
        rig.step()
        ports = [rig.host.attempt_of(j).launch.port for j in rig.host.running()]
        assert not set(ports) & held and len(ports) == min(jobs, 20 - busy)
        waiting = [rig.job(j) for j in ids if j not in rig.host.running()]
        assert len(waiting) == jobs - len(ports)
        for view in waiting:
            assert view.state is Q
            assert view.reason.startswith("no free rendezvous port: 29600 held by uid 1001")
            assert (
                "pid 4242 python" in view.reason and "more ports held outside ddpq" in view.reason
            )
    finally:
        rig.close()


def test_a_look_that_fails_still_leaves_the_job_waiting(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "home", port_range=(29600, 29602))
    rig.worker.scheduler.ports.port_free = lambda port: False
    rig.worker.scheduler.ports.look = lambda ports: {}  # no holder found (hidepid, no /proc)
    try:
        job = rig.submit(gpus=1)
        rig.step()
        assert rig.job(job).state is Q and rig.host.attempts == {}
        assert "29600 held by a process ddpq cannot see" in rig.job(job).reason
    finally:
        rig.close()


@pytest.mark.parametrize("moves", [0, 1, RECHECK_PORTS, 7])
def test_each_cooling_port_has_its_turn_however_the_rotation_moves_between_rechecks(
    moves: int,
) -> None:
    """The rotation's start (the last port leased) and the leased ports change between
    rechecks; still every cooling port of the range is test-bound within the rechecks it
    takes to walk the range once (a cursor kept as a place in the list skipped some)."""
    lo, hi = 40000, 40000 + 2 * RECHECK_PORTS + 7  # not a multiple of RECHECK_PORTS
    tried: list[int] = []

    def held(port: int) -> bool:
        tried.append(port)
        return False

    gate = PortGate(port_free=held, look=lambda ports: {})
    gate._cool(range(lo, hi + 1), now=0.0)
    after = lo
    ever_leased: set[int] = set()  # a leased port is ddpq's own: no recheck binds it
    turns = -(-(hi - lo + 1) // RECHECK_PORTS)
    for turn in range(turns):
        after = lo + (after - lo + moves) % (hi - lo + 1)
        leased = {after} if turn % 2 else set()  # a port leased now, let go by the next
        ever_leased |= leased
        assert gate.candidates(lo, hi, after, leased, now=turn * RECHECK_S) == []
    assert set(range(lo, hi + 1)) - set(tried) - ever_leased == set(), "ports never rechecked"
