"""The device table: replaced wholesale by the worker, read by the API.

Each row is a ``core.gpus.Gpu`` as the worker last saw it, with only the processes that no
ddpq job started (a GPU that has any is ``external``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.store.models import DeviceSnapshot


def replace_all(session: Session, gpus: Sequence[Gpu], now: float) -> None:
    session.execute(delete(DeviceSnapshot))
    for gpu in gpus:
        session.add(
            DeviceSnapshot(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                fake=gpu.fake,
                memory_total_mb=gpu.memory_total_mb,
                memory_used_mb=gpu.memory_used_mb,
                external=bool(gpu.processes),
                # Not the ddpq user: the API names it when asked, as users are mapped then.
                external_processes=[
                    {k: v for k, v in asdict(p).items() if k != "user"} for p in gpu.processes
                ],
                updated_at=now,
                hardware={
                    "numa": gpu.numa,
                    "cpus": gpu.cpus,
                    "links": [list(pair) for pair in gpu.links],
                    "mig_profile": gpu.mig_profile,
                    "parent": gpu.parent,
                },
            )
        )
    session.flush()


def all_devices(session: Session) -> list[Gpu]:
    rows = session.scalars(select(DeviceSnapshot).order_by(DeviceSnapshot.index))
    return [
        Gpu(
            index=row.index,
            uuid=row.uuid,
            name=row.name,
            memory_total_mb=row.memory_total_mb,
            memory_used_mb=row.memory_used_mb,
            processes=tuple(_process(p) for p in row.external_processes),
            fake=row.fake,
            **_hardware(row.hardware),
        )
        for row in rows
    ]


def _hardware(h: dict[str, Any] | None) -> dict[str, Any]:
    """The placement fields of a row (none for rows written before migration 0022t)."""
    if not isinstance(h, dict):
        return {}
    links = h.get("links") or []
    return {
        "numa": h.get("numa"),
        "cpus": h.get("cpus"),
        "links": tuple((int(i), str(w)) for i, w in links),
        "mig_profile": h.get("mig_profile"),
        "parent": h.get("parent"),
    }


def _process(p: dict[str, Any]) -> GpuProcess:
    # Rows the worker wrote before it named owners have no uid or account.
    uid, account = p.get("uid"), p.get("account")
    return GpuProcess(
        int(p["pid"]),
        p.get("used_memory_mb"),
        uid=uid if isinstance(uid, int) else None,
        account=account if isinstance(account, str) else None,
    )


_COUNT = select(func.count()).select_from(DeviceSnapshot)  # asked at every submission


def count(session: Session) -> int:
    """How many GPUs the worker reported, without loading their rows."""
    return session.connection().execute(_COUNT).scalar() or 0
