"""Rendezvous ports: is one free right now, and which may a job be launched with?"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Collection, Mapping, Sequence, Set
from dataclasses import replace

from ddpq.core.scheduler import Placement
from ddpq.portholders import Holder, holders

log = logging.getLogger("ddpq.worker")

# A port an outside program holds is skipped this long before it is tried again...
PORT_COOLDOWN_S = 30.0
# ...unless no other port is left: then the cooling ones are test-bound again this often
# (a bind each, no look at who holds them), so a job waits for a port at most about this
# long after one is let go, not the cool-down's 30 s.
RECHECK_S = 1.0
RECHECK_PORTS = 16  # at most this many cooling ports test-bound a recheck
# Busy ports a waiting reason names (the rest are counted).
NAMED_HOLDERS = 3
HOLDERS_PER_PORT = 2  # SO_REUSEPORT lets many sockets share one port


def port_is_free(port: int) -> bool:
    """Test-bind ``port`` on the wildcard addresses torch's TCPStore listens on.

    bind(), not connect(): connect only sees listeners, while bind also fails
    for a port that an outside program has bound but not yet listens on.
    SO_REUSEADDR as TCPStore sets it, so a port left in TIME_WAIT by the
    previous job still counts as free (TCPStore could bind it too).
    """
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def rotation(lo: int, hi: int, after: int | None) -> list[int]:
    """Ports lo..hi starting just after ``after``: a freed port is reused last."""
    ports = list(range(lo, hi + 1))
    if after is None or not lo <= after <= hi:
        return ports
    cut = after - lo + 1
    return ports[cut:] + ports[:cut]


class PortGate:
    """Which ports the planner may hand out, and that every port a job is launched with
    passed its test-bind just now.

    A port another program holds is never launched with: the placement gets the next
    spare port that passes instead, or is dropped from the pass (its job waits, and its
    reason names who holds the ports). A busy port is skipped for PORT_COOLDOWN_S, and who
    holds it is looked up once for all the busy ports of a pass (``portholders``); while
    every port of the range is leased or cooling, the cooling ones are test-bound again
    every RECHECK_S (RECHECK_PORTS of them, the next ones in the range each time), and one
    that binds is offered at once."""

    def __init__(
        self,
        port_free: Callable[[int], bool] = port_is_free,
        look: Callable[[Collection[int]], Mapping[int, Sequence[Holder]]] = holders,
    ) -> None:
        self.port_free = port_free
        self.look = look
        self.cooldown: dict[int, float] = {}  # port -> when it may be tried again
        self.held_by: dict[int, str] = {}  # a cooling port -> who holds it, in words
        self.recheck_at = 0.0  # when cooling ports may next be test-bound early
        # The last port a recheck test-bound: the next begins after it, so each port of the
        # range has its turn however the leases and the rotation's start move in between.
        self.recheck_after: int | None = None

    def candidates(
        self, lo: int, hi: int, after: int | None, leased: Set[int], now: float
    ) -> list[int]:
        """The ports the planner may use, in the order it should use them."""
        spare = [p for p in rotation(lo, hi, after) if p not in leased]
        offered = [p for p in spare if not self._cooling(p, now)]
        if offered or not spare or now < self.recheck_at:
            return offered
        # Nothing left but cooling ports: those whose holder has let go since are offered
        # now (``confirm`` binds each again before a job gets it).
        self.recheck_at = now + RECHECK_S
        batch = [p for p in rotation(lo, hi, self.recheck_after) if p not in leased]
        batch = batch[:RECHECK_PORTS]
        self.recheck_after = batch[-1]
        freed = [p for p in batch if self.port_free(p)]
        for port in freed:
            self._forget(port)
        return freed

    def confirm(
        self, placements: Sequence[Placement], offered: Sequence[int], now: float
    ) -> list[Placement]:
        """``placements`` with ports that pass the test-bind, each busy one replaced by the
        next port of ``offered`` (the planner's) that no placement has and that passes; a
        placement none passes for is left out (its job waits). Busy ports cool down."""
        placed = {pl.port for pl in placements}  # once, not once per port of the range
        left = [p for p in offered if p not in placed]
        kept: list[Placement] = []
        busy: list[int] = []
        for placement in placements:
            port = placement.port
            while port is not None and not self.port_free(port):
                busy.append(port)
                port = left.pop(0) if left else None
            if placement.port is None or port is not None:
                kept.append(placement if port == placement.port else replace(placement, port=port))
            else:
                log.info("job %s waits: no rendezvous port is free", placement.job_id)
        if busy:
            self._cool(busy, now)
        return kept

    def waiting_reason(self, now: float) -> str:
        """Why a job waits for a port: who holds those outside programs hold, if any."""
        held = sorted(p for p in list(self.cooldown) if self._cooling(p, now))
        if not held:
            return "waiting for a free rendezvous port"
        named = ", ".join(self.held_by[p] for p in held[:NAMED_HOLDERS])
        more = len(held) - NAMED_HOLDERS
        if more > 0:
            named += f", and {more} more port{'' if more == 1 else 's'} held outside ddpq"
        return f"no free rendezvous port: {named}"

    def _cooling(self, port: int, now: float) -> bool:
        until = self.cooldown.get(port)
        if until is None:
            return False
        if until > now:
            return True
        self._forget(port)
        return False

    def _forget(self, port: int) -> None:
        """A port no longer cooling: offered again, its holder no longer named."""
        self.cooldown.pop(port, None)
        self.held_by.pop(port, None)

    def _cool(self, busy: Sequence[int], now: float) -> None:
        found = self.look(busy)
        for port in busy:
            said = dict.fromkeys(h.describe() for h in found.get(port, ()))  # v4 and v6 alike
            who = ", ".join(list(said)[:HOLDERS_PER_PORT]) or (
                f"{port} held by a process ddpq cannot see"
            )
            self.cooldown[port] = now + PORT_COOLDOWN_S
            self.held_by[port] = who
            log.info("port %s is in use: %s; not leased for %.0f s", port, who, PORT_COOLDOWN_S)
