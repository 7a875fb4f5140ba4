"""GPU reservations: anyone may list them; only an admin may make or remove one (it keeps
GPUs from everyone else's jobs). ``ddpq admin reserve`` writes the same rows locally."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query

from ddpq import wake
from ddpq.schemas import ReservationIn, ReservationList, ReservationOut
from ddpq.server import views
from ddpq.server.deps import Auth, Caller, DatabaseDep, SettingsDep
from ddpq.server.errors import WRITE_ERRORS, ApiError
from ddpq.server.params import INT64_MAX
from ddpq.store import devices as device_store
from ddpq.store import limits as limit_store

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])
ReservationId = Annotated[int, Path(ge=1, le=INT64_MAX)]


def reservation_out(row: limit_store.ReservationRow, now: float) -> ReservationOut:
    r = row.reservation
    return ReservationOut(
        id=r.id,
        user=views.servable(r.user),
        gpus=r.gpus,
        start=views.ts_req(r.start),
        end=views.ts_req(r.end),
        active=r.start <= now < r.end,
        created_at=views.ts_req(row.created_at),
        created_by=views.servable(row.created_by),
    )


@router.get("", response_model=ReservationList)
def list_reservations(
    _who: Auth, db: DatabaseDep, ended: Annotated[bool, Query()] = False
) -> ReservationList:
    """Reservations in force or to come, soonest first (``ended=true``: past ones too)."""
    now = time.time()
    with db.read() as s:
        rows = limit_store.list_reservations(s, now, ended=ended)
    return ReservationList(items=[reservation_out(r, now) for r in rows])


def _admin(who: Caller) -> None:
    if not who.admin:
        raise ApiError(403, "forbidden", "only an admin may reserve GPUs or remove a reservation")


@router.post("", status_code=201, response_model=ReservationOut, responses=WRITE_ERRORS)
def reserve(
    body: ReservationIn, who: Auth, settings: SettingsDep, db: DatabaseDep
) -> ReservationOut:
    _admin(who)
    now = time.time()
    with db.write() as s:
        try:
            row = limit_store.add_reservation(
                s,
                body.user,
                body.gpus,
                body.start.timestamp(),
                body.end.timestamp(),
                by=who.name,
                now=now,
                total_gpus=device_store.count(s),
            )
        except limit_store.ReservationRefused as exc:
            raise ApiError(422, "invalid", str(exc)) from None
    wake.nudge(settings.wake_socket)
    return reservation_out(row, now)


@router.delete("/{reservation_id}", response_model=ReservationOut, responses=WRITE_ERRORS)
def unreserve(
    reservation_id: ReservationId, who: Auth, settings: SettingsDep, db: DatabaseDep
) -> ReservationOut:
    _admin(who)
    now = time.time()
    with db.write() as s:
        rows = {r.reservation.id: r for r in limit_store.list_reservations(s, now, ended=True)}
        if reservation_id not in rows:
            raise ApiError(404, "not_found", f"no reservation {reservation_id}")
        limit_store.delete_reservation(s, reservation_id)
    wake.nudge(settings.wake_socket)
    return reservation_out(rows[reservation_id], now)
