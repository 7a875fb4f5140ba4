"""Sweeps: queue the product of parameters (or an array) over a job template in one call,
list them with their members' counts, show one with every member's parameters and final
metrics, and cancel, hold or release all of it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ddpq import wake
from ddpq.config import Settings
from ddpq.core import sweeps as core_sweeps
from ddpq.core.states import JobState
from ddpq.schemas import SweepAction, SweepDetail, SweepList, SweepOut, SweepSubmit
from ddpq.server import queue_caps, views
from ddpq.server.deps import Auth, Caller, DatabaseDep, NotifyLookupsDep, SettingsDep
from ddpq.server.errors import NO_ROOM, QUEUE_CAP, WRITE_ERRORS, ApiError, error_response
from ddpq.server.params import INT64_MAX, Offset
from ddpq.server.routes.jobs import job_spec
from ddpq.server.submission_checks import (
    check_gpus,
    check_hardware,
    refuse_if_disk_short,
    workload_command,
)
from ddpq.server.workload_data import check_members_data
from ddpq.store import notifications as notification_store
from ddpq.store import sweeps as sweep_store
from ddpq.store.db import Database, Session
from ddpq.store.dependencies import UnknownSweep
from ddpq.store.models import Sweep

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])

SweepId = Annotated[int, Path(ge=1, le=INT64_MAX)]
# "test_acc" lowest first, "-test_acc" highest first: a metric's name as jobs write them.
_SORT = re.compile(r"-?[A-Za-z0-9_.:/-]{1,64}")


@router.post(
    "", status_code=201, response_model=SweepOut, responses={**WRITE_ERRORS, **NO_ROOM, **QUEUE_CAP}
)
def submit(
    body: SweepSubmit,
    who: Auth,
    settings: SettingsDep,
    db: DatabaseDep,
    lookups: NotifyLookupsDep,
) -> SweepOut:
    """Queue every member in one transaction: all of them, or none (422 says why)."""
    t = body.template
    array = core_sweeps.parse_array(body.array) if body.array is not None else None
    members = core_sweeps.members(body.params, array)
    job = job_spec(t, who, settings, db, lookups, command=list(t.command))
    commands = _commands(body, members)  # the workload's parser accepts each member's args
    if t.workload is not None:
        args = _members_args(body, members)
        check_members_data(settings, db, t, job, args, body.params)
    built = [
        sweep_store.NewMember(m.index, core_sweeps.member_name(job.name, m), cmd, m.params)
        for m, cmd in zip(members, commands, strict=True)
    ]
    spec = sweep_store.NewSweep(
        job=job,
        # As sent, less the environment (a secret of the owner's, kept in the members'
        # rows as for any job) and the URL (a webhook's secret maybe, kept in the sweep's
        # notify_url alone): never in what a sweep's view may show.
        template=t.model_dump(mode="json", exclude={"env", "exported_env", "notify"}),
        params=body.params,
        array=body.array,
        max_running=body.max_running or (array.max_running if array else None),
        members=built,
    )
    refuse_if_disk_short(db)
    with db.write() as s:
        check_gpus(s, t.gpus_max or t.gpus, t.gpu_mem_bytes, settings)
        check_hardware(s, t.gpus, t.gpu_type, t.gpu_link)
        queue_caps.refuse_if_over(s, settings, job.owner, len(built))
        sweep = sweep_store.create_sweep(s, spec, time.time())
        out = views.sweep_out(sweep, sweep_store.counts(s, [sweep.id])[sweep.id])
    wake.nudge(settings.wake_socket)
    return out


def _commands(body: SweepSubmit, members: list[core_sweeps.Member]) -> list[list[str]]:
    """Each member's command: the template's with its placeholders filled in, or the
    workload's with the member's parameters as options, checked by the workload's parser."""
    t = body.template
    if t.workload is None:
        return [core_sweeps.fill(t.command, m) for m in members]
    workload = t.workload
    args = _members_args(body, members)
    if core_sweeps.placeholders(t.args):
        # {index} in the args: every member's differ, so each is checked.
        return [
            workload_command(workload, a, f"args of member {m.index}")
            for m, a in zip(members, args, strict=True)
        ]
    # The workload's parser checks each option on its own (no option depends on another),
    # so each value is checked once, not each combination: a 1,000-member sweep costs
    # as many parses as it has values. The first member is checked whole as well.
    base = core_sweeps.fill(t.args, members[0])  # {{x}} read as the members get it: {x}
    for name, values in body.params.items():
        for value in values:
            workload_command(workload, [*base, f"--{name}", value], f"params.{name}")
    first = workload_command(workload, args[0], "params")
    prefix = first[: len(first) - len(args[0])]
    return [[*prefix, *a] for a in args]


def _members_args(body: SweepSubmit, members: list[core_sweeps.Member]) -> list[list[str]]:
    """A workload's args as each member gets them: the template's, filled, and its
    parameters as options."""
    t = body.template
    return [[*core_sweeps.fill(t.args, m), *core_sweeps.workload_args(m)] for m in members]


@router.get("", response_model=SweepList)
def list_sweeps(
    _who: Auth,
    db: DatabaseDep,
    user: str | None = None,
    sweep_id: Annotated[
        list[Annotated[int, Query(ge=1, le=INT64_MAX)]] | None,
        Query(alias="id", max_length=1000, description="only these sweeps (repeatable)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> SweepList:
    """Sweeps oldest first, each with its members' counts by state."""
    with db.read() as s:
        rows, total = sweep_store.list_sweeps(
            s, owner=user, ids=sweep_id, limit=limit, offset=offset
        )
        counts = sweep_store.counts(s, [r.id for r in rows])
        items = [views.sweep_out(r, counts[r.id]) for r in rows]
    return SweepList(items=items, total=total, offset=offset, limit=limit)


@router.get("/{sweep_id}", response_model=SweepDetail)
def show(
    sweep_id: SweepId,
    _who: Auth,
    db: DatabaseDep,
    sort: Annotated[
        str | None,
        Query(
            max_length=65,
            description="a metric: 'test_loss' lowest first, '-test_acc' highest first; "
            "members without it come last",
        ),
    ] = None,
) -> SweepDetail:
    """Every member with its parameters, state and newest metrics (its final ones once it
    has ended), in index order or sorted by a metric."""
    if sort is not None and not _SORT.fullmatch(sort):
        raise ApiError(422, "invalid", "sort: a metric's name, with '-' in front for highest first")
    with db.read() as s:
        sweep = sweep_store.get_sweep(s, sweep_id)
        members = sweep_store.members(s, sweep_id)
        counts = sweep_store.counts(s, [sweep_id])[sweep_id]
        sent = notification_store.sweep_attempts_of(s, [sweep_id]).get(sweep_id, [])
    if sort is not None:
        members = sort_members(members, sort)
    return views.sweep_detail(sweep, counts, members, sort, sent)


def sort_members(members: list[sweep_store.MemberRow], sort: str) -> list[sweep_store.MemberRow]:
    """By a metric of the newest progress record; members without a number there last
    (in index order, whichever the direction)."""
    key = sort.removeprefix("-")
    descending = sort.startswith("-")

    def value(m: sweep_store.MemberRow) -> float | None:
        v = (m.progress or {}).get(key) if key != "index" else m.index
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    scored = [(v, m) for m in members if (v := value(m)) is not None]
    scored.sort(key=lambda vm: (-vm[0] if descending else vm[0], vm[1].index))
    rest = [m for m in members if value(m) is None]
    return [m for _, m in scored] + rest


@router.post("/{sweep_id}/cancel", response_model=SweepAction, responses=WRITE_ERRORS)
def cancel(sweep_id: SweepId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> SweepAction:
    """Cancel every member: waiting ones end now, running ones are stopped (SIGTERM,
    SIGKILL after the grace period), ended ones stay as they are."""

    def act(s: Session, sweep: Sweep) -> tuple[sweep_store.Acted, str]:
        acted = sweep_store.cancel_sweep(s, sweep.id, time.time())
        return acted, (
            f"cancelled {acted.changed} waiting member{_s(acted.changed)}; "
            f"stopping {acted.stopping} running"
        )

    return _on_sweep(settings, db, sweep_id, who, act)


@router.post("/{sweep_id}/hold", response_model=SweepAction, responses=WRITE_ERRORS)
def hold(sweep_id: SweepId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> SweepAction:
    """Hold every waiting member (running and ended ones are not affected)."""
    return _on_sweep(settings, db, sweep_id, who, _set_hold(True))


@router.post("/{sweep_id}/release", response_model=SweepAction, responses=WRITE_ERRORS)
def release(sweep_id: SweepId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> SweepAction:
    """Release every waiting member's hold (those with unmet dependencies stay held)."""
    return _on_sweep(settings, db, sweep_id, who, _set_hold(False))


Act = Callable[[Session, Sweep], tuple[sweep_store.Acted, str]]


def _set_hold(on: bool) -> Act:
    def act(s: Session, sweep: Sweep) -> tuple[sweep_store.Acted, str]:
        acted = sweep_store.set_sweep_hold(s, sweep.id, on, time.time())
        verb = "held" if on else "released"
        text = f"{verb} {acted.changed} waiting member{_s(acted.changed)}"
        if acted.untouched:
            text += f"; {acted.untouched} running or ended not affected"
        return acted, text

    return act


def _on_sweep(
    settings: Settings, db: Database, sweep_id: int, who: Caller, act: Act
) -> SweepAction:

    def write() -> tuple[sweep_store.Acted, str, dict[JobState, int]]:
        with db.write() as s:
            sweep = sweep_store.get_sweep(s, sweep_id)
            may_touch_sweep(who, sweep)
            acted, detail = act(s, sweep)
            return acted, detail, sweep_store.counts(s, [sweep_id])[sweep_id]

    # Cancel, hold and release: taken on a full disk too (store.headroom).
    acted, detail, counts = db.making_room(write)
    wake.nudge(settings.wake_socket)
    return SweepAction(
        id=sweep_id, changed=acted.changed, stopping=acted.stopping, detail=detail, counts=counts
    )


def may_touch_sweep(who: Caller, sweep: Sweep) -> None:
    """As ``deps.may_touch`` for a job: only the owner, or an admin (without --auth every
    caller is one)."""
    if not who.admin and who.name != sweep.owner:
        raise ApiError(
            403, "forbidden", f"sweep {sweep.id} belongs to {sweep.owner}, not {who.name}"
        )


def _s(n: int) -> str:
    return "" if n == 1 else "s"


async def _unknown_sweep(_r: Request, exc: UnknownSweep) -> Response:
    return error_response(404, "not_found", f"no sweep {exc.sweep_id}")


# Added to the app's handlers (create_app): a sweep named anywhere (here, or a job's
# after_sweeps) that does not exist is a 404, as an unknown job is.
HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    UnknownSweep: _unknown_sweep,
}
