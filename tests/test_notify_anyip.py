"""IPv6 addresses this host takes in through a local route (AnyIP: ``ip -6 route add local
2001:db8:99::/64 dev lo``) are its own: a notification may not go there, though no socket
can bind them (a connection to one reaches whoever listens on ``::``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpq import notify_target
from ddpq.notify_target import OWN, ipv6_local_routes, refused_address

# /proc/net/ipv6_route as Linux 6.18 wrote it in a namespace with 2001:db8:77::1/64 on lo,
# forwarding on (hence the anycast route of its subnet), `ip -6 route add local
# 2001:db8:99::/64 dev lo table local`, `ip -6 route add local 2001:db8:aa::/48 dev lo`
# (the local table too) and `ip -6 route add 2001:db8:bb::/64 dev lo` (an ordinary route).
IPV6_ROUTE = """\
20010db8007700000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00200200       lo
20010db800bb00000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000002 00000000 00200200       lo
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001       lo
20010db8007700000000000000000000 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 00300001       lo
20010db8007700000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
20010db8009900000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000003 00000000 80000001       lo
20010db800aa00000000000000000000 30 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 80000001       lo
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
"""  # noqa: E501

LOCAL_NETWORKS = {"::1/128", "2001:db8:77::/128", "2001:db8:77::1/128"}
LOCAL_NETWORKS |= {"2001:db8:99::/64", "2001:db8:aa::/48"}


def test_the_local_and_anycast_routes_are_read_and_no_other() -> None:
    got = {str(n) for n in ipv6_local_routes(IPV6_ROUTE.splitlines())}
    assert got == LOCAL_NETWORKS


INSIDE = ["2001:db8:99::", "2001:db8:99::5", "2001:db8:99:0:ffff:ffff:ffff:ffff"]
INSIDE += ["2001:db8:aa::1", "2001:db8:aa:ffff::7", "2001:db8:77::"]
OUTSIDE = ["2001:db8:99:1::5", "2001:db8:ab::1", "2001:db8:bb::1", "2001:db8:77::2"]


@pytest.mark.parametrize("nonlocal_bind", [False, True])
def test_every_address_of_a_local_route_is_refused_as_this_hosts_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nonlocal_bind: bool
) -> None:
    routes = tmp_path / "ipv6_route"
    routes.write_text(IPV6_ROUTE, encoding="ascii")
    monkeypatch.setattr(notify_target, "_IPV6_ROUTE", str(routes))
    monkeypatch.setattr(notify_target, "_nonlocal_bind", lambda version: nonlocal_bind)
    for address in INSIDE:
        assert refused_address(address, allow_loopback=True) == OWN, address
    for address in OUTSIDE:
        assert refused_address(address, allow_loopback=False) is None, address


# Run in a network namespace of its own: an AnyIP route, a listener on [::], and what
# the check says of addresses a connection from here reaches.
IN_A_NAMESPACE = textwrap.dedent(
    """
    import socket, subprocess
    from ddpq.notify_target import refused_address
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-6", "route", "add", "local", "2001:db8:99::/64", "dev", "lo"],
                   check=True)
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::", 0))
    listener.listen(8)
    for address in ("2001:db8:99::5", "2001:db8:99::ffff:1"):
        with socket.create_connection((address, listener.getsockname()[1]), timeout=5):
            print(address, refused_address(address, False))
    """
)


def _namespace_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root, to make a network namespace"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare -n: {probe.stderr.decode().strip()}"


def test_a_local_route_of_a_real_namespace_is_refused_where_a_connection_reaches_it() -> None:
    why = _namespace_unavailable()
    if why is not None:
        pytest.skip(why)
    r = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", IN_A_NAMESPACE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == [f"{a} {OWN}" for a in ("2001:db8:99::5", "2001:db8:99::ffff:1")], lines
