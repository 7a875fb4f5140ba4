"""One account's flood of requests against everyone else's: how long another caller's
`GET /v1/queue` takes while `nobody` keeps CONNECTIONS requests in flight on the daemon's
Unix socket (as a script in a loop would), against the same with no flood.

    sudo python bench/request_flood.py [--connections 48] [--samples 60] [--src SRC]

Root only: the flood is `nobody`'s (a child process that drops to it), and the measured
caller is root's own connection on the socket. Starts its own daemon (`--auth --fake-gpus
2`) in a fresh folder under /tmp and stops it; `--src` runs another tree's daemon (its
`src` folder) to compare two versions in one run.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line, python_c_pass_ms

REQUEST = b"GET /v1/queue HTTP/1.1\r\nHost: ddpq\r\n\r\n"


def start_daemon(home: Path, src: Path | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    cmd = [sys.executable, "-m", "ddpq", "serve", "--home", str(home), "--auth"]
    cmd += ["--fake-gpus", "2", "--port", str(free_port())]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (home / "ddpq.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            said = proc.stderr.read().decode()[-500:] if proc.stderr else ""
            raise SystemExit(f"the daemon did not start: {said}")
        time.sleep(0.05)
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_request(path: str) -> float:
    """Seconds for one request on a new connection to the socket, to its whole answer."""
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(REQUEST)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit(f"the daemon closed the connection: {reply[:200]!r}")
            reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        fields = (line.partition(b":") for line in head.split(b"\r\n"))
        length = int(next(v for k, _, v in fields if k.lower() == b"content-length"))
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("the daemon closed the connection mid-answer")
            body += chunk
    return time.perf_counter() - started


def flood(path: str, connections: int) -> int:
    """A child, as nobody, keeping ``connections`` requests in flight until killed; back
    once its first answer came (the flood is under way)."""
    under_way, said = os.pipe()
    pid = os.fork()
    if pid:
        os.close(said)
        started = os.read(under_way, 1) == b"."
        os.close(under_way)
        if not started:  # it ended first (no socket, no nobody): no figure beside nothing
            os.waitpid(pid, 0)
            raise SystemExit("the flood did not start: nothing to measure beside it")
        return pid
    os.close(under_way)
    try:
        nobody = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        import selectors

        sel = selectors.DefaultSelector()
        for _ in range(connections):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.sendall(REQUEST)
            sel.register(s, selectors.EVENT_READ)
        first = True
        while True:
            for key, _ in sel.select():
                if first:
                    os.write(said, b".")
                    first = False
                s = key.fileobj  # type: ignore[assignment]
                data = s.recv(1 << 20)  # type: ignore[union-attr]
                if not data:
                    sel.unregister(s)
                    s.close()  # type: ignore[union-attr]
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(path)
                    sel.register(s, selectors.EVENT_READ)
                s.sendall(REQUEST)  # type: ignore[union-attr]
    finally:
        os._exit(0)


def measure(path: str, samples: int) -> list[float]:
    return [one_request(path) * 1000 for _ in range(samples)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=48)
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--src", type=Path, default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the flood is nobody's, on a root daemon's socket")
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; command: {' '.join(sys.argv)}")
    top = Path(tempfile.mkdtemp(prefix="ddpq-flood-", dir="/tmp"))
    top.chmod(0o755)
    daemon = start_daemon(top / "home", args.src)
    path = str(top / "home" / "ddpq.sock")
    try:
        measure(path, 5)  # warm
        alone = measure(path, args.samples)
        child = flood(path, args.connections)
        try:
            flooded = measure(path, args.samples)
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        shutil.rmtree(top, ignore_errors=True)
    beside = f"beside nobody's {args.connections} in flight"
    for name, values in (("alone", alone), (beside, flooded)):
        q = statistics.quantiles(values, n=100)
        print(
            f"root's GET /v1/queue {name}: p50 {q[49]:.1f} ms, p90 {q[89]:.1f} ms, "
            f"max {max(values):.1f} ms"
        )


if __name__ == "__main__":
    main()
