"""One user's flood of submissions over a daemon's Unix socket, as a script in a loop would
send it: N one-core `true` jobs, one POST after another on one connection. Run as the
flooding user beside another's job to see how long the other's job waits (`ddpq show`'s
history: queued, then starting), as the srpt-progress figures of bench/RESULTS.md were.

    python bench/flood_submit.py SOCKET N
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def main() -> None:
    path, count = sys.argv[1], int(sys.argv[2])
    conn = UnixConnection(path)
    body = json.dumps({"command": ["true"], "gpus": 0, "cpus": 1, "cwd": os.path.expanduser("~")})
    codes: dict[int, int] = {}
    started = time.monotonic()
    for _ in range(count):
        conn.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        codes[answer.status] = codes.get(answer.status, 0) + 1
        if answer.status != 201 and codes[answer.status] == 1:
            print(answer.status, data[:200].decode(errors="replace"))
    print(f"{codes} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
