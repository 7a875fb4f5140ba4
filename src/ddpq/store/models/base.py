"""What every table shares: the declarative base, and how a job state is stored."""

from __future__ import annotations

from sqlalchemy import Enum
from sqlalchemy.orm import DeclarativeBase

from ddpq.core.states import JobState


class Base(DeclarativeBase):
    pass


def state_type(constraint: str) -> Enum:
    """A job state column: ``JobState`` in Python, its value as text in SQLite, and a CHECK
    constraint named ``constraint`` so that no other word can be stored, whatever the SQL."""
    return Enum(
        JobState,
        name=constraint,
        native_enum=False,
        create_constraint=True,
        length=16,
        validate_strings=True,
        values_callable=lambda states: [s.value for s in states],
    )
