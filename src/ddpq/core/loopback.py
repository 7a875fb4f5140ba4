"""Whether a host names this machine's loopback: pure, and light enough for the client's
fast path (no pydantic, ``ipaddress`` imported only when asked)."""

from __future__ import annotations


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
