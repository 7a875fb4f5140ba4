"""`ddpq update` (change a waiting job, or a running job's time limit, as `scontrol
update` does) and `ddpq restart` (queue a job that ran again, as pueue's `restart`, with
changes on the way). The daemon judges what may change (``core.edits``); a refusal is
its one line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ddpq.client.coercion import QuickCommand
from ddpq.client.common import client, fail, print_json
from ddpq.client.submission import usage_if_refused

JobArg = Annotated[int, typer.Argument(metavar="ID", help="the job's id")]
PriorityOpt = Annotated[int | None, typer.Option(help="higher starts first")]
TimeLimitOpt = Annotated[
    str | None,
    typer.Option(
        metavar="T", help="e.g. 30m, 2h, or none; a running job's owner may only lower it"
    ),
]
GpusOpt = Annotated[int | None, typer.Option("--gpus", "-g", help="number of GPUs")]
NameOpt = Annotated[str | None, typer.Option("--name", "-n")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the daemon's whole answer")]


def changes_of(
    priority: int | None, time_limit: str | None, gpus: int | None, name: str | None
) -> dict[str, Any]:
    """The API's fields for the options given (bad usage where one cannot be read)."""
    from ddpq.client.format import sanitize
    from ddpq.core.units import parse_duration

    out: dict[str, Any] = {}
    if priority is not None:
        out["priority"] = priority
    if gpus is not None:
        out["gpus"] = gpus
    if name is not None:
        out["name"] = name
    if time_limit is not None:
        if time_limit.strip().lower() in ("none", "unlimited", "infinite"):
            out["no_time_limit"] = True
        else:
            try:
                out["time_limit_s"] = parse_duration(time_limit)
            except ValueError as exc:
                fail(f"--time-limit: {sanitize(str(exc))}", 2)
    return out


def update(
    job_id: JobArg,
    priority: PriorityOpt = None,
    time_limit: TimeLimitOpt = None,
    gpus: GpusOpt = None,
    name: NameOpt = None,
    hold: Annotated[bool, typer.Option("--hold", help="hold it")] = False,
    release: Annotated[bool, typer.Option("--release", help="release it")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Change a queued or held job: `ddpq update 12 --priority 5 --gpus 2 --time-limit 1h`.

    A running job changes only its time limit (lower it; an admin may raise it)."""
    from ddpq.client.format import safe

    if hold and release:
        fail("--hold and --release: give one", 2)
    changes = changes_of(priority, time_limit, gpus, name)
    if hold or release:
        changes["hold"] = hold
    if not changes:
        fail(
            "nothing to change: give --priority, --time-limit, --gpus, --name, --hold or --release",
            2,
        )
    with client() as c, usage_if_refused():
        out = c.update(job_id, changes)
    if as_json:
        print_json(out)
        return
    why = f" ({safe(out['reason'])})" if out["reason"] else ""
    typer.echo(f"{out['id']}: {safe(out['state'])}{why}")


def restart(
    job_id: JobArg,
    priority: PriorityOpt = None,
    time_limit: TimeLimitOpt = None,
    gpus: GpusOpt = None,
    name: NameOpt = None,
    hold: Annotated[bool, typer.Option("--hold", help="queue it held")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Queue a job that ran (or runs) again, as it was submitted, and print the new id:
    `ddpq restart 12 --gpus 4`. It waits for nothing the first one waited for."""
    changes = changes_of(priority, time_limit, gpus, name)
    if hold:
        changes["hold"] = True
    with client() as c, usage_if_refused():
        out = c.restart(job_id, changes)
    if as_json:
        print_json(out)
    else:
        typer.echo(out["id"])


def register(app: typer.Typer) -> None:
    """Add `ddpq update` and `ddpq restart` to the client's app."""
    app.command("update", cls=QuickCommand)(update)
    app.command("restart", cls=QuickCommand)(restart)
