"""The client's commands of the ``ddpq`` command line (Typer + Rich): submit, ls, show, ...

``ddpq.entry`` puts them together with the daemon's commands (``ddpq.daemon``), which this
package never imports. Exit codes: 0 success; 1 the daemon refused the request; 2 bad usage
or configuration; 3 the daemon cannot be reached; 4 no such job; 5 not allowed (missing or
wrong token, someone else's job); 130 interrupted.

Quick as the shell: the commands speak to the daemon through ``JsonApi`` (the standard
library's HTTP, the answers as plain JSON) and draw from that JSON, so none imports httpx or
pydantic; Rich is imported by the commands that draw, and each imports what it needs when
it runs (`python -X importtime -m ddpq ls` shows what is left; bench/cli_latency.py times it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ddpq.client import sessions, sharing, tokens, usage
from ddpq.client.api import DEFAULT_URL, DdpqError, JsonApi
from ddpq.client.coercion import QuickCommand, QuickGroup
from ddpq.client.credentials import connection
from ddpq.client.draw import console, gpu_table, jobs_table, render_env, render_job
from ddpq.core.states import TERMINAL, JobState

app = typer.Typer(
    name="ddpq",
    help="A GPU job queue for a shared training server: disjoint GPUs and a rendezvous "
    "port for every PyTorch DDP job.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Options read without pydantic: see client.coercion.
    cls=QuickGroup,
)

_OPTS: dict[str, Any] = {"url": None, "token": None, "debug": False}
# What `ls`, `watch` and `cancel --mine` mean by unfinished.
ACTIVE_STATES = [state.value for state in JobState if state not in TERMINAL]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"ddpq: {message}", err=True)
    raise typer.Exit(code)


def client() -> JsonApi:
    url, token = connection(_OPTS["url"], _OPTS["token"])  # a token only where it belongs
    return JsonApi(url, token)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.callback()
def global_options(
    url: Annotated[
        str | None,
        typer.Option(
            help="daemon URL, or unix:/path for its socket (default $DDPQ_URL, else the "
            f"daemon's socket on this machine, else {DEFAULT_URL})"
        ),
    ] = None,
    token: Annotated[str | None, typer.Option(help="API token (default $DDPQ_TOKEN)")] = None,
    debug: Annotated[bool, typer.Option(help="show tracebacks")] = False,
) -> None:
    _OPTS.update(url=url, token=token, debug=debug)


# ---- jobs -------------------------------------------------------------------


@app.command(
    cls=QuickCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def submit(
    ctx: typer.Context,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="number of GPUs")] = 0,
    name: Annotated[str | None, typer.Option("--name", "-n")] = None,
    priority: Annotated[int, typer.Option(help="higher starts first")] = 0,
    time_limit: Annotated[str | None, typer.Option(help="e.g. 30m, 2h; then timed_out")] = None,
    retries: Annotated[int, typer.Option(help="requeue a failed job up to N times")] = 0,
    after: Annotated[
        list[str] | None,
        typer.Option(
            help="start only after job ID (or every member of sweep sN) succeeded (repeatable)"
        ),
    ] = None,
    hold: Annotated[bool, typer.Option(help="queue it held until `ddpq release`")] = False,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, over --export")
    ] = None,
    export: Annotated[
        str,
        typer.Option(
            metavar="ALL|NONE|NAME,...",
            help="which of your environment variables the job gets: ALL, NONE (a minimal "
            "PATH, HOME, USER, LOGNAME, LANG) or NAME,NAME,... (those and the minimal ones); "
            "never terminal-only ones (SSH_AUTH_SOCK, DISPLAY, TERM, ...) nor ddpq's own",
        ),
    ] = "ALL",
    torchrun: Annotated[
        bool, typer.Option(help="run CMD (a script) under torchrun on the leased GPUs and port")
    ] = False,
    cwd: Annotated[Path | None, typer.Option(help="working directory (default: here)")] = None,
    notify: Annotated[
        str | None, typer.Option(metavar="URL", help="POST a JSON message here when it ends")
    ] = None,
    preemptible: Annotated[
        bool, typer.Option(help="it may be asked to checkpoint and requeue (docs/preemption.md)")
    ] = False,
    preempt_signal: Annotated[
        str | None, typer.Option(metavar="SIG", help="the signal that asks it (default USR1)")
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=V1,V2,...",
            help="queue one job per combination (repeatable; {NAME} in a command)",
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(metavar="0-99[:STEP][%K]", help="an array of jobs ({index} in a command)"),
    ] = None,
    max_running: Annotated[
        int | None, typer.Option(help="at most this many of the sweep's jobs at once")
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Slurm: hosts it spans")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="Slurm: GPUs on each node (with --nodes)")
    ] = None,
    partition: Annotated[str | None, typer.Option(help="Slurm: the partition")] = None,
    slurm_opt: Annotated[
        list[str] | None,
        typer.Option(metavar="--NAME=VALUE", help="Slurm: an extra #SBATCH option (repeatable)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the job as JSON")] = False,
    gpu_mem: sharing.GpuMemOpt = None,
    gpu_share: sharing.GpuShareOpt = None,
) -> None:
    """Queue a job: `ddpq submit --gpus 2 -- python train.py` or `ddpq submit resnet18 --gpus 2`.

    The job runs with your environment (your venv's or conda env's python, PYTHONPATH,
    your variables; see --export) in this directory. Built-in workloads take their own
    options after the name, e.g. `ddpq submit resnet18 --gpus 2 --epochs 5 --synthetic 5000`.
    With --sweep or --array it queues a sweep (printed as sN): `--sweep lr=0.05,0.1`
    gives a workload `--lr 0.05` and `--lr 0.1`, a command `{lr}`.
    """
    from ddpq.client import submission
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.format import sanitize
    from ddpq.core.units import parse_duration

    argv = list(ctx.args)
    if not argv:
        fail("nothing to run: give a command after `--` or a workload name", 2)
    if argv[0].startswith("-"):
        known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        fail(sanitize(submission.unknown_option(argv[0], known)), 2)
    try:
        env_map = submission.env_pairs(env or [])
        exported, undecodable = submission.exported_env(export, os.environ)
        waits = sweep_cli.parse_refs(after or [])
        memory = sharing.submit_fields(gpu_mem, gpu_share)
    except (submission.BadOption, sweep_cli.BadRef, sharing.BadOption) as exc:
        fail(sanitize(str(exc)), 2)
    if undecodable:
        typer.echo(
            "ddpq: warning: left out of the job's environment (not UTF-8): "
            + sanitize(", ".join(undecodable)),
            err=True,
        )
    # Only what differs from the API's defaults travels (as `exclude_defaults` would).
    fields: dict[str, Any] = {
        "gpus": gpus,
        "name": name,
        "priority": priority,
        "retries": retries,
        "after": [r.id for r in waits if not r.sweep],
        "after_sweeps": [r.id for r in waits if r.sweep],
        "hold": hold,
        "env": env_map,
        "torchrun": torchrun,
        "notify": notify,
        "preemptible": preemptible,
        "preempt_signal": preempt_signal,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "partition": partition,
        "slurm_options": slurm_opt or [],
    }
    fields = {k: v for k, v in fields.items() if v}
    fields.update(memory)
    fields["cwd"] = str((cwd or Path.cwd()).resolve())
    fields["exported_env"] = exported
    from ddpq.workloads.registry import WORKLOADS

    workload = None
    if argv[0] in WORKLOADS and "--" not in sys.argv:
        workload = argv[0]
        fields.update(workload=workload, args=argv[1:])
        fields.pop("torchrun", None)
    else:
        fields["command"] = argv
    # `is not None`: an explicitly empty `--time-limit ""` (an unset shell variable) is a
    # mistake to report, not a request for no limit.
    if time_limit is not None:
        try:
            fields["time_limit_s"] = parse_duration(time_limit)
        except ValueError as exc:
            fail(f"--time-limit: {sanitize(str(exc))}", 2)
    many = bool(sweep) or array is not None
    if max_running is not None and not many:
        fail("--max-running: only with --sweep or --array", 2)
    try:
        body = sweep_cli.sweep_body(fields, sweep or [], array, max_running) if many else fields
    except sweep_cli.BadRef as exc:
        fail(sanitize(str(exc)), 2)
    with client() as c:
        try:
            out = c.submit_sweep(body) if many else c.submit(body)
        except DdpqError as exc:
            if exc.status != 422:
                raise
            # The daemon validates submissions: a 422 is bad usage, said as the options.
            fail(submission.refusal(exc.detail, workload), 2)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"{sweep_cli.SWEEP_PREFIX}{out['id']}" if many else out["id"])


StateOpt = Annotated[list[str] | None, typer.Option("--state", "-s", help="only these states")]


@app.command("ls", cls=QuickCommand)
def ls(
    state: StateOpt = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="only this owner's jobs")] = None,
    mine: Annotated[bool, typer.Option(help="only my jobs")] = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include finished jobs")] = False,
    expand: Annotated[bool, typer.Option(help="list each sweep's jobs, not one line")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The queue, oldest first (newest last, like squeue); a sweep is one line (sN)."""
    from ddpq.client import sweeps as sweep_cli

    states = state or (None if all_ else ACTIVE_STATES)
    with client() as c:
        if mine:
            user = c.whoami()["name"]
        jobs = c.list_all(states=states, user=user)
        plain, sweep_ids = (jobs, []) if expand or as_json else sweep_cli.fold(jobs)
        sweeps = c.sweeps(sweep_ids) if sweep_ids else []
    if as_json:
        print_json(jobs)
        return
    if plain or not sweeps:  # the header alone says the queue is empty
        console().print(jobs_table(plain))
    if sweeps:
        console().print(sweep_cli.sweeps_table(sweeps))


@app.command(cls=QuickCommand)
def show(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a job id, or sN for a sweep")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
    sort: Annotated[
        str | None,
        typer.Option(metavar="[-]METRIC", help="a sweep's jobs by a metric (-: highest first)"),
    ] = None,
    env: Annotated[
        bool,
        typer.Option(
            "--env", help="only the variables it was submitted with (yours or an admin's to read)"
        ),
    ] = False,
) -> None:
    """Everything about one job (state history, leases, attempts, progress, log tail), or
    about one sweep (each job's parameters, state and metrics)."""
    target = _ref(ref)
    if target.sweep:
        _show_sweep(target.id, sort, as_json)
        return
    job_id = target.id
    with client() as c:
        if env:
            variables = c.env(job_id)
            if as_json:
                print_json(variables)
            else:
                render_env(variables)
            return
        job = c.show(job_id)
        tail = b"" if as_json else c.log_tail(job_id)
    if as_json:
        print_json(job)
        return
    render_job(job, b"\n".join(tail.splitlines()[-10:]))


@app.command(cls=QuickCommand)
def logs(
    job_id: int,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="follow until the job ends")
    ] = False,
) -> None:
    """Print a job's output (stdout and stderr together)."""
    out = sys.stdout.buffer
    with client() as c:
        if follow:
            for chunk in c.follow_log(job_id):
                out.write(chunk)
                out.flush()
            return
        offset = 0
        while True:
            data, offset = c.log(job_id, offset)
            if not data:
                break
            out.write(data)
    out.flush()


def _safe(value: object) -> str:
    from ddpq.client.format import sanitize, text

    return sanitize(text(value))


def _ref(value: str) -> Any:
    from ddpq.client.sweeps import BadRef, parse_ref

    try:
        return parse_ref(value)
    except BadRef as exc:
        fail(_safe(str(exc)), 2)


def _show_sweep(sweep_id: int, sort: str | None, as_json: bool) -> None:
    from ddpq.client.sweeps import render_sweep

    with client() as c:
        sw = c.sweep(sweep_id, sort)
    if as_json:
        print_json(sw)
    else:
        render_sweep(sw)


def _act(refs: list[str], on_job: Callable[[JsonApi, int], Any], verb: str) -> None:
    """``verb`` each job or sweep; one line each, the worst failure's exit code at the end."""
    from ddpq.client.sweeps import counts_text

    targets = [_ref(r) for r in refs]
    worst = 0
    with client() as c:
        for target in targets:
            try:
                if target.sweep:
                    r = c.sweep_action(target.id, verb)
                    line = f"s{r['id']}: {_safe(r['detail'])} ({counts_text(r['counts'])})"
                else:
                    r = on_job(c, target.id)
                    line = f"{r['id']}: {_safe(r['state'])} ({_safe(r['reason'])})"
            except DdpqError as exc:
                typer.echo(f"ddpq: {exc}", err=True)
                worst = max(worst, exc.exit_code)
                continue
            typer.echo(line)
    if worst:
        raise typer.Exit(worst)


RefsArg = Annotated[list[str], typer.Argument(metavar="ID...", help="job ids, or sN for sweeps")]


@app.command(cls=QuickCommand)
def cancel(
    refs: Annotated[
        list[str] | None, typer.Argument(metavar="[ID...]", help="job ids, or sN for sweeps")
    ] = None,
    mine: Annotated[bool, typer.Option(help="cancel all my unfinished jobs")] = False,
) -> None:
    """Cancel jobs or sweeps: queued jobs end at once, running ones get SIGTERM then SIGKILL."""
    targets = list(refs or [])
    if mine:
        with client() as c:
            me = c.whoami()["name"]
            targets += [str(j["id"]) for j in c.list_all(states=ACTIVE_STATES, user=me)]
    if not targets:
        fail("no job to cancel: give job IDs or --mine", 2)
    _act(targets, lambda c, i: c.cancel(i), "cancel")


@app.command("hold", cls=QuickCommand)
def hold_cmd(refs: RefsArg) -> None:
    """Keep queued jobs (or a sweep's) from starting until `ddpq release`."""
    _act(refs, lambda c, i: c.hold(i, True), "hold")


@app.command("release", cls=QuickCommand)
def release_cmd(refs: RefsArg) -> None:
    """Let held jobs (or a sweep's) start."""
    _act(refs, lambda c, i: c.hold(i, False), "release")


@app.command(cls=QuickCommand)
def preempt(job_ids: Annotated[list[int], typer.Argument(metavar="ID...")]) -> None:
    """Ask running preemptible jobs to checkpoint and go back to the queue (admins)."""
    _act([str(i) for i in job_ids], lambda c, i: c.preempt(i), "preempt")


@app.command(cls=QuickCommand)
def gpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every GPU: who holds it (job, owner, since when), memory, outside processes."""
    with client() as c:
        devs = c.devices()
    if as_json:
        print_json(devs)
        return
    console().print(gpu_table(devs))


@app.command(cls=QuickCommand)
def watch(
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 1.0,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include finished jobs")] = False,
) -> None:
    """A live view of the queue and the GPU map, with progress bars. Ctrl-C to leave."""
    from rich.live import Live

    from ddpq.client.watchview import render

    with client() as c, Live(console=console(), auto_refresh=False, screen=False) as live:
        try:
            while True:
                states = None if all_ else ACTIVE_STATES
                jobs = c.list_all(states=states)
                live.update(render(jobs, c.devices()), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            return


app.command("usage", cls=QuickCommand)(usage.usage)
sessions.register(app)  # shell, attach


@app.command(cls=QuickCommand)
def login(
    token: Annotated[
        str | None,
        typer.Argument(
            help="the token `ddpq token create` (or the admin) printed; better left out: an "
            "argument shows in `ps` and your shell history, so paste it at the prompt or pipe "
            "it in"
        ),
    ] = None,
) -> None:
    """Save your API token (0600) in your config folder with the daemon it is for (--url or
    $DDPQ_URL), which alone it goes to: paste it, or `... | ddpq login`."""
    from ddpq.client.credentials import check_token, login_url, save_login

    url = login_url(_OPTS["url"])

    if token is not None:
        # Kept so that existing scripts work, but anyone on the machine can read a command
        # line (`ps`), and the shell keeps it in its history.
        typer.echo(
            "ddpq: warning: a token given as an argument is visible to other users (ps) and "
            "kept in your shell history; run `ddpq login` and paste it, or pipe it in",
            err=True,
        )
    else:
        token = _read_token()
    path = save_login(url, check_token(token))
    typer.echo(f"token for {url} saved to {path}")


def _read_token() -> str:
    """The token from a hidden prompt on a terminal, else from standard input."""
    import getpass

    if sys.stdin is None:
        return ""
    if sys.stdin.isatty():
        try:
            return getpass.getpass("token: ")
        except EOFError:  # Ctrl-D at the prompt
            return ""
    # A token is one short line; a bound keeps a mistaken `ddpq login < big.file` cheap.
    return sys.stdin.read(4096)


@app.command(cls=QuickCommand)
def whoami(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Who the daemon thinks you are, how it knows (the Unix socket, a token), and which
    path this client took."""
    from ddpq.client.whoami import describe

    with client() as c:
        me = {**c.whoami(), "url": c.url}
    if as_json:
        print_json(me)
        return
    typer.echo("\n".join(describe(me, me["url"])))


app.add_typer(tokens.app, name="token")


@app.command(cls=QuickCommand)
def version() -> None:
    """Print ddpq's version."""
    from ddpq import __version__

    typer.echo(__version__)


sharing.register(app, client, print_json, QuickCommand)


def run(cli: Callable[[], object]) -> None:
    """Run the command line: a ``DdpqError`` is one line on stderr and its exit code."""
    try:
        cli()
    except DdpqError as exc:
        if _OPTS["debug"]:
            raise
        typer.echo(f"ddpq: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        # JSON of another shape than the daemon's (a missing key, a list for an object,
        # a string for a number), met wherever a command reads it: one line, not a trace.
        if _OPTS["debug"]:
            raise
        from ddpq.client.errors import unreadable_answer

        typer.echo(f"ddpq: {unreadable_answer(exc)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
