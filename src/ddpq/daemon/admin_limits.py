"""``ddpq admin limit`` and ``ddpq admin reserve`` / ``unreserve``: per-user limits and GPU
reservations, written to the state folder's database (``core.limits`` says what they do).
Imports only Typer until a command runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpq.daemon.commands import ConfigOpt, HomeOpt, ShowsSettingsDefaults, fail, not_found


def _count(option: str, value: str | None) -> int | None:
    """A limit as given: a whole number, or "none" to lift it."""
    assert value is not None
    text = value.strip().lower()
    if text in ("none", "unlimited"):
        return None
    if not text.isdigit():
        fail(f"{option}: {value!r} is not a number of {option[2:]} (or none)", 2)
    return int(text)


def _when(at: float) -> str:
    from datetime import datetime

    from ddpq.core.finite import showable

    return f"{datetime.fromtimestamp(showable(at)):%Y-%m-%d %H:%M}"


def _nudge(home: Path | None, config: Path | None, settings_of: Callable[..., Any]) -> None:
    """Tell a running worker to plan again now (it would within a second anyway)."""
    from ddpq import wake

    wake.nudge(settings_of({"home": home}, config).wake_socket)


def register(
    app: typer.Typer, admin_db: Callable[..., Any], settings_of: Callable[..., Any]
) -> None:
    """Add these commands to ``ddpq admin`` (``admin_db``: the state folder's database)."""

    @app.command("limit", cls=ShowsSettingsDefaults)
    def limit(
        user: Annotated[str | None, typer.Argument(help="the user (leave out to list)")] = None,
        default: Annotated[
            bool, typer.Option("--default", help="the limit for everyone without their own")
        ] = False,
        gpus: Annotated[
            str | None, typer.Option(metavar="N|none", help="most GPUs their jobs hold at once")
        ] = None,
        jobs: Annotated[
            str | None,
            typer.Option(
                metavar="N|none", help="most of their jobs running (holding leases) at once"
            ),
        ] = None,
        clear: Annotated[bool, typer.Option(help="remove the user's own limit")] = False,
        home: HomeOpt = None,
        config: ConfigOpt = None,
    ) -> None:
        """Limit a user's jobs: `ddpq admin limit alice --gpus 4 --jobs 10`, or everyone's
        with --default. The planner never starts a job past its owner's limit; the job
        waits, and its reason names the limit. `none` lifts one; alone, lists the limits."""
        _set_limit(admin_db, settings_of, user, default, gpus, jobs, clear, home, config)

    @app.command("reserve", cls=ShowsSettingsDefaults)
    def reserve(
        gpus: Annotated[int, typer.Option(help="how many GPUs to keep", min=1)],
        user: Annotated[str, typer.Option(help="whose jobs they are kept for")],
        start: Annotated[
            str, typer.Option(help="now, +2h, or a local time: 2026-12-03 09:00 (ISO 8601)")
        ],
        end: Annotated[str, typer.Option(help="+8h (after the start) or a time")],
        home: HomeOpt = None,
        config: ConfigOpt = None,
    ) -> None:
        """Keep GPUs for a user's jobs in a window. Before it, other jobs may use them only
        if their time limit ends before it starts; in it, only the user's jobs get them.
        Jobs already running are not stopped. Listed by `ddpq reservations`."""
        _reserve(admin_db, settings_of, gpus, user, start, end, home, config)

    @app.command("unreserve", cls=ShowsSettingsDefaults)
    def unreserve(
        reservation_id: Annotated[int, typer.Argument(help="as `ddpq reservations` lists it")],
        home: HomeOpt = None,
        config: ConfigOpt = None,
    ) -> None:
        """Remove a reservation: its GPUs go back to everyone."""
        from ddpq.store import limits as limit_store

        db = admin_db(home, config)
        try:
            with db.write() as s:
                limit_store.delete_reservation(s, reservation_id)
        except LookupError as exc:
            fail(not_found(exc), 4)
        finally:
            db.dispose()
        typer.echo(f"removed reservation {reservation_id}")
        _nudge(home, config, settings_of)


def _set_limit(
    admin_db: Callable[..., Any],
    settings_of: Callable[..., Any],
    user: str | None,
    default: bool,
    gpus: str | None,
    jobs: str | None,
    clear: bool,
    home: Path | None,
    config: Path | None,
) -> None:
    """``ddpq admin limit``: set, clear or list (no user) the limits."""
    from ddpq.core.limits import EVERYONE
    from ddpq.schemas import NAME_RE
    from ddpq.store import limits as limit_store

    if user is not None and default:
        fail("give a user or --default, not both", 2)
    who = EVERYONE if default else user
    if who is None:
        if gpus is not None or jobs is not None or clear:
            fail("give a user, or --default", 2)
        _list_limits(admin_db(home, config))
        return
    if who != EVERYONE and not NAME_RE.match(who):
        fail("a user name is 1-64 letters, digits, '.', '_' or '-'", 2)
    changes = {}
    if gpus is not None:
        changes["gpus"] = _count("--gpus", gpus)
    if jobs is not None:
        changes["jobs"] = _count("--jobs", jobs)
    if clear and changes:
        fail("--clear removes the whole limit; give it alone", 2)
    if not clear and not changes:
        fail("give --gpus, --jobs or --clear", 2)
    db = admin_db(home, config)
    try:
        with db.write() as s:
            if clear:
                limit_store.clear_limit(s, who)
                now_limit = None
            else:
                now_limit = limit_store.set_limit(s, who, changes, time.time())
    finally:
        db.dispose()
    name = "everyone" if who == EVERYONE else who
    if now_limit is None:
        typer.echo(f"{name}: no limit of their own" if who != EVERYONE else "no default")
    else:
        typer.echo(f"{name}: {_limit_text(now_limit.gpus, now_limit.jobs)}")
    _nudge(home, config, settings_of)


def _reserve(
    admin_db: Callable[..., Any],
    settings_of: Callable[..., Any],
    gpus: int,
    user: str,
    start: str,
    end: str,
    home: Path | None,
    config: Path | None,
) -> None:
    """``ddpq admin reserve``: keep ``gpus`` for ``user`` from ``start`` to ``end``."""
    import getpass

    from ddpq.core.units import parse_when
    from ddpq.schemas import NAME_RE
    from ddpq.store import devices as device_store
    from ddpq.store import limits as limit_store

    if not NAME_RE.match(user):
        fail("--user: a user name is 1-64 letters, digits, '.', '_' or '-'", 2)
    now = time.time()
    try:
        begins = parse_when(start, now)
        ends = parse_when(end, now, after=begins)
    except ValueError as exc:
        fail(f"--start/--end: {exc}", 2)
    db = admin_db(home, config)
    try:
        with db.write() as s:
            total = device_store.count(s)
            if not total:
                fail("no GPUs known yet: start the daemon once, so that it finds them", 1)
            row = limit_store.add_reservation(
                s, user, gpus, begins, ends, by=getpass.getuser(), now=now, total_gpus=total
            )
    except limit_store.ReservationRefused as exc:
        fail(str(exc), 1)
    finally:
        db.dispose()
    r = row.reservation
    typer.echo(
        f"reservation {r.id}: {gpus} GPU{'' if gpus == 1 else 's'} for {user} "
        f"from {_when(r.start)} to {_when(r.end)}"
    )
    _nudge(home, config, settings_of)


def _limit_text(gpus: int | None, jobs: int | None) -> str:
    parts = []
    if gpus is not None:
        parts.append(f"at most {gpus} GPU{'' if gpus == 1 else 's'}")
    if jobs is not None:
        parts.append(f"at most {jobs} running job{'' if jobs == 1 else 's'}")
    return ", ".join(parts) or "no limit"


def _list_limits(db: Any) -> None:
    from ddpq.core.limits import EVERYONE
    from ddpq.store import limits as limit_store

    try:
        with db.read() as s:
            limits = limit_store.limits(s)
    finally:
        db.dispose()
    d = limits.default
    typer.echo(f"{'(default)':<16}  {_limit_text(d.gpus, d.jobs)}")
    for user in sorted(limits.per_owner):
        if user != EVERYONE:
            own = limits.of(user)
            typer.echo(f"{user:<16}  {_limit_text(own.gpus, own.jobs)}")
