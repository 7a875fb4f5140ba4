"""The API at its door: what a careless or hostile client sends is refused with one clear 4xx.

Most checks run the app in-process (FastAPI's TestClient on a real, migrated database file:
``tests.inprocess``); the ones about processes, the CLI or real storage faults run a daemon.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from fastapi.testclient import TestClient

from ddpq.core.spec import JobSpec
from ddpq.schemas import CWD_PATTERN, NAME_PATTERN, NAME_RE, JobSubmit, derive_name
from ddpq.server import guard, paths
from ddpq.store import jobs as job_store
from ddpq.store import users as user_store
from ddpq.store.db import Database
from tests.helpers import Answer, Daemon, wait_done, wait_state
from tests.inprocess import BASE, lent_client, publish_fake_gpus

INT64_MAX = 2**63 - 1


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    with lent_client(home, fake_gpus=2) as c:
        assert (home / "ddpq.db").exists()  # lent_client migrated a real database
        publish_fake_gpus(home / "ddpq.db", 2, memory_mb=1000)
        yield c


def post_json(c: TestClient, path: str, body: Any, **headers: str) -> httpx2.Response:
    """POST ``body`` as JSON text exactly as given (json.dumps keeps "\\ud800" escapes)."""
    return c.post(
        path, content=json.dumps(body), headers={"Content-Type": "application/json", **headers}
    )


def assert_error(r: Answer, status: int, code: str, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"detail", "code"} and body["code"] == code, body
    for word in words:
        assert word in body["detail"], (word, body)


# ---- item 2: strings that cannot be encoded ----------------------------------------

UNENCODABLE = ["\ud800", "a\udfffb", "\udc80\ud800"]
SUBMISSIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    "command[0]": lambda bad: {"command": [bad]},
    "command[1]": lambda bad: {"command": ["echo", bad]},
    "args": lambda bad: {"workload": "resnet18", "args": ["--epochs", bad]},
    "workload": lambda bad: {"workload": bad},
    "env key": lambda bad: {"command": ["true"], "env": {bad: "1"}},
    "env value": lambda bad: {"command": ["true"], "env": {"K": bad}},
    "name": lambda bad: {"command": ["true"], "name": bad},
    "cwd": lambda bad: {"command": ["true"], "cwd": "/tmp/" + bad},
    "owner": lambda bad: {"command": ["true"], "owner": bad},
}


@pytest.mark.parametrize("bad", UNENCODABLE, ids=ascii)
@pytest.mark.parametrize("field", sorted(SUBMISSIONS))
def test_unencodable_strings_are_refused_before_they_are_stored(
    api: TestClient, field: str, bad: str
) -> None:
    r = post_json(api, "/v1/jobs", SUBMISSIONS[field](bad))
    assert_error(r, 422, "invalid")
    listed = api.get("/v1/jobs")
    assert listed.status_code == 200 and listed.json()["total"] == 0  # nothing was stored
    assert api.get("/healthz").json()["jobs"] == {}


@pytest.mark.parametrize(
    "value", [b"\xed\xa0\x80", b"al\xffice", "ålice".encode("latin-1")], ids=repr
)
def test_a_user_header_that_is_not_utf8_is_refused(api: TestClient, value: bytes) -> None:
    r = api.post("/v1/jobs", json={"command": ["true"]}, headers={b"X-Ddpq-User": value})
    assert_error(r, 422, "invalid", "X-Ddpq-User")
    assert api.get("/v1/jobs").json()["total"] == 0


def test_rows_stored_before_the_check_still_list(api: TestClient, home: Path) -> None:
    """Old rows (and job progress) holding lone surrogates in JSON columns: every view
    still answers, with U+FFFD in their place, instead of a 500 for every user."""
    db = Database(home / "ddpq.db")
    with db.write() as s:
        spec = JobSpec(
            name="old",
            owner="alice",
            command=["echo", "x\ud800y"],
            cwd="/tmp",
            gpus=0,
            env={"K": "\udfff"},
        )
        job = job_store.get_job(s, job_store.create_job(s, spec, time.time()).id)
        job_store.set_progress(s, job, {"phase\ud800": ["\udc80", {"k": "v\ud800"}]})
        job_id = job.id
    db.dispose()
    listed = api.get("/v1/jobs")
    assert listed.status_code == 200, listed.text
    item = listed.json()["items"][0]
    assert item["command"] == ["echo", "x\ufffdy"]
    assert item["progress"] == {"phase\ufffd": ["\ufffd", {"k": "v\ufffd"}]}
    # What the page loads, and the other views of the job.
    for path in ("/v1/jobs?state=queued&limit=1000", f"/v1/jobs/{job_id}", "/v1/devices"):
        assert api.get(path).status_code == 200, path
    cancelled = api.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"


# ---- item 9: requests a page of another site could make a browser send --------------

FOREIGN_HOSTS = [
    "evil.example",
    "evil.example:8765",
    "127.0.0.1.evil.example",
    "localhost.evil.example:8765",
    "10.11.12.13:8765",
    "a@127.0.0.1:8765",
    "127.0.0.1:8765/x",
    "",
    "[::1",
]


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_foreign_host_is_refused(api: TestClient, host: str, method: str) -> None:
    """DNS rebinding: the attacker's name, pointed at 127.0.0.1, arrives as the Host."""
    if method == "GET":
        r = api.get("/v1/jobs", headers={"Host": host})
    else:
        r = post_json(api, "/v1/jobs", {"command": ["true"]}, Host=host)
    assert_error(r, 403, "bad_host", "Host")
    assert api.get("/v1/jobs").json()["total"] == 0


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8765", "localhost", "LOCALHOST:8765", "127.9.9.9", "[::1]:8765", "gpu-box.lab"],
)
def test_the_daemons_own_names_pass(home: Path, host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPQ_ALLOWED_HOSTS", "gpu-box.lab, other.lab")
    with lent_client(home) as c:
        assert c.get("/v1/jobs", headers={"Host": host}).status_code == 200
        assert c.get("/healthz", headers={"Host": socket.gethostname()}).status_code == 200


FOREIGN_ORIGINS = [
    "http://evil.example",
    "http://127.0.0.1.evil.example:8765",
    "http://127.0.0.1:9999",
    "http://localhost:8765",  # same machine, but another origin than the page's Host
    "null",
    "file://",
    "chrome-extension://abcdef",
    "http://127.0.0.1:8765/path",
]


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
@pytest.mark.parametrize("what", ["submit", "cancel", "read"])
def test_a_page_of_another_origin_is_refused(api: TestClient, origin: str, what: str) -> None:
    queued = api.post("/v1/jobs", json={"command": ["true"], "hold": True}).json()["id"]
    headers = {"Origin": origin}
    if what == "submit":
        r = post_json(api, "/v1/jobs", {"command": ["true"]}, **headers)
    elif what == "cancel":
        r = api.post(f"/v1/jobs/{queued}/cancel", headers=headers)
    else:
        r = api.get("/v1/jobs", headers=headers)
    assert_error(r, 403, "cross_origin", origin)
    assert api.get(f"/v1/jobs/{queued}").json()["state"] == "held"
    assert api.get("/v1/jobs").json()["total"] == 1


def test_the_same_origin_passes(api: TestClient) -> None:
    # The page and what its script fetches (same-origin GETs, no Origin header).
    for path in ("/", "/static/app.js", "/v1/jobs?limit=1000&state=running", "/v1/whoami"):
        assert api.get(path, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    r = post_json(api, "/v1/jobs", {"command": ["true"], "hold": True}, Origin=BASE)
    assert r.status_code == 201
    assert api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers={"Origin": BASE}).is_success


# Bodies that are not JSON, each as a client could send it; and the words that say why.
NOT_JSON = {
    b'{"command": ["true"]': "not valid JSON: Expecting ',' delimiter (at character 20)",
    b'{"command": ["tr': "not valid JSON: Unterminated string starting at character 13",
    b'{"command": ["true"],}': "not valid JSON",
    b'{"command": ["true"]} and more': "not valid JSON",
    b"{'command': ['true']}": "not valid JSON",
    b'{"command": ["\xff"]}': "not UTF-8 (byte 0xff at 14)",
    b'\xfe\xff{"command": ["true"]}': "not UTF-8",
    b'{"command": ["tr\xc3"]}': "not UTF-8",
    b'{"command": ["\xed\xa0\x80"]}': "lone surrogate",  # a surrogate, encoded as UTF-8
    b"": "Field required",
    # Past json.loads' own limits: Python's 4300 digits of an integer, and its recursion.
    b'{"command": ["true"], "time_limit_s": ' + b"9" * 5000 + b"}": "a number too long",
    b"[" * 100_000: "nested too deeply",
}


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/sweeps"])
@pytest.mark.parametrize("body", list(NOT_JSON), ids=lambda body: repr(body[:40]))
def test_a_body_that_is_not_json_is_a_422_saying_why(
    api: TestClient, body: bytes, route: str
) -> None:
    r = api.post(route, content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 422, "invalid", NOT_JSON[body] if route == "/v1/jobs" else "")
    assert api.get("/v1/jobs").json()["total"] == 0


FORM_TYPES = [
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/octet-stream",
    "",
]


@pytest.mark.parametrize("content_type", FORM_TYPES)
@pytest.mark.parametrize("body", [b'{"command": ["true"]}', b"command=true", b""], ids=len)
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/{id}/cancel", "/v1/jobs/{id}/hold"])
def test_writes_take_json_only(api: TestClient, content_type: str, body: bytes, path: str) -> None:
    """What an HTML form (or a fetch without a preflight) can post is refused: 415."""
    held = api.post("/v1/jobs", json={"command": ["true"], "hold": True}).json()["id"]
    r = api.post(path.format(id=held), content=body, headers={"Content-Type": content_type})
    assert_error(r, 415, "unsupported_media_type", "JSON")
    assert api.get("/v1/jobs").json()["total"] == 1
    assert api.get(f"/v1/jobs/{held}").json()["state"] == "held"


def test_a_body_without_a_content_type_is_refused_and_none_without_body_passes(
    api: TestClient,
) -> None:
    r = api.post("/v1/jobs", content=b'{"command": ["true"]}')
    assert_error(r, 415, "unsupported_media_type")
    held = post_json(api, "/v1/jobs", {"command": ["true"], "hold": True}).json()["id"]
    # What the ddpq CLI (httpx) sends for cancel/hold/release: no body, no content type.
    assert api.post(f"/v1/jobs/{held}/release").status_code == 200
    r = api.post(f"/v1/jobs/{held}/cancel", headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    charset = api.post(
        "/v1/jobs",
        content=b'{"command": ["true"]}',
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert charset.status_code == 201


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/sweeps", "/v1/jobs/1/cancel", "/v1/nowhere"])
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_a_body_over_the_limit_is_413_before_it_is_parsed(
    api: TestClient, path: str, chunked: bool
) -> None:
    filler = b" " * (1 << 20)
    parts = [b'{"command": ["true"], "name": "', *([filler] * 9), b'"}']
    content: Any = iter(parts) if chunked else b"".join(parts)
    r = api.post(path, content=content, headers={"Content-Type": "application/json"})
    assert_error(r, 413, "too_large", "larger than 8 MiB")
    assert api.get("/v1/jobs").json()["total"] == 0
    # Just under the limit is read and judged by the schema as usual.
    fits = b'{"command": ["true"], "name": "' + b"x" * (guard.MAX_BODY_BYTES - 64) + b'"}'
    r = api.post("/v1/jobs", content=fits, headers={"Content-Type": "application/json"})
    assert_error(r, 422, "invalid", "name")


def test_a_declared_length_over_the_limit_is_refused_before_any_byte_of_it(
    daemon: Daemon,
) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n"
        )
        reply = b""
        while b"too_large" not in reply and (chunk := conn.recv(4096)):
            reply += chunk  # the headers and the body may come in two segments
    assert reply.startswith(b"HTTP/1.1 413"), reply
    assert b"too_large" in reply


def test_the_cli_still_works_through_the_checks(shared_daemon: Daemon) -> None:
    job = int(shared_daemon.cli("submit", "--hold", "--", "true").stdout)
    assert f"{job}: held" in shared_daemon.cli("hold", str(job)).stdout
    assert f"{job}: queued" in shared_daemon.cli("release", str(job)).stdout
    assert wait_done(shared_daemon.client(), job).state == "succeeded"
    assert f"{job}: succeeded (already succeeded" in shared_daemon.cli("cancel", str(job)).stdout


# ---- item 14: integers in the query and the path ----------------------------------

BAD_INTEGERS = [
    str(INT64_MAX + 1),
    str(10**30),
    "9" * 5000,
    "-1",
    str(-(2**63) - 1),
    "abc",
    "1.5",
    "1e3",
    "0x10",
    "nan",
    "inf",
    "1 0",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: int() would take it
]


@pytest.mark.parametrize("value", BAD_INTEGERS, ids=lambda v: ascii(v)[:20])
@pytest.mark.parametrize(
    "path, param",
    [
        ("/v1/jobs", "offset"),
        ("/v1/jobs", "limit"),
        ("/v1/jobs/1/log", "offset"),
        ("/v1/jobs/1/log", "limit"),
    ],
)
def test_bad_integer_query_parameters_are_422(
    api: TestClient, path: str, param: str, value: str
) -> None:
    assert_error(api.get(path, params={param: value}), 422, "invalid", param)


@pytest.mark.parametrize("value", [*BAD_INTEGERS[:-1], "0"], ids=lambda v: ascii(v)[:20])
@pytest.mark.parametrize(
    "method, template",
    [
        ("GET", "/v1/jobs/{}"),
        ("GET", "/v1/jobs/{}/log"),
        ("POST", "/v1/jobs/{}/cancel"),
        ("POST", "/v1/jobs/{}/hold"),
        ("POST", "/v1/jobs/{}/release"),
    ],
)
def test_bad_job_ids_are_422(api: TestClient, method: str, template: str, value: str) -> None:
    assert_error(api.request(method, template.format(value)), 422, "invalid", "job_id")


def test_the_largest_integers_are_valid(api: TestClient) -> None:
    r = api.get("/v1/jobs", params={"offset": INT64_MAX})
    assert r.status_code == 200 and r.json()["items"] == []
    assert api.get(f"/v1/jobs/{INT64_MAX}").status_code == 404


def test_huge_offsets_on_a_real_daemon(shared_daemon: Daemon) -> None:
    """On the real server (h11, SQLite), where 10**30 once reset the connection."""
    job = shared_daemon.client().submit(JobSubmit(command=["true"]))
    for value in (str(INT64_MAX + 1), str(10**30), "9" * 4000, "-1"):
        for path in ("/v1/jobs", f"/v1/jobs/{job.id}/log"):
            assert_error(
                httpx.get(shared_daemon.url + path, params={"offset": value}), 422, "invalid"
            )
    assert (
        httpx.get(shared_daemon.url + "/v1/jobs", params={"offset": INT64_MAX}).status_code == 200
    )


# ---- item 15: cancelling a job that has ended ----------------------------------------


def _ended(daemon: Daemon, state: str) -> int:
    c = daemon.client()
    if state in ("succeeded", "failed"):
        job = c.submit(JobSubmit(command=["true" if state == "succeeded" else "false"]))
    elif state == "timed_out":
        job = c.submit(JobSubmit(command=["sleep", "30"], time_limit_s=0.5))
    else:
        job = c.submit(JobSubmit(command=["sleep", "30"]))
        wait_state(c, job.id, "running")
        c.cancel(job.id)
    assert wait_done(c, job.id).state == state
    return job.id


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "timed_out"])
def test_cancelling_an_ended_job_says_it_has_ended(shared_daemon: Daemon, state: str) -> None:
    job_id = _ended(shared_daemon, state)
    r = shared_daemon.client().cancel(job_id)
    assert (r.state, r.reason.split(":")[0]) == (state, f"already {state}")
    assert "stopping" not in r.reason
    out = shared_daemon.cli("cancel", str(job_id))
    assert out.stdout.startswith(f"{job_id}: {state} (already {state}")
    assert shared_daemon.client().show(job_id).state == state


# ---- item 16: loose input --------------------------------------------------------------

BAD_USERS = ["a" * 6000, "alice bob", " alice", "alice\t", "-alice", ".", "al/ice", "a" * 65, "é"]


@pytest.mark.parametrize("user", BAD_USERS, ids=lambda u: ascii(u)[:16])
def test_the_user_header_is_checked_like_a_user_name(api: TestClient, user: str) -> None:
    headers = {b"X-Ddpq-User": user.encode("latin-1")}
    r = api.post("/v1/jobs", json={"command": ["true"]}, headers=headers)
    assert_error(r, 422, "invalid", "X-Ddpq-User")
    assert api.get("/v1/jobs").json()["total"] == 0
    assert api.get("/v1/whoami", headers=headers).status_code == 422


@pytest.mark.parametrize("user", ["alice", "first.last", "a_b-c", "A" * 64])
def test_good_user_names_own_their_jobs(api: TestClient, user: str) -> None:
    r = api.post("/v1/jobs", json={"command": ["true"]}, headers={"X-Ddpq-User": user})
    assert r.status_code == 201 and r.json()["owner"] == user


LOOSE = [
    ("gpus", True),
    ("gpus", "2"),
    ("gpus", 2.0),
    ("gpus", 1.5),
    ("hold", "yes"),
    ("hold", 1),
    ("hold", "true"),
    ("torchrun", "yes"),
    ("torchrun", 0),
    ("priority", 1.5),
    ("priority", "1"),
    ("priority", True),
    ("retries", "3"),
    ("retries", 3.0),
    ("retries", False),
    ("after", ["1"]),
    ("after", [True]),
    ("time_limit_s", "30"),
    ("time_limit_s", True),
    ("time_limit_s", 0),
    ("time_limit_s", -1),
    ("command", ["echo", 1]),
    ("env", {"K": 1}),
    ("name", 5),
]


@pytest.mark.parametrize("field, value", LOOSE, ids=lambda x: repr(x))
def test_loose_types_are_refused(api: TestClient, field: str, value: object) -> None:
    assert_error(post_json(api, "/v1/jobs", {"command": ["true"], field: value}), 422, "invalid")
    assert api.get("/v1/jobs").json()["total"] == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_time_limits_must_be_finite(api: TestClient, literal: str) -> None:
    body = '{"command": ["true"], "time_limit_s": ' + literal + "}"
    r = api.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 422, "invalid", "time_limit_s", "finite")


@pytest.mark.parametrize("value", [30, 30.5, 1])
def test_an_int_is_still_a_valid_time_limit(api: TestClient, value: float) -> None:
    r = api.post("/v1/jobs", json={"command": ["true"], "time_limit_s": value})
    assert r.status_code == 201 and r.json()["time_limit_s"] == value


def _cwd_cases(tmp: Path) -> dict[str, str]:
    (tmp / "file").write_text("x")
    (tmp / "loop").symlink_to(tmp / "loop")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "to-file").symlink_to(tmp / "file")
    return {
        "missing": str(tmp / "nowhere"),
        "a file": str(tmp / "file"),
        "below a file": str(tmp / "file" / "x"),
        "a link loop": str(tmp / "loop"),
        "a dangling link": str(tmp / "dangling"),
        "a link to a file": str(tmp / "to-file"),
        "dot-dot past a missing folder": str(tmp / "nowhere" / ".." / "file"),
    }


CWD_CASES = [
    "missing",
    "a file",
    "below a file",
    "a link loop",
    "a dangling link",
    "a link to a file",
    "dot-dot past a missing folder",
]


@pytest.mark.parametrize("case", CWD_CASES)
def test_a_cwd_that_is_not_a_directory_is_refused(
    api: TestClient, tmp_path: Path, case: str
) -> None:
    cwd = _cwd_cases(tmp_path)[case]
    r = api.post("/v1/jobs", json={"command": ["true"], "cwd": cwd})
    assert_error(r, 422, "invalid", f"cwd: {cwd} is not a directory")
    assert api.get("/v1/jobs").json()["total"] == 0


def test_a_directory_or_a_link_to_one_is_a_valid_cwd(api: TestClient, tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    for cwd in (tmp_path / "dir", tmp_path / "link", tmp_path / "dir" / ".." / "link"):
        r = api.post("/v1/jobs", json={"command": ["true"], "cwd": str(cwd)})
        assert r.status_code == 201, r.text


NOBODY = "nobody"


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(NOBODY)
    except KeyError:
        return None


@pytest.fixture
def tree() -> Iterator[Path]:
    """A folder outside pytest's private tmp (0700), so another account can reach it:
    open/ (0755), secret/ (0700, root's) with inner/, grouped/ (0710, nobody's group)."""
    base = Path(tempfile.mkdtemp(prefix="ddpq-cwd-"))
    try:
        base.chmod(0o755)
        for name, mode in (("open", 0o755), ("secret", 0o700), ("grouped", 0o710)):
            (base / name).mkdir(mode=mode)
            (base / name).chmod(mode)
        (base / "secret" / "inner").mkdir()
        (base / "link-in").symlink_to(base / "secret" / "inner")
        (base / "link-open").symlink_to("open")
        nobody = _nobody()
        if nobody is not None and os.geteuid() == 0:
            os.chown(base / "grouped", 0, nobody.pw_gid)
        yield base
    finally:
        shutil.rmtree(base)


needs_root_and_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or _nobody() is None, reason="needs root and a `nobody` account"
)


@needs_root_and_nobody
def test_the_walk_judges_paths_as_the_account_would(tree: Path) -> None:
    who, nobody = paths.account(NOBODY), _nobody()
    assert who is not None and nobody is not None and who.uid != 0
    reachable = [tree / "open", tree / "grouped", tree / "link-open", tree / "open" / ".." / "open"]
    hidden = [
        tree / "secret",  # nobody may not enter it...
        tree / "secret" / "inner",  # ...nor pass through it
        tree / "link-in",  # not even through a link
        tree / "secret" / ".." / "open",  # `..` is looked up inside secret
        tree / "secret" / "missing",
        tree / "missing",
    ]
    for path in reachable:
        assert paths.can_enter(str(path), who), path
    for path in hidden:
        assert not paths.can_enter(str(path), who), path
    # The walk agrees with the kernel, asked as that account.
    import subprocess

    for path in reachable + hidden:
        kernel = subprocess.run(
            ["env", f"--chdir={path}", "true"],  # chdir(2) itself, as a job's shim
            user=NOBODY,
            group=nobody.pw_gid,
            extra_groups=sorted(who.gids),
            capture_output=True,
        )
        assert (kernel.returncode == 0) == paths.can_enter(str(path), who), path


@needs_root_and_nobody
def test_a_root_daemon_does_not_reveal_hidden_paths(home: Path, tree: Path) -> None:
    """With --auth as root: missing and out-of-reach read the same to the job's owner."""
    with lent_client(home, auth=True) as c:
        with Database(home / "ddpq.db").write() as s:
            _, token = user_store.add_user(
                s, "alice", admin=False, unix_user=NOBODY, now=time.time()
            )
            _, unmapped = user_store.add_user(
                s, "carol", admin=False, unix_user=None, now=time.time()
            )
        alice = {"Authorization": f"Bearer {token}"}

        def submit(cwd: Path, headers: dict[str, str] = alice) -> httpx2.Response:
            body = {"command": ["true"], "cwd": str(cwd)}
            return c.post("/v1/jobs", json=body, headers=headers)

        exists, missing = tree / "secret" / "inner", tree / "secret" / "nope"
        details = [submit(p).json()["detail"].replace(str(p), "P") for p in (exists, missing)]
        assert details[0] == details[1] == "cwd: P is not a directory the job can enter"
        assert submit(tree / "open").status_code == 201
        # No mapped account: refused before its folder is judged (it could never run).
        refused = submit(exists, {"Authorization": f"Bearer {unmapped}"})
        assert refused.status_code == 403 and "mapped to no Unix account" in refused.text


# ---- names ---------------------------------------------------------------------------

PROGRAMS = [
    "\x1b[31mred\x1b[0m",
    "my program",
    "a" * 200,
    "训练.py",
    "/usr/bin/",
    "---",
    "..",
    "\u202eexe.txt",
    "[/bold]",
    "x\tz\n",
    "./.hidden",
]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: ascii(p)[:20])
def test_a_name_taken_from_the_program_always_fits(api: TestClient, program: str) -> None:
    r = api.post("/v1/jobs", json={"command": [program]})
    assert r.status_code == 201, r.text
    assert NAME_RE.match(r.json()["name"]), r.json()["name"]


def test_derived_names_keep_what_fits() -> None:
    assert derive_name("/usr/bin/python3") == "python3"
    assert derive_name("train.py") == "train.py"
    assert derive_name("my program") == "my-program"
    assert derive_name("训练") == "job"
    assert len(derive_name("b" * 200)) == 64


def test_a_name_with_a_trailing_newline_is_refused(api: TestClient) -> None:
    for field in ("name", "owner"):
        r = api.post("/v1/jobs", json={"command": ["true"], field: "alice\n"})
        assert_error(r, 422, "invalid", field)
    r = api.post("/v1/jobs", json={"command": ["true"], "env": {"KEY\n": "1"}})
    assert_error(r, 422, "invalid", "env")


# ---- priority cap ------------------------------------------------------------------------


def test_only_admins_may_set_a_high_priority(home: Path) -> None:
    with lent_client(home, auth=True) as c:
        with Database(home / "ddpq.db").write() as s:
            me = pwd.getpwuid(os.geteuid()).pw_name
            _, user = user_store.add_user(s, "alice", admin=False, unix_user=me, now=time.time())
            _, admin = user_store.add_user(s, "boss", admin=True, unix_user=me, now=time.time())

        def submit(token: str, priority: int) -> httpx2.Response:
            return c.post(
                "/v1/jobs",
                json={"command": ["true"], "priority": priority},
                headers={"Authorization": f"Bearer {token}"},
            )

        for priority in (101, 500, 1000):
            assert_error(submit(user, priority), 403, "forbidden", "priority", "admin")
        for priority in (-1000, 0, 100):
            assert submit(user, priority).status_code == 201
        assert submit(admin, 1000).status_code == 201
        for token in (user, admin):
            assert_error(submit(token, 1001), 422, "invalid", "priority")
            assert_error(submit(token, -1001), 422, "invalid", "priority")


def test_without_auth_everyone_is_an_admin(api: TestClient) -> None:
    assert api.post("/v1/jobs", json={"command": ["true"], "priority": 1000}).status_code == 201


# ---- the OpenAPI document and 405 ----------------------------------------------------------


def test_the_schema_shows_what_the_server_enforces(api: TestClient) -> None:
    doc = api.get("/openapi.json").json()
    submit = doc["components"]["schemas"]["JobSubmit"]["properties"]

    def pattern(prop: dict[str, Any]) -> str | None:
        found = prop.get("pattern")
        for option in prop.get("anyOf", []):
            found = found or option.get("pattern")
        return found

    assert pattern(submit["name"]) == NAME_PATTERN
    assert pattern(submit["owner"]) == NAME_PATTERN
    assert pattern(submit["cwd"]) == CWD_PATTERN
    routes = doc["paths"]
    for verb in ("hold", "release"):
        assert "409" in routes[f"/v1/jobs/{{job_id}}/{verb}"]["post"]["responses"]
    for path in ("/v1/jobs", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/hold"):
        responses = routes[path]["post"]["responses"]
        assert {"415", "503", "422"} <= set(responses), path
    header = [p for p in routes["/v1/jobs"]["get"]["parameters"] if p["in"] == "header"]
    assert [p["name"] for p in header] == ["x-ddpq-user"]
    assert pattern(header[0]["schema"]) == NAME_PATTERN
    offset = [p for p in routes["/v1/jobs"]["get"]["parameters"] if p["name"] == "offset"]
    assert offset[0]["schema"]["maximum"] == INT64_MAX


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("PUT", "/v1/jobs", "GET, POST"),
        ("DELETE", "/v1/jobs", "GET, POST"),
        ("PATCH", "/v1/jobs", "GET, POST"),
        ("DELETE", "/v1/jobs/1", "GET, PATCH"),  # PATCH: ddpq update
        ("GET", "/v1/jobs/1/cancel", "POST"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_405_says_what_is_allowed(api: TestClient, method: str, path: str, allowed: str) -> None:
    r = api.request(method, path)
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["Allow"] == allowed


# ---- item 13: storage faults --------------------------------------------------------------


def test_a_storage_fault_is_503_with_its_cause_logged_once(daemon: Daemon) -> None:
    """A real fault: the kernel refuses the daemon's writes past a file size (RLIMIT_FSIZE,
    set on the running daemon with prlimit(2)), as a full disk refuses them; SQLite reports
    it as an I/O error. Reads go on, each write is a 503 naming the cause, the log says it
    once, and once the limit is lifted the same daemon writes again.

    (A read-only file or a full disk cannot be made here: the tests run as root, which
    ignores file modes, and cannot mount a small file system.)
    """
    assert daemon.proc is not None
    files = [p for p in daemon.home.iterdir() if p.is_file()]
    limit = max(p.stat().st_size for p in files) + 64 * 1024
    resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    env = {f"K{i}": "x" * 200 for i in range(120)}  # ~24 KiB a job: the WAL grows fast
    body = {"command": ["true"], "hold": True, "env": env}
    # One client: httpx.post would make a client, and load the CA bundle, for each request.
    with httpx.Client(base_url=daemon.url, timeout=30) as http:
        answers = [http.post("/v1/jobs", json=body) for _ in range(40)]
        statuses = [r.status_code for r in answers]
        assert 503 in statuses and set(statuses) <= {201, 503}, statuses
        first = statuses.index(503)
        assert set(statuses[first:]) == {503}  # while the fault lasts, every write says so
        for r in answers[first:]:
            assert_error(r, 503, "unavailable", "database")
            assert r.headers["Retry-After"]
        listed = http.get("/v1/jobs", params={"limit": 1})
        assert listed.status_code == 200 and listed.json()["total"] == first
        assert http.get("/healthz").status_code == 200
        log = (daemon.home / "daemon.log").read_text()
        assert log.count("answering 503") == 1 and "Traceback" not in log, log

        resource.prlimit(
            daemon.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
        again = http.post("/v1/jobs", json=body)
        assert again.status_code == 201
        assert http.get("/v1/jobs").json()["total"] == first + 1


@pytest.mark.parametrize(
    "message, words",
    [
        ("attempt to write a readonly database", "read-only"),
        ("database or disk is full", "full"),
        ("database is locked", "busy"),
    ],
)
def test_each_storage_fault_is_named(
    message: str, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The middleware on its own, with the errors SQLite raises for the faults that cannot
    be made for real here (see above): each is a 503 that names it, logged once."""
    import sqlite3

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from ddpq.server.faults import StorageFaults

    def broken(_request: object) -> None:
        raise sqlite3.OperationalError(message)

    def bug(_request: object) -> None:
        raise RuntimeError("a bug")

    app = Starlette(
        routes=[Route("/w", broken), Route("/bug", bug)], middleware=[Middleware(StorageFaults)]
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        for _ in range(5):
            assert_error(c.get("/w"), 503, "unavailable", words)
        assert c.get("/bug").status_code == 500  # anything else stays a 500
    assert sum("answering 503" in r.getMessage() for r in caplog.records) == 1
