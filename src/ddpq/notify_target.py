"""Where a notification's URL leads from this host: its name resolved once, within a
deadline, and each address checked, both by kind (``core.notify_address``) and against this
host's own addresses (any of them, not loopback alone: a server another user runs here
listens on all of them).

The server asks at submission (a URL that leads nowhere allowed is refused there, with the
reason; one that gets no answer in time is taken, bounded by ``server.notify_lookups``),
the notifier at each delivery, which then connects to an address checked here and never
looks the name up a second time (a name that resolves elsewhere a moment later changes
nothing).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ddpq.core.notify_address import (
    IPAddress,
    embedded_ipv4,
    parse,
    refused_by_class,
    refused_name,
)

OWN = "it is one of this host's own addresses"
UNKNOWN = "this host's own addresses cannot be read"
_FIB_TRIE = "/proc/net/fib_trie"
_IF_INET6 = "/proc/net/if_inet6"
_IPV6_ROUTE = "/proc/net/ipv6_route"
_NONLOCAL_BIND = "/proc/sys/net/ipv{}/ip_nonlocal_bind"


class Refused(Exception):
    """A notification may not go there (or the name did not resolve): ``str()`` says why,
    naming the host and never the rest of the URL (it may hold a webhook's secret)."""


class Unanswered(Refused):
    """The name got no answer yet: none within the deadline, a temporary failure, or no
    lookup could be started. Not where the URL leads: a delivery fails with it (and tries
    again later), a submission is taken (its deliveries check again)."""


# getaddrinfo's answers that say nothing of the name itself: the resolver could not be
# asked, or asked again later may answer (SERVFAIL and timeouts are EAI_AGAIN).
_TRANSIENT = frozenset({socket.EAI_AGAIN, socket.EAI_MEMORY, socket.EAI_SYSTEM})

Lookup = Callable[[str, int, float], list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Destination:
    """One checked address to connect to, as ``getaddrinfo`` gave it."""

    family: int
    kind: int
    proto: int
    address: Any  # the socket address: (ip, port) or (ip, port, flow, scope)


def url_destinations(
    url: str, *, allow_loopback: bool, timeout: float, lookup: Lookup | None = None
) -> list[Destination]:
    """``destinations`` of a URL ``core.notify.check_url`` took: its host, at its port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return destinations(
        parts.hostname or "", port, allow_loopback=allow_loopback, timeout=timeout, lookup=lookup
    )


def destinations(
    host: str, port: int, *, allow_loopback: bool, timeout: float, lookup: Lookup | None = None
) -> list[Destination]:
    """The addresses ``host`` resolves to that a notification may go to, in the resolver's
    order; Refused (why) if there is none or the name does not exist, Unanswered if it got
    no answer in ``timeout``. ``allow_loopback``: the admin's ``--notify-allow-loopback``
    (never a user's choice). ``lookup``: how a name is resolved (``resolve``) once it is
    no address written out (those are read at once, never held up by a resolver)."""
    why = refused_name(host, allow_loopback)
    if why is not None:
        raise Refused(f"refused: {host} leads nowhere a notification may go ({why})")
    found = numeric(host, port)
    if found is None:
        found = (lookup or resolve)(host, port, timeout)
    allowed, reasons = [], []
    for family, kind, proto, _, address in found:
        why = refused_address(str(address[0]), allow_loopback)
        if why is None:
            allowed.append(Destination(family, kind, proto, address))
        elif why not in reasons:
            reasons.append(why)
    if not allowed:
        raise Refused(f"refused: {host} leads nowhere a notification may go ({'; '.join(reasons)})")
    return allowed


def refused_address(ip: str, allow_loopback: bool) -> str | None:
    """Why a notification may not go to ``ip``, or None if it may."""
    addr = parse(ip)
    why = refused_by_class(addr, allow_loopback)
    leads_to = [addr, *embedded_ipv4(addr)]
    if why is not None or (allow_loopback and any(a.is_loopback for a in leads_to)):
        return why
    try:
        if any(own_address(a) for a in leads_to):
            return OWN
    except OSError:  # not known, so not allowed
        return UNKNOWN
    return None


def numeric(host: str, port: int) -> list[tuple[Any, ...]] | None:
    """``getaddrinfo``'s addresses for a host written as an address (in any form the
    resolver reads as one: ``127.1``, ``0x7f.0.0.1``, ``::ffff:…``), asking no resolver;
    None for a name."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return None


def resolve(
    host: str, port: int, timeout: float, *, finished: Callable[[], None] | None = None
) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` for a stream socket, given up after ``timeout`` seconds (the
    resolver's own timeouts can add up to half a minute: the lookup is left to finish on
    its own thread, which calls ``finished`` as it ends, whoever still waits for it).
    Refused if the name does not resolve; Unanswered if there is no answer yet."""
    found: list[tuple[Any, ...]] = []
    failed: list[OSError | UnicodeError] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:  # a name IDNA cannot encode: UnicodeError
            failed.append(exc)
        finally:
            try:  # before the answer is seen: whoever sees it finds the lookup ended
                if finished is not None:
                    finished()
            finally:
                done.set()

    try:
        threading.Thread(target=look_up, name="ddpq-resolve", daemon=True).start()
    except RuntimeError:  # no thread to be had: nothing runs that would call it
        if finished is not None:
            finished()
        raise Unanswered(f"cannot resolve {host} now: no thread to look it up") from None
    if not done.wait(timeout):
        raise Unanswered(f"cannot resolve {host}: no answer within {timeout:g} s")
    if failed:
        why = failed[0]
        text = f"cannot resolve {host}: {getattr(why, 'strerror', None) or why}"
        raise (Unanswered if getattr(why, "errno", None) in _TRANSIENT else Refused)(text)
    return found


# ---- this host's own addresses ---------------------------------------------------------------


def own_address(addr: IPAddress) -> bool:
    """Whether ``addr`` is this host's: one it can bind, as the kernel answers (every
    interface's addresses, IPv4's local routes, and its networks' broadcast addresses), or
    in one of IPv6's local routes. Where the admin lets any address be bound
    (``ip_nonlocal_bind``) that answer means nothing, and the addresses are read from /proc
    instead. OSError: neither can be asked."""
    if _nonlocal_bind(addr.version):
        return any(addr in network for network in _listed_local(addr.version))
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    try:
        probe = socket.socket(family, socket.SOCK_DGRAM)
    except OSError as exc:
        if exc.errno == errno.EAFNOSUPPORT:
            return False  # no IPv6 here at all: no address of that kind is this host's
        raise
    with probe:
        # IPv6 binds only an interface's own addresses, yet a connection to any address of
        # a local route (AnyIP: ``ip -6 route add local 2001:db8::/64 dev lo``) reaches
        # whoever listens here on ``::``.
        if addr.version == 6 and any(addr in network for network in _ipv6_local_routes()):
            return True
        try:
            probe.bind((str(addr), 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def _nonlocal_bind(version: int) -> bool:
    try:
        with open(_NONLOCAL_BIND.format(version), encoding="ascii") as f:
            return f.read().strip() not in ("", "0")
    except FileNotFoundError:
        return False


_FIB_ADDRESS = re.compile(r"[\s|+`-]*-- ([0-9.]+)\s*$")
_FIB_ROUTE = re.compile(r"\s*/(\d+) \w+ (LOCAL|BROADCAST)\b")


def _listed_local(version: int) -> Iterator[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """This host's addresses as /proc lists them: IPv4's local and broadcast routes (the
    kernel's routing trie), IPv6's interface addresses and local routes."""
    if version == 6:
        with open(_IF_INET6, encoding="ascii") as f:
            for line in f:
                yield _hex_ipv6(line.split()[0], 128)
        yield from _ipv6_local_routes()
        return
    with open(_FIB_TRIE, encoding="ascii") as f:
        current = None
        for line in f:
            if m := _FIB_ADDRESS.match(line):
                current = m.group(1)
            elif (m := _FIB_ROUTE.match(line)) and current is not None:
                yield ipaddress.ip_network(f"{current}/{m.group(1)}", strict=False)


# Routes by which the kernel takes a packet in as this host's own
# (include/uapi/linux/ipv6_route.h): local (an interface's address, or a prefix routed
# here, in any routing table) and anycast (a router's subnet address).
_RTF_LOCAL = 0x80000000
_RTF_ANYCAST = 0x00100000


def _ipv6_local_routes() -> list[ipaddress.IPv6Network]:
    with open(_IPV6_ROUTE, encoding="ascii") as f:
        return list(ipv6_local_routes(f))


def ipv6_local_routes(lines: Iterable[str]) -> Iterator[ipaddress.IPv6Network]:
    """The networks of the local and anycast routes in /proc/net/ipv6_route's lines: the
    destination and its prefix length (hex) first, the route's flags (hex) ninth."""
    for line in lines:
        fields = line.split()
        if len(fields) >= 9 and int(fields[8], 16) & (_RTF_LOCAL | _RTF_ANYCAST):
            yield _hex_ipv6(fields[0], int(fields[1], 16))


def _hex_ipv6(hex_address: str, prefix: int) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network((int(hex_address, 16), prefix), strict=False)
