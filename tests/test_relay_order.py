"""The relay (`ddpq shell`, `ddpq attach`) sends a window's new size before the keys typed
into it after the resize, whether or not its SIGWINCH was seen first.

select can return the keys ready while the SIGWINCH that came before them is handled only
after it returned; the relay then sent the keys first, and on a loaded machine the session's
shell ran `stty size` at the old size (tests/test_sessions_e2e.py's window test failed so
once). Here the resize comes with no signal at all, the latest a signal can be seen."""

from __future__ import annotations

import fcntl
import os
import pty
import socket
import struct
import termios
import threading
import tty
from collections.abc import Iterator

import pytest

from ddpq.client import relay


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Frames:
    """The frames the relay sends, read from the session's end of its socket (what one
    read brings past a frame is kept for the next)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.inbox = sock, b""

    def next(self, count: int) -> list[tuple[bytes, bytes]]:
        got: list[tuple[bytes, bytes]] = []
        while len(got) < count:
            while len(self.inbox) < relay.HEADER.size or len(self.inbox) < (
                relay.HEADER.size + relay.HEADER.unpack_from(self.inbox)[1]
            ):
                data = self.sock.recv(4096)
                assert data, f"the relay stopped after {got}"
                self.inbox += data
            kind, length = relay.HEADER.unpack_from(self.inbox)
            end = relay.HEADER.size + length
            got.append((kind, self.inbox[relay.HEADER.size : end]))
            self.inbox = self.inbox[end:]
        return got


def size_frame(rows: int, cols: int) -> tuple[bytes, bytes]:
    return relay.WINSIZE, struct.pack("!HH", rows, cols)


@pytest.fixture
def relaying() -> Iterator[tuple[int, Frames]]:
    """A relay on a terminal of its own: the terminal's other end and the session's end."""
    master, terminal = pty.openpty()
    tty.setraw(terminal)  # as the relay runs it: every byte as typed
    set_size(master, 24, 80)
    ours, sessions = socket.socketpair()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    done: list[relay.Outcome] = []
    thread = threading.Thread(
        target=lambda: done.append(relay._loop(ours, terminal, terminal, None, wake_r, False)),
        daemon=True,
    )
    thread.start()
    sessions.settimeout(10)  # a frame that never comes fails the test, not the suite
    try:
        yield master, Frames(sessions)
    finally:
        sessions.close()  # the session's end gone: the relay returns
        thread.join(30)
        for fd in (master, terminal, wake_r, wake_w):
            os.close(fd)
        ours.close()
    assert done and not done[0].detached


def test_keys_typed_after_a_resize_follow_the_new_size(
    relaying: tuple[int, Frames],
) -> None:
    master, sent = relaying
    assert sent.next(1) == [size_frame(24, 80)]  # the size when the relay starts
    set_size(master, 40, 132)  # and no signal, nothing on the wake pipe
    os.write(master, b"stty size\r")
    assert sent.next(1) == [size_frame(40, 132)]  # first, then the keys
    assert typed(sent, b"stty size\r")


def typed(sent: Frames, keys: bytes) -> bool:
    """Whether the next frames are ``keys`` as input, in one frame or more (the terminal
    may hand the relay a write in pieces)."""
    got = b""
    while len(got) < len(keys):
        kind, payload = sent.next(1)[0]
        if kind != relay.INPUT:
            return False
        got += payload
    return got == keys


def test_keys_at_an_unchanged_size_go_alone(relaying: tuple[int, Frames]) -> None:
    master, sent = relaying
    assert sent.next(1) == [size_frame(24, 80)]
    os.write(master, b"a")
    os.write(master, b"b")
    assert typed(sent, b"ab")
