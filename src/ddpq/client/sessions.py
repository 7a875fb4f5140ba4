"""`ddpq shell` and `ddpq attach`: interactive sessions on leased GPUs.

`ddpq shell` queues a session like any job (same planner, leases, limits and accounting),
waits for it to start while saying why it waits, then relays this terminal to the one its
shim holds (``client.relay``). Leaving the shell ends the job, and `ddpq shell` exits with
the shell's status; the detach key (Ctrl-\\) leaves it running, and `ddpq attach ID` comes
back to it. After ``--`` it runs a command instead of the login shell: ``{port}`` in it is
the leased port (`ddpq shell -- jupyter lab --no-browser --port {port}`), and the ssh line
that reaches that port from another machine is printed once a process of the job listens
there (someone else there: a warning instead).

Registered on the client's app by ``client.cli`` (``register``); what a command needs is
imported when it runs, as for the others.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpq.client import common, session_port
from ddpq.client.coercion import QuickCommand

POLL_S = 0.5
QUIET_S = 2.0  # a wait this short without a reason is not worth a line
# A running session's shim serves its socket at once; this long without it is a failure.
SOCKET_WAIT_S = 15.0
# How long the end is waited for once the terminal closed (the worker records it).
END_WAIT_S = 10.0
WAITING = ("queued", "held", "starting")

DetachOpt = Annotated[
    str,
    typer.Option(
        metavar="^X|none", help="the key that detaches, leaving the session running: ^\\ is Ctrl-\\"
    ),
]


def shell(
    ctx: typer.Context,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="number of GPUs")] = 1,
    time_limit: Annotated[
        str | None, typer.Option(help="e.g. 4h; then the session ends timed_out")
    ] = None,
    idle: Annotated[
        str | None,
        typer.Option(
            help="end the session once its GPUs are unused this long (after a warning in "
            "it); default and maximum: the daemon's --idle and --idle-max"
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", "-n")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, over --export")
    ] = None,
    export: Annotated[
        str, typer.Option(metavar="ALL|NONE|NAME,...", help="as for `ddpq submit`")
    ] = "ALL",
    cwd: Annotated[Path | None, typer.Option(help="working directory (default: here)")] = None,
    detach_key: DetachOpt = "^\\",
) -> None:
    """A shell on leased GPUs: `ddpq shell --gpus 1`, or `ddpq shell -- jupyter lab
    --no-browser --port {port}` for a server on the leased port.

    Queued like any job; once it starts you are in your login shell (your environment, as
    for `submit`, with CUDA_VISIBLE_DEVICES, MASTER_PORT, DDPQ_JOB_DIR...). `exit` ends it;
    Ctrl-\\ detaches and `ddpq attach ID` comes back. A session whose GPUs stay unused for
    its --idle limit is warned in its terminal, then ended (reason idle).
    """
    from ddpq.client import relay, submission
    from ddpq.client.api import DdpqError
    from ddpq.client.format import sanitize
    from ddpq.core.units import parse_duration

    key = _detach_key(detach_key)
    command = list(ctx.args) or [_login_shell()]
    try:
        env_map = submission.env_pairs(env or [])
        exported, _ = submission.exported_env(export, os.environ)
    except submission.BadOption as exc:
        common.fail(sanitize(str(exc)), 2)
    # The session's terminal is this one's type (an exported environment never carries it).
    env_map.setdefault("TERM", os.environ.get("TERM") or "xterm-256color")
    fields: dict[str, Any] = {
        "command": command,
        "interactive": True,
        "gpus": gpus,
        "name": name or ("shell" if not ctx.args else None),
        "env": env_map,
        "exported_env": exported,
        "cwd": str((cwd or Path.cwd()).resolve()),
    }
    durations = (("--time-limit", time_limit, "time_limit_s"), ("--idle", idle, "idle_s"))
    for option, value, field in durations:
        if value is not None:
            try:
                fields[field] = parse_duration(value)
            except ValueError as exc:
                common.fail(f"{option}: {sanitize(str(exc))}", 2)
    fields = {k: v for k, v in fields.items() if v is not None}
    with common.client() as c:
        try:
            job = c.submit(fields)
        except DdpqError as exc:
            if exc.status != 422:
                raise
            common.fail(submission.refusal(exc.detail), 2)
        say(f"job {job['id']}: a session on {_gpu_words(gpus)}; Ctrl-C cancels it while it waits")
        _start(_staying(c, answered=True), job["id"], key, relay)


def _start(c: Any, job_id: int, key: int | None, relay: Any) -> None:
    """Wait for the new session ``job_id`` and attach to it; Ctrl-C meanwhile cancels it."""
    # As promised even when started with SIGINT ignored: Python keeps an inherited
    # SIG_IGN, and ^C would then do nothing while the session waits.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            job = _wait_to_run(c, job_id)
        except KeyboardInterrupt:
            c.cancel(job_id)
            say(f"job {job_id}: cancelled")
            raise typer.Exit(130) from None
        _attach(c, job, key, relay, ends_with_input=True)
    except EndedFirst as ended:  # `ddpq shell -- nvidia-smi`: over before we attached
        _as_if_attached(c, ended.job)


def attach(
    job_id: Annotated[int, typer.Argument(help="the session's job ID")],
    detach_key: DetachOpt = "^\\",
) -> None:
    """Reattach to a running session (`ddpq shell`): its terminal, as you left it."""
    from ddpq.client import relay

    key = _detach_key(detach_key)
    with common.client() as api:
        c = _staying(api)
        job = c.show(job_id)
        if not job.get("interactive"):
            common.fail(f"job {job_id} is not an interactive session (`ddpq logs -f {job_id}`)", 2)
        try:
            try:
                job = _wait_to_run(c, job_id)
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            _attach(c, job, key, relay)
        except EndedFirst as ended:
            job = ended.job
            reason = job.get("reason") or "no reason given"
            common.fail(f"job {job_id} has ended: {job['state']} ({reason})", 1)


def register(app: typer.Typer) -> None:
    """Add `shell` and `attach` to the client's app."""
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("shell", cls=QuickCommand, context_settings=settings)(shell)
    app.command("attach", cls=QuickCommand)(attach)


# ---- the steps -------------------------------------------------------------------------


class EndedFirst(Exception):
    """The session ended before its terminal was attached (``job``: its record then)."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job["id"])
        self.job = job


def _staying(api: Any, answered: bool = False) -> Any:
    """``api`` whose calls wait for the daemon through a restart (the session runs on, and
    its terminal is the shim's, not the daemon's): ``client.reconnect``."""
    from ddpq.client.reconnect import Staying, StayingApi

    staying = Staying(say)
    if answered:
        staying.back()
    return StayingApi(api, staying)


def say(line: str) -> None:
    """A line of ours on stderr (the session's own output is on stdout); never while the
    relay holds the terminal in raw mode."""
    from ddpq.client.format import sanitize

    sys.stderr.write(f"ddpq: {sanitize(line)}\n")
    sys.stderr.flush()


def _detach_key(spec: str) -> int | None:
    from ddpq.client import relay

    try:
        return relay.detach_byte(spec)
    except ValueError as exc:
        common.fail(f"--detach-key: {exc}", 2)


def _login_shell() -> str:
    """The user's login shell (the password database's), else /bin/sh."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    except KeyError:
        return "/bin/sh"


def _gpu_words(gpus: int) -> str:
    return "no GPU" if gpus == 0 else "1 GPU" if gpus == 1 else f"{gpus} GPUs"


def _wait_to_run(c: Any, job_id: int) -> dict[str, Any]:
    """The job once it runs and its terminal is served, saying why it waits meanwhile."""
    shown = None
    since = time.monotonic()
    while True:
        job: dict[str, Any] = c.show(job_id)
        state, reason = job["state"], job.get("reason") or ""
        if state == "running" and job.get("attach"):
            return job
        if state not in WAITING and state != "running":
            raise EndedFirst(job)
        # Said when it changes; a job that starts at once has nothing to say.
        quiet = not reason and time.monotonic() - since < QUIET_S
        now = f"{state}: {reason or 'waiting for the scheduler'}"
        if now != shown and state in ("queued", "held") and not quiet:
            say(f"job {job_id} {now}")
            shown = now
        time.sleep(POLL_S)


def _attach(
    c: Any, job: dict[str, Any], key: int | None, relay: Any, ends_with_input: bool = False
) -> None:
    """Relay this terminal to the running session ``job``; exit as the session did.
    ``ends_with_input``: the end of a file or pipe given as input is typed into it, for
    `ddpq shell`'s own session; `ddpq attach` (a script's, watching) only stops typing."""
    from ddpq.core.interactive import uses_port

    job_id = job["id"]
    sock = _connect(c, job, relay)
    port = job["leases"]["port"]
    if port and uses_port(job["command"]):
        session_port.reach(c, job_id, port, say)
    shown = "none" if key is None else _key_name(key)
    say(f"job {job_id}: attached ({shown} detaches; `ddpq attach {job_id}` comes back)")
    try:
        fds = (sys.stdin.fileno(), sys.stdout.fileno())
        outcome = relay.relay(sock, *fds, key, ends_with_input)
    except relay.CannotAttach as exc:
        common.fail(str(exc), 1)
    finally:
        sock.close()
    if outcome.detached:
        sys.stderr.write("\n")
        say(f"detached from job {job_id}, which runs on: `ddpq attach {job_id}` to return")
        return
    ended = _final(c, job_id)
    code = exit_status(outcome.exit_code, outcome.signal, ended)
    if ended is not None:
        say(f"job {job_id} ended: {ended['state']} ({ended.get('reason') or ''})")
    else:
        say(f"job {job_id} ended (status {code}); `ddpq show {job_id}` will have its record")
    raise typer.Exit(code)


def exit_status(code: int | None, sig: int | None, ended: dict[str, Any] | None) -> int:
    """What `ddpq shell` exits with: the status the shim told the terminal, else the job's
    record's (a terminal let go untold), else 1."""
    if code is None and sig is None and ended is not None:
        code, sig = ended.get("exit_code"), ended.get("exit_signal")
    return int(code) if code is not None else 128 + int(sig) if sig is not None else 1


def _connect(c: Any, job: dict[str, Any], relay: Any) -> Any:
    deadline = time.monotonic() + SOCKET_WAIT_S
    while True:
        try:
            return relay.connect(job["attach"])
        except relay.CannotAttach as exc:
            if not exc.waiting or time.monotonic() > deadline:
                common.fail(
                    f"cannot attach to job {job['id']}: {exc} (its terminal is served on the "
                    "daemon's host, to the account the job runs as)",
                    1,
                )
            last = exc
        time.sleep(0.1)
        job = c.show(job["id"])
        if job["state"] not in (*WAITING, "running"):
            raise EndedFirst(job)
        if job["state"] != "running" or not job.get("attach"):
            common.fail(f"job {job['id']} ended before its terminal could be attached ({last})", 1)


def _as_if_attached(c: Any, job: dict[str, Any]) -> None:
    """A session over before its terminal could be attached (a command that ends at once,
    `ddpq shell -- nvidia-smi`): what it wrote, from its log, and its exit status, as an
    attached session would have ended. One that never ran (cancelled while it waited, or
    refused at its start) has no output: that is said, exit 1."""
    job_id = job["id"]
    if job["state"] not in (*WAITING, "running"):
        job = _final(c, job_id) or job
    code, sig = job.get("exit_code"), job.get("exit_signal")
    reason = job.get("reason") or "no reason given"
    if code is None and sig is None:
        common.fail(f"job {job_id} has ended: {job['state']} ({reason})", 1)
    out = sys.stdout.buffer
    offset = 0
    while True:
        data, offset = c.log(job_id, offset)
        if not data:
            break
        # The log's own lines ("[ddpq] attempt started ...") are ddpq's, not the command's:
        # an attached terminal never shows them either.
        out.write(b"".join(x for x in data.splitlines(True) if not x.startswith(b"[ddpq] ")))
    out.flush()
    say(f"job {job_id} ended: {job['state']} ({reason})")
    raise typer.Exit(exit_status(code, sig, None))


def _final(c: Any, job_id: int) -> dict[str, Any] | None:
    """The session's record once the worker has it; None if not within END_WAIT_S or the
    daemon cannot say (the exit status came from the shim: it is what we exit with)."""
    from ddpq.client.api import DdpqError

    deadline = time.monotonic() + END_WAIT_S
    while time.monotonic() < deadline:
        try:
            job: dict[str, Any] = c.show(job_id)
        except DdpqError:
            return None
        if job["state"] not in (*WAITING, "running"):
            return job
        time.sleep(0.2)
    return None


def _key_name(key: int) -> str:
    return "Ctrl-?" if key == 0x7F else f"Ctrl-{chr(key ^ 0x40)}"
