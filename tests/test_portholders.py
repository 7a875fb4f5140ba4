"""Who holds a port (``ddpq.portholders``): a fake /proc for what it reads, real sockets for
the whole look. Whatever /proc holds (garbage, nothing, a million links), the look answers
with what it could find and never raises."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from ddpq import portholders
from ddpq.portholders import Holder, holders
from ddpq.procfs import process_name

# Ports nothing on a test host binds (tcpmux and its neighbour): the real netlink look
# finds nothing for them, so only the fake /proc speaks.
P1, P2 = 1, 2
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ...\n"


def tcp_line(port: int, state: int, uid: int, inode: int, v6: bool = False) -> str:
    local = ("0" * 32 if v6 else "0100007F") + f":{port:04X}"
    remote = ("0" * 32 if v6 else "00000000") + ":0000"
    queues = "00000000:00000000 00:00000000 00000000"
    return f"   0: {local} {remote} {state:02X} {queues} {uid} 0 {inode} 1 0\n"


def fake_proc(tmp_path: Path, tcp: str, tcp6: str = "", processes: int = 1) -> Path:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(HEADER + tcp)
    (proc / "net" / "tcp6").write_text(HEADER + tcp6)
    for n in range(processes):
        pid = 4242 + n
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_bytes(b"jupyter-lab\x1b[2J\n")
        uid = os.getuid()
        (proc / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        os.symlink("/dev/null", proc / str(pid) / "fd" / "0")
        os.symlink(f"socket:[{900 + n}]", proc / str(pid) / "fd" / "3")
    return proc


def test_listeners_and_bound_sockets_are_named_with_their_process(tmp_path: Path) -> None:
    me = os.getuid()
    proc = fake_proc(
        tmp_path,
        tcp_line(P1, 0x0A, me, 900) + tcp_line(P1, 0x06, me, 0) + "garbage line\n",
        tcp_line(P2, 0x01, me, 901, v6=True),
        processes=2,
    )
    found = holders([P1, P2], proc=proc)
    assert found == {
        P1: [Holder(P1, me, True, 4242, "jupyter-lab?[2J")],  # the escape made inert
        P2: [Holder(P2, me, False, 4243, "jupyter-lab?[2J")],  # connected, not listening
    }
    assert holders([P1, P2], listening_only=True, proc=proc) == {P1: found[P1]}
    assert found[P1][0].describe().startswith(f"{P1} held by uid {me} (")
    assert found[P1][0].describe().endswith(" pid 4242 jupyter-lab?[2J")


def test_a_socket_whose_process_cannot_be_found_still_names_its_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = fake_proc(tmp_path, tcp_line(P1, 0x0A, os.getuid(), 900))
    monkeypatch.setattr(portholders, "MAX_LINKS", 0)  # the scan's bound, reached at once
    assert holders([P1], proc=proc) == {P1: [Holder(P1, os.getuid(), True)]}
    assert Holder(P1, 4_000_000_000, True).describe() == f"{P1} held by uid 4000000000"


@pytest.mark.parametrize(
    "tcp",
    [
        "",  # nothing holds it
        "\0\xff" * 500,  # garbage
        "   0: 0100007F:ZZZZ 00000000:0000 0A 0 0 0 0 0 x\n",  # fields that are not numbers
        "   0: 0100007F\n",  # too few fields
    ],
)
def test_a_proc_that_says_nonsense_gives_no_holder(tmp_path: Path, tcp: str) -> None:
    assert holders([P1], proc=fake_proc(tmp_path, tcp)) == {}


def test_no_proc_at_all_gives_no_holder(tmp_path: Path) -> None:
    assert holders([P1], proc=tmp_path / "none") == {}
    assert holders([], proc=tmp_path / "none") == {}


def test_this_process_is_found_holding_real_sockets() -> None:
    me = (os.getuid(), os.getpid(), process_name(os.getpid()))
    with socket.socket() as lis, socket.socket(socket.AF_INET6) as lis6, socket.socket() as bound:
        lis.bind(("127.0.0.1", 0))
        lis.listen()
        lis6.bind(("::1", 0))
        lis6.listen()
        bound.bind(("0.0.0.0", 0))
        ports = [s.getsockname()[1] for s in (lis, lis6, bound)]
        found = holders(ports)
        for port in ports[:2]:
            (h,) = found[port]
            assert (h.uid, h.pid, h.comm, h.listening) == (*me, True)
        # Bound only: netlink names it from Linux 6.9 on; before, nothing does.
        assert found.get(ports[2], [Holder(ports[2], me[0], False, me[1], me[2])]) == [
            Holder(ports[2], me[0], False, me[1], me[2])
        ]
        assert holders(ports, listening_only=True).keys() == set(ports[:2])
