"""Finished jobs, as ``sacct`` lists them (``GET /v1/history``, ``ddpq history``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from ddpq.core.states import JobState


class HistoryRow(BaseModel):
    """One finished job: what it asked for, what it used, how it ended."""

    id: int
    name: str
    owner: str
    state: JobState
    reason: str = Field(description="why it ended as it did")
    sweep_id: int | None
    submitted_at: datetime
    started_at: datetime | None = Field(description="its first attempt's start (null: never ran)")
    ended_at: datetime
    elapsed_s: float = Field(
        description="time it ran: its attempts' run times summed (waits between attempts, "
        "after a preemption or a requeue, not counted)"
    )
    attempts: int = Field(description="times it was started")
    gpus: int = Field(description="GPUs it asked for")
    gpu_ids: list[int] = Field(description="the GPUs its last attempt ran on")
    cores: int | None = Field(description="CPU cores its last attempt was confined to, or asked")
    mem: int | None = Field(description="host memory in bytes it held or asked (null: no limit)")
    peak_mem: int | None = Field(
        description="its highest host-memory peak in bytes over its attempts (null: unmeasured)"
    )
    exit_code: int | None
    exit_signal: int | None


class HistoryPage(BaseModel):
    """Finished jobs, the newest end first; ``next`` asks for the page after this one."""

    items: list[HistoryRow]
    next: str | None = Field(
        description="pass as ``after`` for the rows that follow (null: none follow)"
    )
