"""The device table: replaced wholesale by the worker, read by the API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ddpq.store.models import DeviceSnapshot


@dataclass(frozen=True)
class DeviceRow:
    index: int
    uuid: str
    name: str
    fake: bool
    memory_total_mb: int
    memory_used_mb: int
    external: bool
    external_processes: list[dict[str, Any]]


def replace_all(session: Session, rows: Sequence[DeviceRow], now: float) -> None:
    session.execute(delete(DeviceSnapshot))
    for r in rows:
        session.add(
            DeviceSnapshot(
                index=r.index,
                uuid=r.uuid,
                name=r.name,
                fake=r.fake,
                memory_total_mb=r.memory_total_mb,
                memory_used_mb=r.memory_used_mb,
                external=r.external,
                external_processes=r.external_processes,
                updated_at=now,
            )
        )
    session.flush()


def all_devices(session: Session) -> list[DeviceSnapshot]:
    return list(session.scalars(select(DeviceSnapshot).order_by(DeviceSnapshot.index)))


def count(session: Session) -> int:
    """How many GPUs the worker reported, without loading their rows."""
    return session.scalar(select(func.count()).select_from(DeviceSnapshot)) or 0
