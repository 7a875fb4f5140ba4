"""Per-user limits and GPU reservations (``core.limits``). Flush, never commit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from ddpq.core.finite import FIRST_MOMENT, LAST_MOMENT
from ddpq.core.limits import EVERYONE, Limit, Limits, Reservation, peak_reserved
from ddpq.store.columns import flushed
from ddpq.store.models import GpuReservation, UserLimit

# ---- limits ---------------------------------------------------------------------------


def set_limit(
    session: Session, user: str, changes: Mapping[str, int | None], now: float
) -> Limit | None:
    """Change ``user``'s limit (``EVERYONE``: the default): ``changes`` maps "gpus" and
    "jobs" to a number, or None to lift that one. Returns the limit as it now stands (None:
    the user has none of their own any more)."""
    unknown = set(changes) - {"gpus", "jobs"}
    if unknown:
        raise ValueError(f"no such limit: {', '.join(sorted(unknown))}")
    for name, value in changes.items():
        if value is not None and value < 0:
            raise ValueError(f"--{name} must be 0 or more")
    row = session.get(UserLimit, user)
    gpus = changes.get("gpus") if "gpus" in changes else (row.max_gpus if row else None)
    jobs = changes.get("jobs") if "jobs" in changes else (row.max_jobs if row else None)
    if gpus is None and jobs is None:
        if row is not None:
            session.delete(row)
            session.flush()
        return None
    if row is None:
        row = UserLimit(user=user)
        session.add(row)
    row.max_gpus, row.max_jobs, row.updated_at = gpus, jobs, now
    session.flush()
    return Limit(gpus, jobs)


def clear_limit(session: Session, user: str) -> bool:
    """Remove ``user``'s own limit (the default applies again); False if there was none."""
    result = session.execute(delete(UserLimit).where(UserLimit.user == user))
    return bool(getattr(result, "rowcount", 0))


def limits(session: Session) -> Limits:
    """Every limit, as the planner takes them (read on every pass: one small table)."""
    each = {user: Limit(gpus, jobs) for user, gpus, jobs in flushed(session).execute(_LIMITS)}
    default = each.pop(EVERYONE, Limit())
    return Limits(each, default)


_LIMITS = select(UserLimit.user, UserLimit.max_gpus, UserLimit.max_jobs)  # built once: every pass


# ---- reservations -----------------------------------------------------------------------


class ReservationRefused(ValueError):
    """A reservation that cannot be kept; the message says why."""


@dataclass(frozen=True)
class ReservationRow:
    reservation: Reservation
    created_at: float
    created_by: str


def add_reservation(
    session: Session,
    user: str,
    gpus: int,
    start: float,
    end: float,
    *,
    by: str,
    now: float,
    total_gpus: int,
) -> ReservationRow:
    """Keep ``gpus`` GPUs for ``user``'s jobs from ``start`` to ``end``. Refused when the
    window is empty or over, or when, with the reservations it overlaps, it would keep
    more GPUs than the host has (``total_gpus``)."""
    if gpus < 1:
        raise ReservationRefused("--gpus: a reservation keeps at least 1 GPU")
    if end <= start:
        raise ReservationRefused("the reservation ends before it starts")
    if not (start >= FIRST_MOMENT and end <= LAST_MOMENT):
        raise ReservationRefused("a reservation's times lie between the years 1 and 9999")
    if end <= now:
        raise ReservationRefused("the reservation would be over already")
    new = Reservation(0, user, gpus, start, end)
    most = peak_reserved(open_reservations(session, now), new)
    if most > total_gpus:
        raise ReservationRefused(
            f"with the reservations it overlaps it would keep {most} GPUs at once; "
            f"this server has {total_gpus}"
        )
    row = GpuReservation(
        user=user, gpus=gpus, start_at=start, end_at=end, created_at=now, created_by=by
    )
    session.add(row)
    session.flush()
    return _row(row)


def delete_reservation(session: Session, reservation_id: int) -> Reservation:
    row = session.get(GpuReservation, reservation_id)
    if row is None:
        raise LookupError(f"no reservation {reservation_id}")
    out = _row(row).reservation
    session.delete(row)
    session.flush()
    return out


def open_reservations(session: Session, now: float) -> list[Reservation]:
    """Those that have not ended (read on every pass; ``end_at`` is indexed), in
    ``list_reservations``' order, by a statement built once and no ORM objects."""
    return [Reservation(*row) for row in flushed(session).execute(_OPEN, {"now": now})]


# How reservations are listed, the planner's and the admin's lists alike.
_IN_ORDER = (GpuReservation.start_at, GpuReservation.id)
_OPEN = (
    select(  # a Reservation, field for field
        GpuReservation.id,
        GpuReservation.user,
        GpuReservation.gpus,
        GpuReservation.start_at,
        GpuReservation.end_at,
    )
    .where(GpuReservation.end_at > bindparam("now"))
    .order_by(*_IN_ORDER)
)


def list_reservations(session: Session, now: float, ended: bool = False) -> list[ReservationRow]:
    query = select(GpuReservation)
    if not ended:
        query = query.where(GpuReservation.end_at > now)
    rows = session.scalars(query.order_by(*_IN_ORDER))
    return [_row(r) for r in rows]


def _row(r: GpuReservation) -> ReservationRow:
    return ReservationRow(
        Reservation(r.id, r.user, r.gpus, r.start_at, r.end_at), r.created_at, r.created_by
    )
