"""Where a notification may go: every address of this host, metadata services and addresses
of no single host are refused, in every form that leads there, at submission (422, one CLI
line) and at delivery, which connects to the address it checked."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient

from ddpq import notify_target
from ddpq.core.notify_address import METADATA, NOT_A_HOST
from ddpq.daemon import webhook
from ddpq.notify_target import OWN, refused_address
from tests.helpers import Daemon
from tests.inprocess import client_with_gpus
from tests.stub_api import serve_in_thread

SIOCGIFADDR = 0x8915
SIOCGIFBRDADDR = 0x8919


def _ioctl_ipv4(sock: socket.socket, request: int, name: str) -> str | None:
    try:
        answer = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:  # no IPv4 address on it, or no broadcast
        return None
    return socket.inet_ntoa(answer[20:24])


def own_addresses() -> list[str]:
    """This host's addresses but loopback, found apart from the code under test: each
    interface's IPv4 address and broadcast address (ioctl), and its global IPv6 ones."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            for request in (SIOCGIFADDR, SIOCGIFBRDADDR):
                address = _ioctl_ipv4(s, request, name)
                if address and not address.startswith(("127.", "0.")):
                    found.append(address)
    with open("/proc/net/if_inet6", encoding="ascii") as f:
        for line in f:
            v6 = ipaddress.IPv6Address(int(line.split()[0], 16))
            if not (v6.is_loopback or v6.is_link_local):
                found.append(str(v6))
    return sorted(set(found))


OWN_ADDRESSES = own_addresses()
needs_an_address = pytest.mark.skipif(not OWN_ADDRESSES, reason="no address but loopback")


# ---- by address ------------------------------------------------------------------------------

REFUSED = {
    # cloud metadata and platform services, and the forms that lead to them
    "169.254.169.254": None,
    "fd00:ec2::254": METADATA,
    "fd00:ec2::23": METADATA,
    "fd20:ce::254": METADATA,
    "100.100.100.200": METADATA,
    "168.63.129.16": METADATA,
    "192.0.0.192": METADATA,
    "169.254.170.2": None,
    "::ffff:169.254.169.254": None,
    "::ffff:100.100.100.200": METADATA,
    "2002:6464:64c8::1": METADATA,  # 6to4 of 100.100.100.200
    "64:ff9b::a9fe:a9fe": None,  # NAT64 of 169.254.169.254
    # no single host: unspecified, "this network", broadcast, reserved, multicast, …
    "0.0.0.0": NOT_A_HOST,
    "0.1.2.3": NOT_A_HOST,
    "0.255.255.255": NOT_A_HOST,
    "255.255.255.255": NOT_A_HOST,
    "240.0.0.1": NOT_A_HOST,
    "::": NOT_A_HOST,
    "::ffff:0.0.0.0": NOT_A_HOST,
    "64:ff9b::0.1.2.3": NOT_A_HOST,  # NAT64 of 0.x
    "2001:0:4136:e378:8000:63bf:ffff:ffff": NOT_A_HOST,  # Teredo, client 0.0.0.0
    "224.0.0.1": NOT_A_HOST,
    "ff02::1": NOT_A_HOST,
    "fe80::1%eth0": NOT_A_HOST,
    "fec0::1": NOT_A_HOST,
    "100::1": NOT_A_HOST,
}


@pytest.mark.parametrize(("address", "why"), REFUSED.items())
@pytest.mark.parametrize("allow_loopback", [False, True])
def test_metadata_and_addresses_of_no_host_are_refused_whatever_the_admin_allows(
    address: str, why: str | None, allow_loopback: bool
) -> None:
    got = refused_address(address, allow_loopback)
    assert got is not None, address
    assert why is None or got == why


LOOPBACK_FORMS = ["127.0.0.1", "127.8.9.1", "::1", "::ffff:127.0.0.1", "64:ff9b::7f00:1"]
LOOPBACK_FORMS += ["2002:7f00:1::1", "2001:0:4136:e378:8000:63bf:80ff:fffe"]  # 6to4, Teredo


@pytest.mark.parametrize("address", LOOPBACK_FORMS)
def test_loopback_in_any_form_is_refused_unless_the_admin_allows_it(address: str) -> None:
    assert refused_address(address, allow_loopback=False) is not None
    assert refused_address(address, allow_loopback=True) is None


ALLOWED = ["8.8.8.8", "198.51.100.7", "100.64.255.7", "10.255.254.253", "172.31.250.9"]
ALLOWED += ["2001:db8:ffff::1", "fd12:3456:789a::1", "::ffff:8.8.8.8", "64:ff9b::808:808"]
ALLOWED += ["2002:808:808::1"]


@pytest.mark.parametrize("address", ALLOWED)
def test_other_hosts_public_or_private_are_allowed(address: str) -> None:
    assert refused_address(address, allow_loopback=False) is None


def own_forms() -> list[str]:
    """Each own address, and the IPv6 forms that lead to an IPv4 one."""
    forms = []
    for address in OWN_ADDRESSES:
        forms.append(address)
        ip = ipaddress.ip_address(address)
        if ip.version == 4:
            forms += [f"::ffff:{ip}", str(ipaddress.IPv6Address((0x2002 << 112) | int(ip) << 80))]
    return forms


@needs_an_address
@pytest.mark.parametrize("nonlocal_bind", [False, True])
def test_every_address_of_this_host_is_refused_even_where_loopback_is_allowed(
    nonlocal_bind: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where any address can be bound (ip_nonlocal_bind), the addresses are read from /proc.
    monkeypatch.setattr(notify_target, "_nonlocal_bind", lambda version: nonlocal_bind)
    for form in own_forms():
        assert refused_address(form, allow_loopback=True) == OWN, form
    for address in ("198.51.100.7", "2001:db8:ffff::1"):
        assert refused_address(address, allow_loopback=False) is None


# ---- at delivery -----------------------------------------------------------------------------


@pytest.fixture
def everywhere() -> Iterator[list[bytes]]:
    """A receiver on every address of this host (another user's local server, say)."""
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    class DualStack(ThreadingHTTPServer):
        address_family = socket.AF_INET6

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    server = DualStack(("::", 0), Handler)
    server.daemon_threads = True
    got.append(str(server.server_address[1]).encode())  # the port, first
    thread = serve_in_thread(server)
    yield got
    server.shutdown()
    server.server_close()
    thread.join()


@needs_an_address
def test_a_receiver_on_this_hosts_other_addresses_is_never_reached(everywhere: list[bytes]) -> None:
    port = int(everywhere.pop(0))
    reached = webhook.post(f"http://127.0.0.1:{port}/", b"{}", timeout=5, allow_loopback=True)
    assert reached == (200, "") and len(everywhere) == 1  # it listens, and loopback reaches it
    for address in OWN_ADDRESSES:
        host = f"[{address}]" if ":" in address else address
        status, why = webhook.post(f"http://{host}:{port}/", b"{}", timeout=5, allow_loopback=True)
        assert status is None and OWN in why, (address, why)
    assert len(everywhere) == 1


def test_delivery_connects_to_the_address_it_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name is looked up once: a second answer (rebinding to this host) is never used."""
    answers = iter(["198.51.100.7", "127.0.0.1"])
    lookups: list[str] = []
    connected: list[Any] = []
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:  # no lookup: is it an address?
            return real_getaddrinfo(host, port, **kwargs)
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    def connect(self: socket.socket, address: Any) -> None:
        connected.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    assert webhook.post("http://hook.lab.example/x", b"{}", timeout=2, allow_loopback=False) == (
        None,
        "connection refused",
    )
    assert lookups == ["hook.lab.example"] and connected == [("198.51.100.7", 80)]


# ---- at submission ---------------------------------------------------------------------------

SECRET = "T0-B0-SECRET"
REFUSED_AT_SUBMISSION = [
    "http://127.0.0.1:8765/",
    "http://127.1/",  # forms the resolver reads as loopback
    "http://2130706433/",
    "http://0x7f.0.0.1/",
    "http://[::1]:8765/",
    "http://[::ffff:127.0.0.1]/",
    "http://localhost:8765/",
    "http://LocalHost./",
    "http://app.localhost/",
    "http://0.0.0.0:8765/",
    "http://0.1.2.3/",
    "http://[::]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.GOOGLE.INTERNAL./",
    "http://224.0.0.1/",
    "http://255.255.255.255/",
    "http://nothing-here.invalid/",  # does not resolve: refused, with the reason
]


def submission(url: str) -> dict[str, Any]:
    return {"command": ["true"], "notify": f"{url.rstrip('/')}/hooks/{SECRET}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", gpus=2)


def refused_with(r: httpx2.Response, *words: str) -> str:
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("notify: ") and SECRET not in detail, detail
    assert all(w in detail for w in words), detail
    return str(detail)


@pytest.mark.parametrize("url", REFUSED_AT_SUBMISSION)
def test_a_url_that_leads_nowhere_allowed_is_refused_at_submission(
    api: TestClient, url: str
) -> None:
    refused_with(api.post("/v1/jobs", json=submission(url)))
    sweep = {"template": submission(url), "array": "0-2"}
    refused_with(api.post("/v1/sweeps", json=sweep))
    assert api.get("/v1/jobs").json()["total"] == 0


@needs_an_address
def test_this_hosts_own_addresses_are_refused_at_submission_even_with_loopback_allowed(
    tmp_path: Path,
) -> None:
    for c in client_with_gpus(tmp_path / "home", gpus=1, notify_allow_loopback=True):
        assert c.post("/v1/jobs", json=submission("http://127.0.0.1:9/")).status_code == 201
        for address in OWN_ADDRESSES:
            host = f"[{address}]" if ":" in address else address
            refused_with(c.post("/v1/jobs", json=submission(f"http://{host}:9/")), OWN)


def test_a_url_to_another_host_is_taken_at_submission(api: TestClient) -> None:
    for url in ("http://198.51.100.7:8065/", "https://[2001:db8:ffff::1]/"):
        assert api.post("/v1/jobs", json=submission(url)).status_code == 201


def test_the_cli_says_why_in_one_line(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1")
    for url in ("http://169.254.169.254/", "http://[fd00:ec2::254]/", "http://0.0.0.0:8765/"):
        r = d.cli("submit", "--notify", f"{url}{SECRET}", "--", "true", check=False)
        assert r.returncode != 0 and SECRET not in r.stdout + r.stderr
        lines = (r.stdout + r.stderr).strip().splitlines()
        assert len(lines) == 1 and "notify: refused" in lines[0], lines


def test_a_submission_cannot_allow_loopback_for_itself(api: TestClient) -> None:
    """The allowance is the admin's (a daemon setting): no field of a body turns it on."""
    body = {**submission("http://127.0.0.1:9/"), "notify_allow_loopback": True}
    assert api.post("/v1/jobs", json=body).status_code == 422
    refused_with(api.post("/v1/jobs", json=submission("http://127.0.0.1:9/")), "loopback")
