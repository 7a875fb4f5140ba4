"""Rendezvous ports: is one free right now?"""

from __future__ import annotations

import socket


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
