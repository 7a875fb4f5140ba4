"""The body of `ddpq ls` (its options are declared in ``client.jobs``), with no Typer
to import: ``client.quick`` runs it straight from the command line's words, and so does
the Typer command. Rich's tables are imported only when drawn (``client.grid``)."""

from __future__ import annotations

from ddpq.client.format import safe
from ddpq.client.runtime import ACTIVE_STATES, client, echo, fail, print_json

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ddpq.client.api import JsonApi


def ls(
    state: list[str] | tuple[str, ...] | None,
    user: str | None,
    mine: bool,
    all_: bool,
    expand: bool,
    limit: int | None,
    as_json: bool,
) -> None:
    """`ddpq ls` (``client.jobs.ls`` declares its options): the queue, oldest first."""
    from ddpq.client.draw import jobs_table, show

    states = known_states(list(state or [])) or (None if all_ else ACTIVE_STATES)
    if not as_json and (limit or 0) > MAX_ROWS:
        fail(f"--limit: at most {MAX_ROWS:,} rows a table (0: every job, page after page)", 2)
    if as_json or limit == 0:
        _ls_every(states, user, mine, expand, limit, as_json)
        return
    with client() as c:
        # One request, whatever the queue holds: the daemon picks the rows and counts
        # the rest (``GET /v1/queue``).
        view = c.queue(states, user, mine, limit or DEFAULT_ROWS, expand)
    if view["jobs"] or not view["sweeps"]:  # the header alone says the queue is empty
        show(jobs_table(view["jobs"]))
    if view["sweeps"]:
        from ddpq.client.sweeps import sweeps_table  # (a module fewer for a queue without)

        show(sweeps_table(view["sweeps"]))
    line = hidden_text(view)
    if line:
        echo(line)


# Rows of each table `ddpq ls` asks for unless told (more than a screen, a bounded
# answer), and the most the daemon gives in one (``server.routes.queue.MAX_ROWS``).
DEFAULT_ROWS = 100
MAX_ROWS = 1000


def hidden_text(view: dict[str, Any]) -> str:
    """One line for the matching jobs that no row shows, by owner and state ("" if none)."""
    if not view["hidden"]:
        return ""
    from ddpq.client.sweeps import counts_text

    parts = [f"{safe(h['owner'])} {safe(counts_text(h['counts']))}" for h in view["hidden"]]
    owner = view.get("only_owner")
    why = f"only {safe(owner)}'s are listed, {view['limit']} at most; " if owner else ""
    return f"not listed ({why}--user NAME or --limit 0 for more): " + "; ".join(parts)


def _first(c: JsonApi, states: list[str] | None, user: str | None, limit: int) -> list[Any]:
    """The ``limit`` oldest matching jobs (the queue's head), or with finished ones asked
    for (``--all``) the newest, as the table picks them; a page of at most 1,000 at a time."""
    start = 0
    if states is None or any(s not in ACTIVE_STATES for s in states):
        start = max(0, c.list(states, user, limit=1, offset=0)["total"] - limit)
    jobs: list[Any] = []
    while len(jobs) < limit:
        offset = start + len(jobs)
        page = c.list(states, user, limit=min(1000, limit - len(jobs)), offset=offset)
        jobs += page["items"]
        if not page["items"] or offset + len(page["items"]) >= page["total"]:
            break
    return jobs


def _ls_every(
    states: list[str] | None,
    user: str | None,
    mine: bool,
    expand: bool,
    limit: int | None,
    as_json: bool,
) -> None:
    """Every matching job, page after page (--json, --limit 0): what a script asked for,
    at what it costs. With --json and --limit N, the N oldest."""
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.draw import jobs_table, show

    with client() as c:
        if mine:
            user = c.whoami()["name"]
        jobs = _first(c, states, user, limit) if as_json and limit else c.list_all(states, user)
        plain, sweep_ids = (jobs, []) if expand or as_json else sweep_cli.fold(jobs)
        sweeps = c.sweeps(sweep_ids) if sweep_ids else []
    if as_json:
        print_json(jobs)
        return
    if plain or not sweeps:
        show(jobs_table(plain))
    if sweeps:
        show(sweep_cli.sweeps_table(sweeps))


def known_states(given: list[str] | None) -> list[str]:
    """``--state`` values as the API names them; one that is no state is bad usage (exit 2),
    said in one line before any request."""
    from ddpq.core.states import ATTEMPT_ONLY, JobState

    names = [s.value for s in JobState if s not in ATTEMPT_ONLY]
    wanted = [s.strip().lower() for s in given or []]
    for name in wanted:
        if name not in names:
            fail(f"--state: {safe(name)!r} is not one of {', '.join(names)}", 2)
    return wanted
