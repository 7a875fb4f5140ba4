"""Wire schemas shared by the server and the client (pydantic v2, nothing else).

One module per concern; every name is importable from here, as before the split:

* ``common``: the text type of a request's strings, names, a submission's limits, errors;
* ``submit``: a job to queue (``JobSubmit``), its rules in ``submit_rules``;
* ``jobs``: what the API says about jobs (``JobOut``, ``JobDetail``, attempts, events...);
* ``sweeps``: many jobs in one call (``SweepSubmit``) and what the API says about them;
* ``admin``: the host's GPUs, reservations and the usage report.
"""

from __future__ import annotations

from ddpq.schemas.admin import (
    DeviceList,
    DeviceOut,
    DeviceShare,
    HostJob,
    HostOut,
    LimitOut,
    ReservationIn,
    ReservationList,
    ReservationOut,
    UsageReport,
    UsageRow,
)
from ddpq.schemas.common import (
    CWD_PATTERN,
    DEFAULT_API_ADDRESS,
    ENV_KEY_RE,
    MAX_ARG_LEN,
    MAX_ARGS,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_NODES,
    NAME_PATTERN,
    NAME_RE,
    NAME_RULE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RESERVED_ENV,
    USER_PRIORITY_MAX,
    ErrorOut,
    Text,
    derive_name,
)
from ddpq.schemas.edits import JobChanges
from ddpq.schemas.history import HistoryPage, HistoryRow
from ddpq.schemas.jobs import (
    AttemptOut,
    CancelResult,
    EventOut,
    JobDetail,
    JobEnvOut,
    JobList,
    JobOut,
    LeaseOut,
    MetricsOut,
    NotificationOut,
    PortUseOut,
)
from ddpq.schemas.queue import HiddenOut, QueueView
from ddpq.schemas.submit import JobSubmit
from ddpq.schemas.sweeps import (
    MAX_SWEEP_BYTES,
    SweepAction,
    SweepDetail,
    SweepList,
    SweepMember,
    SweepOut,
    SweepSubmit,
)

__all__ = [
    "CWD_PATTERN",
    "DEFAULT_API_ADDRESS",
    "ENV_KEY_RE",
    "MAX_ARGS",
    "MAX_ARG_LEN",
    "MAX_COMMAND_BYTES",
    "MAX_ENV_BYTES",
    "MAX_ENV_VALUE",
    "MAX_ENV_VARS",
    "MAX_NODES",
    "MAX_SWEEP_BYTES",
    "NAME_PATTERN",
    "NAME_RE",
    "NAME_RULE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RESERVED_ENV",
    "USER_PRIORITY_MAX",
    "AttemptOut",
    "CancelResult",
    "DeviceList",
    "DeviceOut",
    "DeviceShare",
    "ErrorOut",
    "EventOut",
    "HiddenOut",
    "HistoryPage",
    "HistoryRow",
    "HostJob",
    "HostOut",
    "JobChanges",
    "JobDetail",
    "JobEnvOut",
    "JobList",
    "JobOut",
    "JobSubmit",
    "LeaseOut",
    "LimitOut",
    "MetricsOut",
    "NotificationOut",
    "PortUseOut",
    "QueueView",
    "ReservationIn",
    "ReservationList",
    "ReservationOut",
    "SweepAction",
    "SweepDetail",
    "SweepList",
    "SweepMember",
    "SweepOut",
    "SweepSubmit",
    "Text",
    "UsageReport",
    "UsageRow",
    "derive_name",
]
