"""Tables. Times are UNIX epoch seconds (REAL): plain numbers the pure core can use.

``jobs`` and its mapping to ``core.spec.JobSpec`` are in ``job``, the other tables in
``tables``; every table is imported from here (``from ddpq.store.models import Job``).
"""

from ddpq.store.models.base import Base, state_type
from ddpq.store.models.job import (
    KEPT_ELSEWHERE,
    PLAN_SHAPE_INDEX,
    SPEC_COLUMNS,
    UNPLANNED,
    Job,
    columns_of,
    new_row,
    spec_of,
    written,
)
from ddpq.store.models.progress import ProgressSample
from ddpq.store.models.tables import (
    LEASE_CHECK,
    Attempt,
    DeviceSnapshot,
    GpuReservation,
    JobDependency,
    JobEvent,
    Lease,
    Notification,
    OutsideUse,
    RetentionPass,
    RetentionTotal,
    Sweep,
    SweepDependency,
    Token,
    User,
    UserLimit,
)

__all__ = [
    "KEPT_ELSEWHERE",
    "LEASE_CHECK",
    "PLAN_SHAPE_INDEX",
    "SPEC_COLUMNS",
    "UNPLANNED",
    "Attempt",
    "Base",
    "DeviceSnapshot",
    "GpuReservation",
    "Job",
    "JobDependency",
    "JobEvent",
    "Lease",
    "Notification",
    "OutsideUse",
    "ProgressSample",
    "RetentionPass",
    "RetentionTotal",
    "Sweep",
    "SweepDependency",
    "Token",
    "User",
    "UserLimit",
    "columns_of",
    "new_row",
    "spec_of",
    "state_type",
    "written",
]
