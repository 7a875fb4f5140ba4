"""A one-byte nudge from the API to the worker: "look at the queue now".

The worker listens on a Unix datagram socket in the state folder; anything
that changes the queue sends it a datagram. A lost nudge costs nothing but
latency: the worker also looks every ``poll_s`` seconds. It waits for a nudge and for
its executor's descriptors (an ended attempt) at once: ``wait_readable``.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterable
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


def wait_readable(fds: Iterable[int], timeout_s: float) -> set[int]:
    """Wait until one of ``fds`` is readable (or hung up, or closed), ``timeout_s`` at
    most; those that are.

    poll(2), not select(2): select cannot watch a descriptor numbered 1024 or above
    (FD_SETSIZE; Python raises ValueError), and the local executor gives the worker one
    pidfd per running job, so about a thousand jobs passed it. The set is made afresh on
    each call: the executor closes pidfds and opens others between waits, and a number
    closed and given to another process must not count as watched already (as it would in
    a long-lived epoll set, which forgets a closed descriptor but not its number). Building
    it costs a few milliseconds for ten thousand descriptors; the wait is one system call.
    """
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0.0, timeout_s) * 1000.0)}
