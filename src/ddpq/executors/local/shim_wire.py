"""What an interactive session's terminal (``shim_pty``) hears from outside: its socket
(how it is served, who may connect, the frames spoken on it, what of the terminal's past
output is replayed to a client) and the worker's notice (a line in the job's folder).

Frames, both ways: one byte of kind, four of length (big-endian), the payload.
``ddpq.client.relay`` speaks the same protocol (a test checks that they agree). Standard
library only, beside the shim (``shim.py`` says how it is found).
"""

from __future__ import annotations

import os
import socket
import stat
import struct

INPUT = b"i"  # client -> shim: keys typed
WINSIZE = b"w"  # client -> shim: rows, columns ("!HH")
OUTPUT = b"o"  # shim -> client: what the job wrote on the terminal
ENDED = b"x"  # shim -> client: the job has ended; its exit code or signal (JSON)
HEADER = struct.Struct("!cI")
MAX_FRAME = 256 * 1024
MAX_CLIENTS = 8
NOTICE_MAX = 4096


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def take_frames(inbox: bytearray) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The whole frames at the start of a client's ``inbox``, taken out of it, and whether
    the client is ours: False at the first frame too long or of a kind no client sends
    (the frames before it are returned; nothing after it is taken)."""
    frames: list[tuple[bytes, bytes]] = []
    while len(inbox) >= HEADER.size:
        kind, length = HEADER.unpack_from(inbox)
        if length > MAX_FRAME or kind not in (INPUT, WINSIZE):
            return frames, False
        if len(inbox) < HEADER.size + length:
            break
        frames.append((kind, bytes(inbox[HEADER.size : HEADER.size + length])))
        del inbox[: HEADER.size + length]
    return frames, True


def listen(path: str) -> socket.socket:
    """The session's socket at ``path``, 0600 from the start. Bound from inside its folder:
    a job folder's path may be longer than a socket address holds (108 bytes). The shim
    enters the job's working directory afterwards."""
    folder, name = os.path.split(path)
    os.chdir(folder)
    try:
        os.unlink(name)  # an earlier attempt's
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(name)
    finally:
        os.umask(old)
    sock.listen(MAX_CLIENTS)
    sock.setblocking(False)
    return sock


# What a program asks the terminal (cursor position, device attributes, colours, modes...):
# a terminal answers by typing the answer in. Live, the program reads it; replayed to a
# client that attaches later, the answer would land in the shell as keys ("2RR" at the
# prompt). So a replay leaves these out; everything else is drawn as it was.
_QUERIES = (
    rb"\x1b\[[?>=]?[0-9;]*[cn]"  # device attributes (DA), status and cursor reports (DSR)
    rb"|\x1b\[[?]?[0-9;]*\$p"  # DECRQM: is this mode set?
    rb"|\x1b\[[0-9;]*t"  # window reports (and moves: not for a replay either)
    rb"|\x1b\[[?>=<][0-9;]*[qu]"  # XTVERSION, the keyboard protocol's query and stack
    rb"|\x1b\][^\x07\x1b]*\?[^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC colour queries ("11;?")
    rb"|\x1bP[$+]q.*?\x1b\\"  # DECRQSS, XTGETTCAP
)


def replayable(data: bytes) -> bytes:
    """``data`` without the sequences that make a terminal answer (see ``_QUERIES``)."""
    import re  # only when a client attaches: a batch job's start imports nothing of it

    return re.sub(_QUERIES, b"", data, flags=re.DOTALL)


def replay(scrollback: bytes, trimmed: bool) -> bytes:
    """What a client that attaches is sent of the terminal's past output: from a line's
    start if the scrollback lost its beginning (``trimmed``), without the queries."""
    if trimmed and b"\n" in scrollback:
        scrollback = scrollback[scrollback.index(b"\n") + 1 :]
    return replayable(scrollback)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.sized = False  # has sent its window size (then a redraw is asked for)


def take_notice(path: str) -> str:
    """The line the worker left at ``path`` for the terminal (the idle warning), printable
    and at most ``NOTICE_MAX`` bytes, and the file taken away; "" if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        # The job's folder: whatever is there may be the job's (a FIFO, say), not ours.
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        text = os.read(fd, NOTICE_MAX).decode(errors="replace") if regular else ""
    except OSError:
        text = ""
    finally:
        os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        pass
    return "".join(c if c.isprintable() else " " for c in text).strip()
