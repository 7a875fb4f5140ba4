"""GPU, port and CPU core leases. The partial unique index on live rows, and the triggers
of migration 0012m, are the real guard: no two live jobs hold one whole GPU, one port or
one core slot, and no GPU is held whole and shared at once (nor shared past its memory or
a share cap)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from ddpq.store.models import Lease

GPU = "gpu"
PORT = "port"
GPU_SHARE = "gpu_share"  # a share of a GPU's memory (mem_bytes); several jobs may hold one
GPU_KINDS = (GPU, GPU_SHARE)
CPU = "cpu"  # a CPU core slot (core.hostres); disjoint between live jobs, as GPUs are

_leases = cast(Table, Lease.__table__)
_live = _leases.c
# Built once, as the pass's other hot statements: every pass that starts jobs writes leases.
_ACQUIRE = insert(_leases)


@dataclass(frozen=True)
class LiveLease:
    job_id: int
    kind: str
    resource: int
    acquired_at: float
    mem_bytes: int | None = None  # a share: what it reserves on the GPU
    share_cap: int | None = None


@dataclass(frozen=True)
class Wanted:
    """The leases one job is to get: its GPUs (whole, or a share of each) and its port."""

    job_id: int
    gpus: Sequence[int]
    port: int | None
    mem_bytes: int | None = None  # a share of each GPU: the bytes it reserves there
    share_cap: int | None = None
    cores: Sequence[int] = ()  # CPU core slots


def acquire(
    session: Session,
    job_id: int,
    gpus: Sequence[int],
    port: int | None,
    now: float,
    mem_bytes: int | None = None,
) -> None:
    acquire_many(session, [Wanted(job_id, gpus, port, mem_bytes)], now)


def acquire_many(session: Session, wanted: Sequence[Wanted], now: float) -> None:
    """Insert the leases of several jobs, in one statement.

    An IntegrityError here means a double lease (the partial unique index, the triggers):
    the caller's transaction must be rolled back.
    """
    rows = [
        {
            "job_id": w.job_id,
            "kind": GPU if w.mem_bytes is None else GPU_SHARE,
            "resource": gpu,
            "acquired_at": now,
            "mem_bytes": w.mem_bytes,
            "share_cap": w.share_cap if w.mem_bytes is not None else None,
        }
        for w in wanted
        for gpu in w.gpus
    ]
    rows += [
        {
            "job_id": w.job_id,
            "kind": PORT,
            "resource": w.port,
            "acquired_at": now,
            "mem_bytes": None,
            "share_cap": None,
        }
        for w in wanted
        if w.port is not None
    ]
    rows += [
        {
            "job_id": w.job_id,
            "kind": CPU,
            "resource": slot,
            "acquired_at": now,
            "mem_bytes": None,
            "share_cap": None,
        }
        for w in wanted
        for slot in w.cores
    ]
    if rows:
        session.connection().execute(_ACQUIRE, rows)


def release(session: Session, job_id: int, now: float) -> None:
    release_many(session, [job_id], now)


def release_many(session: Session, job_ids: Sequence[int], now: float) -> None:
    """Free every live lease of ``job_ids``, in one statement."""
    if job_ids:
        session.execute(_RELEASE, {"ids": list(job_ids), "now": now})


_RELEASE = (
    update(_leases)
    .where(_live.job_id.in_(bindparam("ids", expanding=True)), _live.released_at.is_(None))
    .values(released_at=bindparam("now"))
)


def live(session: Session, job_ids: Iterable[int] | None = None) -> list[LiveLease]:
    """Unreleased leases (of ``job_ids``, if given), as columns: read on every pass."""
    if job_ids is None:
        rows = session.connection().execute(_LIVE)
    else:
        rows = session.connection().execute(_LIVE_OF, {"ids": list(job_ids)})
    return [LiveLease(*row) for row in rows]


# Built once: read at every pass.
_LIVE_ROWS = select(
    _live.job_id, _live.kind, _live.resource, _live.acquired_at, _live.mem_bytes, _live.share_cap
).where(_live.released_at.is_(None))
_IN_ORDER = (_live.job_id, _live.kind, _live.resource)
_LIVE = _LIVE_ROWS.order_by(*_IN_ORDER)
_LIVE_OF = _LIVE_ROWS.where(_live.job_id.in_(bindparam("ids", expanding=True))).order_by(*_IN_ORDER)


def by_job(leases: Iterable[LiveLease]) -> dict[int, tuple[list[int], int | None]]:
    """job id -> (GPU indices, whole or shared, port)."""
    out: dict[int, tuple[list[int], int | None]] = {}
    for lease in leases:
        gpus, port = out.get(lease.job_id, ([], None))
        if lease.kind in GPU_KINDS:
            gpus.append(lease.resource)
        elif lease.kind == PORT:
            port = lease.resource
        out[lease.job_id] = (gpus, port)
    return out


def core_slots(leases: Iterable[LiveLease]) -> dict[int, list[int]]:
    """job id -> the CPU core slots it holds, for jobs that hold any."""
    out: dict[int, list[int]] = {}
    for lease in leases:
        if lease.kind == CPU:
            out.setdefault(lease.job_id, []).append(lease.resource)
    return out


def shares(leases: Iterable[LiveLease]) -> dict[int, tuple[int, int | None]]:
    """job id -> (bytes reserved on each of its GPUs, its share cap), for sharing jobs."""
    return {
        lease.job_id: (lease.mem_bytes, lease.share_cap)
        for lease in leases
        if lease.kind == GPU_SHARE and lease.mem_bytes is not None
    }


def last_port(session: Session) -> int | None:
    """The most recently leased port, so allocation can rotate instead of reusing at once."""
    return session.scalar(
        select(Lease.resource).where(Lease.kind == PORT).order_by(Lease.id.desc()).limit(1)
    )
