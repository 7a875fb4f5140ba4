"""This terminal relayed to a session's, over the Unix socket its shim serves (as ``dtach``).

What `ddpq shell` and `ddpq attach` run once the session runs. This terminal goes into raw
mode (every key, Ctrl-C included, goes to the session), its window size is sent when the
relay starts and at every SIGWINCH, and the detach key (Ctrl-\\ unless ``--detach-key``
says otherwise) leaves the session running. When standard input is not a terminal, its
bytes are relayed as they are; its end is typed as the terminal's EOF key for `ddpq
shell` (``send_eof``), and only ends the input for `ddpq attach`. Standard library only.

Frames, both ways: one byte of kind, four of length (big-endian), the payload; the shim's
``executors.local.shim_wire`` speaks the same protocol (a test checks that they agree).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

INPUT = b"i"
WINSIZE = b"w"
OUTPUT = b"o"
ENDED = b"x"
HEADER = struct.Struct("!cI")
MAX_FRAME = 256 * 1024
READ_CHUNK = 65536
# What a terminal reads as the end of its input (Ctrl-D, VEOF) at the start of a line.
EOF_KEY = b"\x04"
DEFAULT_DETACH = "^\\"
# A socket's address holds 108 bytes; a longer path is reached from inside its folder.
SUN_PATH_MAX = 107


class CannotAttach(Exception):
    """The session's socket cannot be reached; ``waiting``: it may just not be there yet."""

    def __init__(self, message: str, waiting: bool = False) -> None:
        super().__init__(message)
        self.waiting = waiting


@dataclass(frozen=True)
class Outcome:
    """How the relay ended: detached (the session runs on), or the session ended (with
    its exit code or signal when the shim said, both None when it could not)."""

    detached: bool
    exit_code: int | None = None
    signal: int | None = None


def detach_byte(spec: str) -> int | None:
    """``^\\``, ``^]``, ``^A`` ... as the byte the key sends; None for ``none``. Raises
    ``ValueError`` for anything else."""
    text = spec.strip()
    if text.lower() == "none":
        return None
    if len(text) == 2 and text[0] == "^" and "?" <= text[1].upper() <= "_":
        return 0x7F if text[1] == "?" else ord(text[1].upper()) ^ 0x40
    raise ValueError(f"{spec!r}: give a control key as ^X (^\\, ^], ^A, ...) or none")


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def connect(path: str) -> socket.socket:
    """A connection to the session's socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(path)) <= SUN_PATH_MAX:
            sock.connect(path)
        else:
            folder, name = os.path.split(path)
            with _inside(folder):
                sock.connect(name)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENOENT and not os.path.isdir(os.path.dirname(path)):
            raise CannotAttach(
                f"{path} is on the daemon's host, not this one: attach from there"
            ) from None
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            raise CannotAttach(f"{path}: not served (yet)", waiting=True) from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise CannotAttach(
                f"{path}: permission denied (a session's terminal is open to the account it "
                "runs as, on the daemon's host)"
            ) from None
        raise CannotAttach(f"{path}: {exc.strerror or exc}") from None
    theirs = served_by(sock)
    if theirs is not None and theirs != os.geteuid() and os.geteuid() != 0:
        # The job's account owns its folder and may put a listener of its own where its
        # shim's socket was: this terminal's keystrokes must not go to another account.
        sock.close()
        raise CannotAttach(
            f"{path} is served by another account (uid {theirs}), not yours: a session is "
            "attached by the account it runs as"
        )
    return sock


def served_by(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (None if the kernel does
    not say)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    uid: int = struct.unpack("3i", raw)[1]
    return uid


@contextlib.contextmanager
def _inside(folder: str) -> Iterator[None]:
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(folder)
        yield
    finally:
        os.fchdir(here)
        os.close(here)


def window_size(fd: int) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size.lines, size.columns


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode for the relay, as it was afterwards (if a terminal)."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def resizes() -> Iterator[int]:
    """A descriptor that becomes readable when this terminal's window changes (SIGWINCH)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    previous_fd = signal.set_wakeup_fd(w)
    previous = signal.signal(signal.SIGWINCH, lambda *_: None)  # the wakeup fd says it
    try:
        yield r
    finally:
        signal.signal(signal.SIGWINCH, previous)
        signal.set_wakeup_fd(previous_fd)
        os.close(r)
        os.close(w)


def relay(
    sock: socket.socket, stdin: int, stdout: int, detach: int | None, send_eof: bool = False
) -> Outcome:
    """Relay until the detach key is pressed or the session ends; ``send_eof``: type the
    end of ``stdin`` (a file's, a pipe's) into the session as its EOF key."""
    with raw_mode(stdin), resizes() as wake:
        return _loop(sock, stdin, stdout, detach, wake, send_eof)


def _loop(
    sock: socket.socket, stdin: int, stdout: int, detach: int | None, wake: int, send_eof: bool
) -> Outcome:
    size = window_size(stdin)
    if size is not None:
        sock.sendall(frame(WINSIZE, struct.pack("!HH", *size)))
    inbox = bytearray()
    ended: dict[str, int | None] | None = None
    reading_input = True
    last = b"\n"  # the last byte typed: the EOF key ends input only at a line's start
    while True:
        fds = [sock.fileno(), wake] + ([stdin] if reading_input else [])
        try:
            ready, _, _ = select.select(fds, [], [])
        except InterruptedError:
            continue
        if wake in ready or stdin in ready:
            # Before the keys: a window resized, then typed into, sends its size first.
            # Not only on the wake: select can return the keys ready while the SIGWINCH
            # that came before them is handled only after it returned (its byte on the
            # wake pipe then unseen until the next turn); the size is there already.
            with contextlib.suppress(BlockingIOError):
                os.read(wake, 512)
            now = window_size(stdin)
            if now is not None and now != size:
                size = now
                sock.sendall(frame(WINSIZE, struct.pack("!HH", *size)))
        if stdin in ready:
            data = os.read(stdin, READ_CHUNK)
            if not data:
                # Input ended (a file or a pipe; a terminal in raw mode never ends): said to
                # the session's terminal as its EOF key, as ssh does, so that a shell reading
                # it ends (`ddpq shell < /dev/null` waited for good); a program that does
                # not read it goes on to its own end.
                reading_input = False
                if send_eof:
                    sock.sendall(frame(INPUT, (b"" if last == b"\n" else b"\n") + EOF_KEY))
            elif detach is not None and detach in data:
                before = data[: data.index(detach)]
                if before:
                    sock.sendall(frame(INPUT, before))
                return Outcome(detached=True)
            else:
                sock.sendall(frame(INPUT, data))
                last = data[-1:]
        if sock.fileno() in ready:
            try:
                data = sock.recv(READ_CHUNK)
            except ConnectionResetError:
                data = b""
            if not data:
                got = ended or {}
                return Outcome(False, got.get("exit_code"), got.get("signal"))
            inbox += data
            ended = _take_frames(inbox, stdout) or ended


def _take_frames(inbox: bytearray, stdout: int) -> dict[str, int | None] | None:
    """Write the output frames in ``inbox`` (the whole ones); the end's, if it came."""
    ended = None
    while len(inbox) >= HEADER.size:
        kind, length = HEADER.unpack_from(inbox)
        if length > MAX_FRAME:
            raise CannotAttach("the session's socket sent what no shim sends")
        if len(inbox) < HEADER.size + length:
            break
        payload = bytes(inbox[HEADER.size : HEADER.size + length])
        del inbox[: HEADER.size + length]
        if kind == OUTPUT:
            _write_all(stdout, payload)
        elif kind == ENDED:
            ended = _ended(payload)
    return ended


def _ended(payload: bytes) -> dict[str, int | None]:
    try:
        data = json.loads(payload)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k in ("exit_code", "signal") if isinstance(v := data.get(k), int)}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]
