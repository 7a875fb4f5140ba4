"""A one-byte nudge from the API to the worker: "look at the queue now".

The worker listens on a Unix datagram socket in the state folder; anything
that changes the queue sends it a datagram. A lost nudge costs nothing but
latency: the worker also looks every ``poll_s`` seconds.
"""

from __future__ import annotations

import socket
from pathlib import Path


def nudge(path: Path) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(b"!", str(path))
    except OSError:
        pass  # no worker listening (yet), or its buffer is full: it will poll


def listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.setblocking(False)
    return s


def drain(s: socket.socket) -> None:
    while True:
        try:
            s.recv(64)
        except BlockingIOError:
            return
