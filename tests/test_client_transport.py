"""The client's HTTP on sockets (``client.transport``) against a stand-in server: keep-alive,
chunked answers and streams, and every way a daemon can fail to answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ddpq.client.api import DdpqError, JsonApi, Unreachable
from tests.stub_api import Answer, Request, StubApi, json_answer


@pytest.fixture
def api() -> Iterator[StubApi]:
    def answer(request: Request) -> Answer:
        if request.path.endswith("/v1/whoami"):
            return json_answer(200, {"name": "alice", "admin": False})
        if request.path.endswith("/closing"):
            return Answer(200, b"{}", {"Content-Type": "application/json"}, close=True)
        if request.path.endswith("/hang-up"):
            return Answer(200, b"{}", {"Content-Type": "application/json"}, hang_up=True)
        if request.path.endswith("/chunked"):
            return Answer(200, chunks=[b'{"a":', b" 1}"])
        if request.path == "/v1/jobs/1/log":
            return Answer(200, chunks=[b"tick 1\n", b"tick 2\n", b"x" * 100_000])
        if request.path == "/v1/jobs/2/log":
            return json_answer(403, {"detail": "job 2 belongs to bob, not alice"})
        if request.path.endswith("/not-json"):
            return Answer(200, b"<html>hello</html>")
        if request.path.endswith("/broken"):
            return Answer(500, b"Internal \x1b[31mServer\x1b[0m Error\n" + b"x" * 500)
        if request.method == "POST":
            return json_answer(201, {"id": 1, "body": request.body.decode()})
        return json_answer(404, {"detail": "no such thing", "code": "not_found"})

    with StubApi(answer) as stub:
        yield stub


def test_requests_share_one_kept_alive_connection_without_nagle(api: StubApi) -> None:
    with JsonApi(api.url, token="ddpq_tok") as c:
        assert c.whoami() == {"name": "alice", "admin": False}
        assert c.whoami()["name"] == "alice"
        assert c._http._conn is not None
        sock = c._http._conn.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    assert [r.connection for r in api.requests] == [1, 1]
    headers = api.requests[0].headers
    assert headers["authorization"] == "Bearer ddpq_tok"
    assert headers["host"] == api.url.removeprefix("http://")
    assert "content-type" not in headers  # a GET has no body


def test_a_connection_the_daemon_closed_is_not_reused(api: StubApi) -> None:
    with JsonApi(api.url) as c:
        c._http.request("GET", "/closing")
        c._http.request("GET", "/hang-up")  # closed with no word: seen as readable at EOF
        time.sleep(0.05)
        c.whoami()
    assert [r.connection for r in api.requests] == [1, 2, 3]


def test_posts_carry_json_or_an_empty_body(api: StubApi) -> None:
    with JsonApi(api.url) as c:
        out = c.submit({"command": ["true"], "env": {"K": "vé"}})
        assert out["body"] == '{"command":["true"],"env":{"K":"v\\u00e9"}}'
        c.cancel(5)
    job, cancel = api.requests
    assert job.headers["content-type"] == "application/json"
    # The daemon refuses a write with a body that is not JSON; an empty one needs no type.
    assert cancel.headers["content-length"] == "0" and "content-type" not in cancel.headers


def test_chunked_answers_and_streams(api: StubApi) -> None:
    with JsonApi(api.url) as c:
        assert c._http.request("GET", "/chunked").json() == {"a": 1}
        streamed = b"".join(c.follow_log(1))
    assert streamed == b"tick 1\ntick 2\n" + b"x" * 100_000
    assert api.requests[-1].query == {"offset": ["0"], "follow": ["true"]}


def test_a_refused_stream_is_the_daemons_error(api: StubApi) -> None:
    with JsonApi(api.url) as c, pytest.raises(DdpqError) as refused:
        list(c.follow_log(2))
    assert refused.value.exit_code == 5 and "belongs to bob" in str(refused.value)


def test_errors_are_one_safe_line_with_the_clis_exit_code(api: StubApi) -> None:
    with JsonApi(api.url) as c:
        with pytest.raises(DdpqError) as missing:
            c.show(99)
        assert (missing.value.exit_code, missing.value.status) == (4, 404)
        assert str(missing.value) == "no such thing (HTTP 404)"
        with pytest.raises(DdpqError) as broken:
            c._http.request("GET", "/broken")
        message = str(broken.value)
        assert broken.value.exit_code == 1 and "\x1b" not in message and "\n" not in message
        assert message.startswith("Internal \\x1b[31mServer") and message.endswith("(HTTP 500)")
        with pytest.raises(DdpqError, match="not JSON, HTTP 200"):
            c._http.request("GET", "/not-json").json()


def test_a_path_prefix_in_the_url_is_kept(api: StubApi) -> None:
    with JsonApi(api.url + "/ddpq/") as c:
        assert c.whoami()["name"] == "alice"
    assert api.requests[0].path == "/ddpq/v1/whoami"


@pytest.mark.parametrize("url", ["ftp://x", "http://", "localhost:8765", "http://h:99999"])
def test_a_url_that_is_not_http_is_a_usage_error(url: str) -> None:
    with pytest.raises(DdpqError) as bad:
        JsonApi(url)
    assert bad.value.exit_code == 2 and "not an http://, https:// or unix:/path URL" in str(
        bad.value
    )


@pytest.mark.parametrize("url", ["unix:", "unix:ddpq.sock", "unix:./x.sock", "unix:/a\x00b"])
def test_a_socket_url_must_name_an_absolute_path(url: str) -> None:
    with pytest.raises(DdpqError) as bad:
        JsonApi(url)
    assert bad.value.exit_code == 2 and "absolute path" in str(bad.value)


def serve_raw(reply: bytes | None) -> tuple[str, threading.Event]:
    """A TCP server that answers ``reply`` to whatever it gets and hangs up (None: says
    nothing and keeps the connection open)."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(65536)
            if reply is not None:
                conn.sendall(reply)
                return
            done.wait(10)

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", done


@pytest.mark.parametrize(
    ("reply", "name"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "ProtocolError"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "ProtocolError"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "ProtocolError"),
        (None, "TimeoutError"),
    ],
    ids=["not-http", "cut-short", "bad-chunk", "silent"],
)
def test_what_is_not_a_daemon_answering_is_unreachable(reply: bytes | None, name: str) -> None:
    url, done = serve_raw(reply)
    try:
        with JsonApi(url, timeout=0.5) as c, pytest.raises(Unreachable) as lost:
            c.whoami()
    finally:
        done.set()
    assert lost.value.exit_code == 3
    assert str(lost.value).startswith(f"cannot reach the ddpq daemon at {url} ({name}")


def test_nothing_listening_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with JsonApi(f"http://127.0.0.1:{port}") as c, pytest.raises(Unreachable) as lost:
        c.whoami()
    assert "(ConnectionRefusedError)" in str(lost.value) and lost.value.exit_code == 3
