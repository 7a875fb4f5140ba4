"""Identity from the Unix socket, in-process: who a caller of the socket is, what it may do,
and the tokens an account makes for itself there (issue 17).

The app runs behind a TestClient on a real, migrated database; a request "arrives on the
socket" when the test names a uid for it: ``on_socket`` then wraps the app for that request
as the protocol wraps it for a connection (``server.peer.with_peer``). The real socket, real
accounts and jobs running as them: tests/test_local_users.py.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from ddpq.config import Settings
from ddpq.server.peer import PeerCredentials, peer_of, read_peer_credentials, with_peer
from ddpq.store import tokens as token_store
from ddpq.store.db import Database
from tests.helpers import wait_for
from tests.inprocess import BASE, lent_app, publish_fake_gpus
from tests.template_db import migrated

PEER_UID = b"x-test-peer-uid"  # this test's own marker, turned into credentials below
NOBODY = pwd.getpwnam("nobody")
NOBODY_GROUP = grp.getgrgid(NOBODY.pw_gid).gr_name


def _other_account() -> pwd.struct_passwd:
    """An account that is neither nobody, root, nor the one running the tests."""
    for entry in pwd.getpwall():
        if entry.pw_uid not in (0, NOBODY.pw_uid, os.geteuid()) and entry.pw_name.isalnum():
            return entry
    pytest.skip("no second ordinary account in the password database")


def on_socket(app: ASGIApp) -> ASGIApp:
    """The app, with each request that carries ``PEER_UID`` arriving as if on the socket."""

    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            uid = dict(scope["headers"]).get(PEER_UID)
            if uid is not None:
                peer = PeerCredentials(pid=1, uid=int(uid), gid=0)
                await with_peer(app, peer)(scope, receive, send)
                return
        await app(scope, receive, send)

    return routed


Make = Callable[..., TestClient]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    with contextlib.ExitStack() as opened:  # clients closed first, then their apps given back

        def build(**settings: Any) -> TestClient:
            config = Settings(home=tmp_path / "home", fake_gpus=2, **settings)
            migrated(config.db_path)
            publish_fake_gpus(config.db_path, 2, memory_mb=1000)
            app = on_socket(opened.enter_context(lent_app(config)))
            client = TestClient(app, base_url=BASE, raise_server_exceptions=False)
            return opened.enter_context(client)

        yield build


def as_uid(uid: int, **headers: str) -> dict[str, str]:
    return {PEER_UID.decode(): str(uid), **headers}


def submit(c: TestClient, headers: dict[str, str], **body: Any) -> httpx2.Response:
    response: httpx2.Response = c.post(
        "/v1/jobs", json={"command": ["true"], "cwd": "/", **body}, headers=headers
    )
    return response


def run_as_of(home: Path, job_id: int) -> str | None:
    with sqlite3.connect(home / "ddpq.db") as conn:
        row = conn.execute("SELECT run_as FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return None if row is None else row[0]


# ---- who the socket's caller is --------------------------------------------------------------


@pytest.mark.parametrize("auth", [True, False])
def test_the_socket_caller_is_its_account_whatever_the_request_says(
    make: Make, tmp_path: Path, auth: bool
) -> None:
    c = make(auth=auth, shared_account=True)
    forged = as_uid(NOBODY.pw_uid, **{"X-Ddpq-User": "root", "Authorization": "Bearer ddpq_forged"})
    me = c.get("/v1/whoami", headers=forged).json()
    assert (me["name"], me["via"], me["account"], me["uid"]) == (
        "nobody",
        "socket",
        "nobody",
        NOBODY.pw_uid,
    )
    r = submit(c, forged, owner="root")
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == "nobody"  # neither the header nor the body's owner
    assert run_as_of(tmp_path / "home", r.json()["id"]) == "nobody"


def test_over_tcp_the_socket_is_no_identity(make: Make) -> None:
    """Without --auth a TCP caller is still whoever it names; the socket's marker is no
    header a client can send to be someone (the scope carries it, never a header)."""
    c = make()
    r = c.get("/v1/whoami", headers={"X-Ddpq-User": "alice"})
    assert (r.json()["name"], r.json()["via"], r.json()["account"]) == ("alice", "header", None)
    assert c.get("/v1/whoami").json()["via"] == "anonymous"


def test_a_uid_without_an_account_name_is_refused(make: Make) -> None:
    c = make(auth=True, shared_account=True)
    taken = {e.pw_uid for e in pwd.getpwall()}
    stranger = next(uid for uid in range(54321, 60000) if uid not in taken)
    r = c.get("/v1/whoami", headers=as_uid(stranger))
    assert r.status_code == 403 and f"uid {stranger} has no account" in r.json()["detail"]


def test_only_owners_and_the_admin_group_act_on_jobs(make: Make) -> None:
    other = _other_account()
    c = make(auth=True, shared_account=True, admin_group=NOBODY_GROUP)
    mine = submit(c, as_uid(other.pw_uid), hold=True).json()["id"]
    nobodys = submit(c, as_uid(NOBODY.pw_uid), hold=True).json()["id"]
    refused = c.post(f"/v1/jobs/{nobodys}/cancel", headers=as_uid(other.pw_uid))
    assert refused.status_code == 403 and "belongs to nobody" in refused.json()["detail"]
    assert c.get("/v1/whoami", headers=as_uid(other.pw_uid)).json()["admin"] is False
    # nobody's primary group is the admin group: an admin, who may cancel another's job.
    assert c.get("/v1/whoami", headers=as_uid(NOBODY.pw_uid)).json()["admin"] is True
    assert c.post(f"/v1/jobs/{mine}/cancel", headers=as_uid(NOBODY.pw_uid)).status_code == 200
    # The daemon's own account (here the test's) is always an admin.
    assert c.get("/v1/whoami", headers=as_uid(os.geteuid())).json()["admin"] is True


def test_without_an_admin_group_only_root_and_the_daemons_account_are_admins(
    make: Make,
) -> None:
    c = make(auth=True, shared_account=True, admin_group="none")
    assert c.get("/v1/whoami", headers=as_uid(NOBODY.pw_uid)).json()["admin"] is False
    assert c.get("/v1/whoami", headers=as_uid(0)).json()["admin"] is True


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": BASE},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Mode": "navigate"},
        {"Sec-Fetch-Dest": "document"},
    ],
)
def test_what_only_browsers_send_is_refused_on_the_socket(
    make: Make, headers: dict[str, str]
) -> None:
    c = make(auth=True, shared_account=True)
    for method, path in (("GET", "/v1/whoami"), ("POST", "/v1/jobs/1/cancel"), ("GET", "/")):
        r = c.request(method, path, headers=as_uid(NOBODY.pw_uid, **headers))
        assert r.status_code == 403 and r.json()["code"] == "browser", (method, path)
    # Over TCP a page of this very origin may still use the API (with its token).
    assert c.get("/v1/whoami", headers=headers).status_code == 401


def test_the_socket_has_no_address_and_takes_any_host_name(make: Make) -> None:
    """`curl --unix-socket S http://ddpq/...`: no browser reaches a socket by a name, so
    the names that guard TCP against DNS rebinding guard nothing there (issue 26)."""
    c = make(auth=True, shared_account=True)
    for host in ("localhost", "127.0.0.1", "[::1]", "ddpq", "evil.example", "x:1"):
        r = c.get("/v1/whoami", headers=as_uid(NOBODY.pw_uid, Host=host))
        assert r.status_code == 200, (host, r.text)
    # Over TCP a name that is not this daemon's is still refused, before any token.
    r = c.get("/v1/whoami", headers={"Host": "evil.example"})
    assert r.status_code == 403 and r.json()["code"] == "bad_host"
    # And on the socket, a browser's request is refused whatever its Host.
    r = c.get(
        "/v1/whoami", headers=as_uid(NOBODY.pw_uid, Host="ddpq", **{"Sec-Fetch-Mode": "cors"})
    )
    assert r.status_code == 403 and r.json()["code"] == "browser"


# ---- tokens an account makes for itself -----------------------------------------------------


def make_token(c: TestClient, uid: int, **body: Any) -> httpx2.Response:
    response: httpx2.Response = c.post("/v1/tokens", json=body, headers=as_uid(uid))
    return response


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_token_made_on_the_socket_is_its_account_over_tcp_until_revoked(
    make: Make, tmp_path: Path
) -> None:
    c = make(auth=True, shared_account=True, admin_group="none")
    made = make_token(c, NOBODY.pw_uid, expires_s=3600, note="laptop")
    assert made.status_code == 201, made.text
    token = made.json()
    assert token["token"].startswith("ddpq_") and token["owner"] == "nobody"
    assert token["token"].encode() not in (tmp_path / "home" / "ddpq.db").read_bytes()
    me = c.get("/v1/whoami", headers=bearer(token["token"])).json()
    assert (me["name"], me["via"], me["admin"], me["token"]["id"]) == (
        "nobody",
        "account_token",
        False,
        token["id"],
    )
    listed = c.get("/v1/tokens", headers=bearer(token["token"])).json()["items"]
    assert [(t["id"], t["note"], t["expired"]) for t in listed] == [(token["id"], "laptop", False)]
    assert "token" not in listed[0]  # the secret is shown once
    # A token cannot make another (that would outlive its expiry).
    again = c.post("/v1/tokens", json={}, headers=bearer(token["token"]))
    assert again.status_code == 403 and "through its Unix socket" in again.json()["detail"]
    revoked = c.post(f"/v1/tokens/{token['id']}/revoke", headers=bearer(token["token"]))
    assert revoked.status_code == 200
    gone = c.get("/v1/whoami", headers=bearer(token["token"]))
    assert gone.status_code == 401 and gone.json()["detail"] == "unknown token"


def test_an_expired_token_stops_working(make: Make) -> None:
    c = make(auth=True, shared_account=True)
    token = make_token(c, NOBODY.pw_uid, expires_s=1).json()
    assert c.get("/v1/whoami", headers=bearer(token["token"])).status_code == 200

    def refused() -> httpx2.Response | None:
        r: httpx2.Response = c.get("/v1/whoami", headers=bearer(token["token"]))
        return r if r.status_code == 401 else None

    r = wait_for(refused, 10, "the token to expire")
    assert f"token {token['id']} expired" in r.json()["detail"]
    listed = c.get("/v1/tokens", headers=as_uid(NOBODY.pw_uid)).json()["items"]
    assert [t["expired"] for t in listed] == [True]


def test_a_token_stops_working_when_its_name_means_another_uid(make: Make, tmp_path: Path) -> None:
    c = make(auth=True, shared_account=True)
    with Database(tmp_path / "home" / "ddpq.db").write() as s:
        # As if nobody had been removed and made again under another uid.
        _, secret = token_store.create_token(
            s, "nobody", NOBODY.pw_uid + 1, expires_at=time.time() + 60, note=None, now=time.time()
        )
    r = c.get("/v1/whoami", headers=bearer(secret))
    assert r.status_code == 401 and "no longer exists" in r.json()["detail"]


def test_tokens_are_listed_and_revoked_by_their_owner_or_an_admin(make: Make) -> None:
    other = _other_account()
    c = make(auth=True, shared_account=True, admin_group=NOBODY_GROUP)
    theirs = make_token(c, other.pw_uid).json()
    nobodys = make_token(c, NOBODY.pw_uid).json()
    assert [t["id"] for t in c.get("/v1/tokens", headers=as_uid(other.pw_uid)).json()["items"]] == [
        theirs["id"]
    ]
    everyone = c.get("/v1/tokens", params={"all": "true"}, headers=as_uid(other.pw_uid))
    assert everyone.status_code == 403
    not_yours = c.post(f"/v1/tokens/{nobodys['id']}/revoke", headers=as_uid(other.pw_uid))
    assert not_yours.status_code == 404  # another's token reads as none
    assert c.get("/v1/whoami", headers=bearer(nobodys["token"])).status_code == 200
    admin_view = c.get("/v1/tokens", params={"all": "true"}, headers=as_uid(NOBODY.pw_uid))
    assert {t["owner"] for t in admin_view.json()["items"]} == {other.pw_name, "nobody"}
    by_admin = c.post(f"/v1/tokens/{theirs['id']}/revoke", headers=as_uid(NOBODY.pw_uid))
    assert by_admin.status_code == 200
    assert c.get("/v1/whoami", headers=bearer(theirs["token"])).status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"expires_s": 0},
        {"expires_s": -5},
        {"expires_s": 366 * 86400},
        {"expires_s": "90d"},
        {"expires_s": True},
        {"expires_s": None},
        {"note": ""},
        {"note": "a b"},
        {"note": "x" * 65},
        {"note": 7},
        {"owner": "root"},
    ],
)
def test_a_bad_token_request_is_422(make: Make, body: dict[str, Any]) -> None:
    c = make(auth=True, shared_account=True)
    headers = as_uid(NOBODY.pw_uid, **{"Content-Type": "application/json"})
    r = c.post("/v1/tokens", content=json.dumps(body), headers=headers)
    assert r.status_code == 422, r.text


def test_tokens_need_auth_and_an_account_other_than_root(make: Make) -> None:
    assert make_token(make(auth=True, shared_account=True), 0).status_code == 403
    no_auth = make_token(make(), NOBODY.pw_uid)
    assert no_auth.status_code == 409 and "without --auth" in no_auth.json()["detail"]


def test_an_account_holds_a_bounded_number_of_tokens(make: Make) -> None:
    c = make(auth=True, shared_account=True)
    for _ in range(token_store.MAX_PER_ACCOUNT):
        assert make_token(c, NOBODY.pw_uid, expires_s=60).status_code == 201
    r = make_token(c, NOBODY.pw_uid, expires_s=60)
    assert r.status_code == 409 and "revoke some" in r.json()["detail"]


def test_an_accounts_token_submits_over_tcp_only_where_the_admin_allows_it(
    make: Make, tmp_path: Path
) -> None:
    # As root (the worker would switch accounts), without and then with remote_accounts.
    for allowed in (False, True):
        c = make(auth=True, remote_accounts=allowed)
        token = make_token(c, NOBODY.pw_uid).json()["token"]
        r = submit(c, bearer(token))
        if os.geteuid() != 0:
            assert r.status_code == (201 if allowed else 403)  # validate() would refuse it
            continue
        if not allowed:
            assert r.status_code == 403 and "remote_accounts" in r.json()["detail"]
            assert c.get("/v1/whoami", headers=bearer(token)).json()["runs_as"] is None
            # It may still watch and cancel.
            assert c.get("/v1/jobs", headers=bearer(token)).status_code == 200
        else:
            assert r.status_code == 201, r.text
            assert run_as_of(tmp_path / "home", r.json()["id"]) == "nobody"
            assert c.get("/v1/whoami", headers=bearer(token)).json()["runs_as"] == "nobody"


# ---- the credentials themselves ------------------------------------------------------------


def test_peer_credentials_are_the_connecting_process(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            accepted, _ = server.accept()
            with accepted:
                peer = read_peer_credentials(accepted)
    assert peer == PeerCredentials(os.getpid(), os.getuid(), os.getgid())
    with socket.create_server(("127.0.0.1", 0)) as tcp:
        assert read_peer_credentials(tcp) is None  # TCP: no such thing
    assert read_peer_credentials(None) is None


def test_peer_of_reads_only_what_the_protocol_put_there() -> None:
    peer = PeerCredentials(1, 2, 3)
    assert peer_of({"type": "http", "extensions": {"ddpq.peer_credentials": peer}}) == peer
    assert peer_of({"type": "http"}) is None
    assert peer_of({"type": "http", "extensions": None}) is None
    # A look-alike is not credentials (nothing but the protocol makes PeerCredentials).
    assert peer_of({"type": "http", "extensions": {"ddpq.peer_credentials": (1, 0, 0)}}) is None


def test_a_proven_account_runs_jobs_only_under_a_portable_name(tmp_path: Path) -> None:
    from ddpq.server.deps import Caller, proven_account
    from ddpq.server.errors import ApiError

    auth = Settings(home=tmp_path, auth=True)
    for name in ("Alice", "al.ice", "9lives"):
        who = Caller(name, False, via="socket", account=name, uid=1001)
        with pytest.raises(ApiError) as refused:
            proven_account(who, auth)
        assert refused.value.status == 403 and "portable names" in refused.value.detail
        # Without --auth no job switches accounts: nothing to refuse.
        assert proven_account(who, Settings(home=tmp_path)) == name
    assert proven_account(Caller("alice", False, "socket", "alice", 1001), auth) == "alice"
    assert proven_account(Caller("alice", False, "user_token"), auth) is None


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_on_slurm_root_from_the_socket_is_refused_at_submission_and_others_run_as_themselves(
    make: Make, tmp_path: Path, executor: str
) -> None:
    """The Slurm executor submits each job as the account it runs as, never as root (Slurm
    would run it as root on every node): root's own submission is refused with the reason
    now, not failed at launch; any other account's is stored to be submitted as it."""
    c = make(auth=True, shared_account=True, executor=executor)
    refused = submit(c, as_uid(0))
    me = c.get("/v1/whoami", headers=as_uid(0)).json()
    if executor == "slurm":
        assert refused.status_code == 403, refused.text
        assert "never submits a Slurm job as root" in refused.json()["detail"]
        assert me["runs_as"] is None and "as root" in me["runs_no_job"]
    else:
        assert refused.status_code == 201, refused.text  # a local job may run as root
        assert "runs_no_job" not in me
    r = submit(c, as_uid(NOBODY.pw_uid))
    assert r.status_code == 201, r.text
    assert run_as_of(tmp_path / "home", r.json()["id"]) == "nobody"
    assert c.get("/v1/whoami", headers=as_uid(NOBODY.pw_uid)).json()["runs_as"] in (
        "nobody",
        pwd.getpwuid(os.geteuid()).pw_name,  # a daemon not run as root runs all as itself
    )


def test_whoami_gives_the_reason_a_job_would_not_run_before_any_mapping() -> None:
    from ddpq.client.whoami import describe

    me = {"name": "root", "admin": True, "via": "socket", "account": "root", "uid": 0}
    lines = describe({**me, "runs_as": None, "runs_no_job": "never as root\x1b[2J"}, "unix:/s")
    assert lines[-1] == "jobs would not run: never as root\\x1b[2J"  # made printable
    assert describe({**me, "runs_as": "root"}, "unix:/s")[-1] == "jobs run as root"
