"""A stand-in for the daemon's API in the test's process: real HTTP on a loopback port,
answered by a function of the test's (``answer(request) -> Answer``).

The client speaks HTTP with the standard library, so its tests talk to a real socket
rather than to a mock transport; this is that socket.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# How often a test's HTTP server looks whether it is asked to stop: ``shutdown`` waits for
# that look, and the standard library's half second, paid at every test's end, came to a
# minute of the suite's time (bench/RESULTS.md, stop 37).
SHUTDOWN_POLL_S = 0.01


def serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    """Serve ``server`` on a daemon thread of its own, started; ``server.shutdown()``
    returns within ``SHUTDOWN_POLL_S``."""
    thread = threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_S,), daemon=True)
    thread.start()
    return thread


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    connection: int  # which TCP connection it came on (1, 2, ...)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] | None = None  # a chunked body instead, sent piece by piece
    close: bool = False  # close the connection after answering, saying so
    hang_up: bool = False  # close it without saying so (as an idle keep-alive times out)


def json_answer(status: int, data: Any) -> Answer:
    # json.dumps escapes a lone surrogate ("\\ud800"), as a server's JSON may carry one.
    return Answer(status, json.dumps(data).encode(), {"Content-Type": "application/json"})


class StubApi:
    def __init__(self, answer: Callable[[Request], Answer]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self._connections = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

            def setup(self) -> None:
                super().setup()
                stub._connections += 1
                self.connection_number = stub._connections

            def log_message(self, *_: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                url = urlsplit(self.path)
                request = Request(
                    self.command,
                    url.path,
                    parse_qs(url.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                    self.connection_number,
                )
                stub.requests.append(request)
                answer = stub.answer(request)
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                if answer.close:
                    self.send_header("Connection", "close")
                self.close_connection = answer.close or answer.hang_up
                if answer.chunks is None:
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer.chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StubApi:
        serve_in_thread(self.server)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def serving(answer: Callable[[Request], Answer]) -> Iterator[StubApi]:
    """For a fixture: ``yield from serving(answer)``."""
    with StubApi(answer) as stub:
        yield stub
