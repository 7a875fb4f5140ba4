"""How to reach a session's server from another machine (`ddpq shell -- jupyter lab --port
{port}`): an ssh tunnel to its leased port, printed once a process of the job listens there,
and never to whoever else took the port. Part of ``client.sessions``, which passes in how
it says a line (``say``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

Say = Callable[[str], None]
# How long a session's server is waited for to listen on its port before attaching, and
# how often the daemon is asked meanwhile.
LISTEN_WAIT_S = 20.0
LISTEN_POLL_S = 0.5


def reach(c: Any, job_id: int, port: int, say: Say) -> None:
    """How to reach the session's server from another machine (an ssh tunnel to its port),
    once a process of the job listens there: never a tunnel to whoever took the port
    first. Someone else there gets a warning instead; nobody yet, a line that says so."""
    import getpass
    import socket

    host = socket.gethostname()
    use = listener(c, job_id, port, say)
    who_listens = use.get("listener")
    if who_listens == "other":
        who = f"uid {use.get('uid')}" + (f" ({use['user']})" if use.get("user") else "")
        proc = f", pid {use['pid']} {use.get('command') or ''}".rstrip() if use.get("pid") else ""
        say(
            f"warning: port {port} of {host} is not job {job_id}'s: {who}{proc} listens on it. "
            "No tunnel printed: it would not lead to this session's server"
        )
        return
    if who_listens not in ("job", "nobody"):  # unknown, or nonsense
        say(f"no tunnel printed: {use.get('detail') or 'the daemon cannot tell who listens'}")
        return
    if who_listens != "job":
        say(
            f"job {job_id} does not listen on port {port} yet; `ddpq attach {job_id}` "
            "prints how to reach it once it does"
        )
        return
    say(f"job {job_id} serves on port {port} of {host}; from your own machine:")
    sys.stderr.write(f"    ssh -N -L {port}:127.0.0.1:{port} {getpass.getuser()}@{host}\n")
    sys.stderr.write(f"  then open http://127.0.0.1:{port}/ (with the token it prints, if any)\n")


def listener(c: Any, job_id: int, port: int, say: Say) -> dict[str, Any]:
    """Who listens on the job's port, waited for while nobody does (a server takes a few
    seconds to start), at most LISTEN_WAIT_S."""
    from ddpq.client.api import DdpqError

    deadline = time.monotonic() + LISTEN_WAIT_S
    said = False
    while True:
        try:
            use: Any = c.port_use(job_id)
        except DdpqError as exc:
            if exc.status != 404:
                raise
            return {"listener": "unknown", "detail": "this daemon cannot tell who listens"}
        if not isinstance(use, dict):
            return {"listener": "unknown", "detail": "the daemon's answer made no sense"}
        gone = use.get("port") is None  # it ended meanwhile
        if use.get("listener") != "nobody" or gone or time.monotonic() > deadline:
            return use
        if not said:
            say(f"job {job_id}: waiting for its server to listen on port {port}")
            said = True
        time.sleep(LISTEN_POLL_S)
