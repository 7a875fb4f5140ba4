"""The commands on jobs already queued: `ls`, `show`, `logs`, `cancel`, `hold`, `release`,
`preempt` (`submit` queues them: ``client.submit``).

Each command imports what it needs when it runs (Rich only where it draws), so that
importing this module costs the other commands nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ddpq.client import listing
from ddpq.client.api import DdpqError, JsonApi
from ddpq.client.coercion import QuickCommand
from ddpq.client.common import ACTIVE_STATES, client, fail, print_json
from ddpq.client.format import safe

StateOpt = Annotated[list[str] | None, typer.Option("--state", "-s", help="only these states")]
RefsArg = Annotated[list[str], typer.Argument(metavar="ID...", help="job ids, or sN for sweeps")]


def ls(
    state: StateOpt = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="only this owner's jobs")] = None,
    mine: Annotated[bool, typer.Option(help="only my jobs")] = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="include finished jobs")] = False,
    expand: Annotated[bool, typer.Option(help="list each sweep's jobs, not one line")] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="rows in each table (default 100; 0: every job); with --json, jobs "
            "(default: every one)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The queue, oldest first (newest last, like squeue); a sweep is one line (sN). Past
    --limit rows, only your own are listed and everyone else's jobs are counted."""
    # The body is client.listing's, which client.quick also runs without Typer.
    listing.ls(state, user, mine, all_, expand, limit, as_json)


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
    target = parse_target(ref)
    if target.sweep:
        _show_sweep(target.id, sort, as_json)
    elif env:
        _show_env(target.id, as_json)
    else:
        _show_job(target.id, as_json)


def _show_job(job_id: int, as_json: bool) -> None:
    from ddpq.client.draw import render_job

    with client() as c:
        job = c.show(job_id)
        tail = b"" if as_json else c.log_tail(job_id)
    if as_json:
        print_json(job)
        return
    render_job(job, b"\n".join(tail.splitlines()[-10:]))


def _show_env(job_id: int, as_json: bool) -> None:
    from ddpq.client.draw import render_env

    with client() as c:
        variables = c.env(job_id)
    if as_json:
        print_json(variables)
    else:
        render_env(variables)


def _show_sweep(sweep_id: int, sort: str | None, as_json: bool) -> None:
    from ddpq.client.sweeps import render_sweep

    with client() as c:
        sw = c.sweep(sweep_id, sort)
    if as_json:
        print_json(sw)
    else:
        render_sweep(sw)


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
            from ddpq.client.reconnect import Staying, follow_log

            def write(chunk: bytes) -> None:
                out.write(chunk)
                out.flush()

            follow_log(c, job_id, write, Staying())
            return
        offset = 0
        while True:
            data, offset = c.log(job_id, offset)
            if not data:
                break
            out.write(data)
    out.flush()


def parse_target(value: str) -> Any:
    """A job id (12) or a sweep (s3) as the command line gave it; bad usage otherwise."""
    from ddpq.client.sweeps import BadRef, parse_ref

    try:
        return parse_ref(value)
    except BadRef as exc:
        fail(safe(str(exc)), 2)


def act(refs: list[str], on_job: Callable[[JsonApi, int], Any], verb: str) -> None:
    """``verb`` each job or sweep; one line each, the worst failure's exit code at the end."""
    from ddpq.client.sweeps import counts_text

    targets = [parse_target(r) for r in refs]
    worst = 0
    with client() as c:
        for target in targets:
            try:
                if target.sweep:
                    r = c.sweep_action(target.id, verb)
                    line = f"s{r['id']}: {safe(r['detail'])} ({counts_text(r['counts'])})"
                else:
                    r = on_job(c, target.id)
                    line = f"{r['id']}: {safe(r['state'])} ({safe(r['reason'])})"
            except DdpqError as exc:
                typer.echo(f"ddpq: {exc}", err=True)
                worst = max(worst, exc.exit_code)
                continue
            typer.echo(line)
    if worst:
        raise typer.Exit(worst)


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
        if mine:  # asked right, and nothing of theirs is left to cancel: not an error
            typer.echo("nothing to cancel")
            return
        fail("no job to cancel: give job IDs or --mine", 2)
    act(targets, lambda c, i: c.cancel(i), "cancel")


def hold(refs: RefsArg) -> None:
    """Keep queued jobs (or a sweep's) from starting until `ddpq release`."""
    act(refs, lambda c, i: c.hold(i, True), "hold")


def release(refs: RefsArg) -> None:
    """Let held jobs (or a sweep's) start."""
    act(refs, lambda c, i: c.hold(i, False), "release")


def preempt(job_ids: Annotated[list[int], typer.Argument(metavar="ID...")]) -> None:
    """Ask running preemptible jobs to checkpoint and go back to the queue (admins)."""
    act([str(i) for i in job_ids], lambda c, i: c.preempt(i), "preempt")


def register(app: typer.Typer) -> None:
    """Add these commands to the client's app, in the order `ddpq --help` lists them."""
    for name, command in (
        ("ls", ls),
        ("show", show),
        ("logs", logs),
        ("cancel", cancel),
        ("hold", hold),
        ("release", release),
        ("preempt", preempt),
    ):
        app.command(name, cls=QuickCommand)(command)
