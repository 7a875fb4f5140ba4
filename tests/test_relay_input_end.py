"""The end of a file or pipe given to `ddpq shell` is typed into its session as the
terminal's EOF key, as ssh does (`ddpq shell < /dev/null` waited for good); `ddpq attach`
only stops typing (a script watching a session must not end it)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import pytest

from ddpq.client import relay


def inputs_in(frames: bytes) -> bytes:
    """The keys the whole INPUT frames of ``frames`` type, in order."""
    keys, at = b"", 0
    while at + relay.HEADER.size <= len(frames):
        kind, length = relay.HEADER.unpack_from(frames, at)
        if at + relay.HEADER.size + length > len(frames):
            break
        at += relay.HEADER.size
        keys += frames[at : at + length] if kind == relay.INPUT else b""
        at += length
    return keys


def typed(given: bytes, send_eof: bool) -> bytes:
    """What the relay types into the session for ``given`` as its input, then its end."""
    ours, session = socket.socketpair()
    read, write = os.pipe()
    os.write(write, given)
    os.close(write)
    got = bytearray()

    def session_side() -> None:
        session.settimeout(10)
        with contextlib.suppress(TimeoutError):
            while chunk := session.recv(65536):
                got.extend(chunk)
                keys = inputs_in(bytes(got))
                if keys.endswith(relay.EOF_KEY) if send_eof else keys == given:
                    break  # all it types has come
        session.close()  # the session ends: the relay returns

    reader = threading.Thread(target=session_side)
    reader.start()
    out = os.open(os.devnull, os.O_WRONLY)
    try:
        relay.relay(ours, read, out, None, send_eof)
    finally:
        reader.join()
        ours.close()
        os.close(read)
        os.close(out)
    return inputs_in(bytes(got))


@pytest.mark.parametrize(
    ("given", "after"),
    [(b"", b"\x04"), (b"ls\n", b"ls\n\x04"), (b"exit 4", b"exit 4\n\x04")],
    ids=["nothing", "a-whole-line", "a-line-without-its-newline"],
)
def test_the_end_of_input_is_typed_as_the_eof_key_at_a_lines_start(
    given: bytes, after: bytes
) -> None:
    assert typed(given, send_eof=True) == after


def test_attach_only_stops_typing() -> None:
    assert typed(b"ls\n", send_eof=False) == b"ls\n"
