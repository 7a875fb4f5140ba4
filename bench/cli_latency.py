"""How long `ddpq submit` and `ddpq ls` take, whole process, as a shell runs them.

    python bench/cli_latency.py [--runs 20] [--pythonpath OLD/src ...]

Starts a real daemon (`ddpq serve --fake-gpus 2` on a temporary home, from this checkout),
then runs N sequential `ddpq submit --hold -- true` and N `ddpq ls` against it (the
virtualenv's `ddpq` script, as a user types it; `python -m ddpq` where there is none), and
times each whole process (start-up, imports, the HTTP round trip, drawing,
exit) from outside. The jobs are held, so `ls` draws a table that grows to 2N rows per
code version. `python -c pass` is measured the same way, for reference: what any command
costs before it does anything.

Beside them, the floor of any Python client of this API (``BARE``): the same request
(`submit`'s body with the environment it sends, `ls`'s query) written on a socket with
`json` and `socket` alone, its answer read and parsed, printed as one line. What a command
costs above that is ddpq's; what the floor costs above `python -c pass` is the standard
library's imports and the daemon's answer, which no client code can take off.

The ratio to `python -c pass` (the same interpreter, started the same way, in the same
rounds) is the figure to read on a loaded machine: the wall times move with the load, the
ratio much less. Each command's own CPU time (user + system, from its rusage) is printed
too: the load adds waiting to the wall time (and the daemon's answer is in it), hardly
to that.

Each `--pythonpath` is another version of the client (for example main's code, unpacked
with `git archive main src | tar -x -C /tmp/before`); every version is measured in the same
run, interleaved one command at a time so that they share the machine's noise. Each is
byte-compiled first (`compileall`), as an installed package is: without it, a shell with
PYTHONDONTWRITEBYTECODE set would compile ddpq's modules again on every run.
Prints a markdown table to paste into bench/RESULTS.md.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from machine import cpu_model, free_port, runs_and_versions, start_daemon, stop_daemons

from ddpq.client.runtime import ACTIVE_STATES

# The floor (see the docstring): one request to $DDPQ_URL (http://HOST:PORT), sys.argv[1]
# its path and query; with a second argument "submit", `ddpq submit --hold -- true`'s body.
BARE = r"""
import json, os, pwd, socket, sys
host, port = os.environ["DDPQ_URL"].removeprefix("http://").rsplit(":", 1)
user = pwd.getpwuid(os.getuid()).pw_name
body = b""
if sys.argv[2:] == ["submit"]:
    job = {"hold": True, "cwd": os.getcwd(), "exported_env": dict(os.environ), "command": ["true"]}
    body = json.dumps(job, separators=(",", ":")).encode()
head = f"{'POST' if body else 'GET'} {sys.argv[1]} HTTP/1.1\r\nHost: {host}:{port}\r\n"
head += f"X-Ddpq-User: {user}\r\n"
if body:
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
sock = socket.create_connection((host, int(port)))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sock.sendall(head.encode() + b"\r\n" + body)
data = b""
while b"\r\n\r\n" not in data:
    data += sock.recv(65536)
head, _, data = data.partition(b"\r\n\r\n")
length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
while len(data) < length:
    data += sock.recv(65536)
answer = json.loads(data)
print(answer["id"] if body else len(answer["jobs"]))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wall_ms(argv: list[str], env: dict[str, str]) -> float:
    return run_ms(argv, env)[0]


def run_ms(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The command's wall time and its own CPU time (user + system, from its rusage: what
    the load does not add to), in ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - t0) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    runs, versions = runs_and_versions(20)
    home = Path(tempfile.mkdtemp(prefix="ddpq-cli-bench-"))
    port = free_port()
    daemon = start_daemon(home, port)
    base = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    base["DDPQ_URL"] = f"http://127.0.0.1:{port}"
    envs = {name: {**base, "PYTHONPATH": path} for name, path in versions.items()}
    script = Path(sys.executable).parent / "ddpq"  # imports ddpq from PYTHONPATH first
    ddpq = [str(script)] if script.exists() else [sys.executable, "-m", "ddpq"]
    commands = {
        "submit": [*ddpq, "submit", "--hold", "--", "true"],
        "ls": [*ddpq, "ls"],
    }
    queue = "/v1/queue?" + urlencode({"limit": 100, "state": ACTIVE_STATES}, doseq=True)
    floors = {
        "submit": [sys.executable, "-c", BARE, "/v1/jobs", "submit"],
        "ls": [sys.executable, "-c", BARE, queue],
    }
    samples: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}

    def measure(key: tuple[str, str], argv: list[str], env: dict[str, str]) -> None:
        wall, own = run_ms(argv, env)
        samples.setdefault(key, []).append(wall)
        cpu.setdefault(key, []).append(own)

    try:
        for _ in range(3):  # warm the page cache and the daemon, unrecorded
            for env in envs.values():
                wall_ms(commands["ls"], env)
        load_before = os.getloadavg()[0]
        # One command at a time, each round every command of every version and the floor,
        # so that all of them share the machine's noise alike.
        for _ in range(runs):
            measure(("python -c pass", ""), [sys.executable, "-c", "pass"], base)
            for what, argv in commands.items():
                for name, env in envs.items():
                    measure((what, name), argv, env)
                measure((what, "floor: `json` and `socket` alone"), floors[what], base)
    finally:
        stop_daemons([daemon], home)

    load = os.getloadavg()[0]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}, "
        f"{os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
        f"load average {load_before:.1f} before the run, {load:.1f} after; "
        f"{runs} runs each\n"
    )
    floor = statistics.median(samples[("python -c pass", "")])
    cpu_floor = statistics.median(cpu[("python -c pass", "")])
    print("| command | code | p50 | × `python -c pass` | p90 | own CPU p50 | × its CPU |")
    print("|---|---|---|---|---|---|---|")
    for (what, name), values in samples.items():
        p50, own = statistics.median(values), statistics.median(cpu[(what, name)])
        print(
            f"| `{what}` | {name or '-'} | {p50:.1f} ms | {p50 / floor:.1f}× "
            f"| {pct(values, 0.9):.1f} ms | {own:.1f} ms | {own / cpu_floor:.1f}× |"
        )


if __name__ == "__main__":
    main()
