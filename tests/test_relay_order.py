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


def frames(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """The next ``count`` frames the relay sent."""
    got: list[tuple[bytes, bytes]] = []
    inbox = b""
    while len(got) < count:
        while (
            len(inbox) < relay.HEADER.size
            or len(inbox) < relay.HEADER.size + (relay.HEADER.unpack_from(inbox)[1])
        ):
            data = sock.recv(4096)
            assert data, f"the relay stopped after {got}"
            inbox += data
        kind, length = relay.HEADER.unpack_from(inbox)
        got.append((kind, inbox[relay.HEADER.size : relay.HEADER.size + length]))
        inbox = inbox[relay.HEADER.size + length :]
    return got


def size_frame(rows: int, cols: int) -> tuple[bytes, bytes]:
    return relay.WINSIZE, struct.pack("!HH", rows, cols)


@pytest.fixture
def relaying() -> Iterator[tuple[int, socket.socket]]:
    """A relay on a terminal of its own: the terminal's other end and the session's end."""
    master, terminal = pty.openpty()
    tty.setraw(terminal)  # as the relay runs it: every byte as typed
    set_size(master, 24, 80)
    ours, sessions = socket.socketpair()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    done: list[relay.Outcome] = []
    thread = threading.Thread(
        target=lambda: done.append(relay._loop(ours, terminal, terminal, None, wake_r)),
        daemon=True,
    )
    thread.start()
    sessions.settimeout(10)  # a frame that never comes fails the test, not the suite
    try:
        yield master, sessions
    finally:
        sessions.close()  # the session's end gone: the relay returns
        thread.join(30)
        for fd in (master, terminal, wake_r, wake_w):
            os.close(fd)
        ours.close()
    assert done and not done[0].detached


def test_keys_typed_after_a_resize_follow_the_new_size(
    relaying: tuple[int, socket.socket],
) -> None:
    master, sessions = relaying
    assert frames(sessions, 1) == [size_frame(24, 80)]  # the size when the relay starts
    set_size(master, 40, 132)  # and no signal, nothing on the wake pipe
    os.write(master, b"stty size\r")
    assert frames(sessions, 2) == [size_frame(40, 132), (relay.INPUT, b"stty size\r")]


def test_keys_at_an_unchanged_size_go_alone(relaying: tuple[int, socket.socket]) -> None:
    master, sessions = relaying
    assert frames(sessions, 1) == [size_frame(24, 80)]
    os.write(master, b"a")
    os.write(master, b"b")
    got = frames(sessions, 1)
    while b"".join(payload for _, payload in got) != b"ab":  # in one frame or two
        got += frames(sessions, 1)
    assert {kind for kind, _ in got} == {relay.INPUT}
