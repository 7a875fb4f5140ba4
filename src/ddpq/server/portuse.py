"""Who listens on a job's leased port (``GET /v1/jobs/{id}/port``), looked at on demand.

The daemon's look at this host (``ddpq.portholders``): the API may not ask the worker or
its executor, and needs neither. A job's processes run as its account (the one the
submission proved, else its owner's mapped one; a daemon that is not root, or has no
--auth, runs every job as itself) and carry the job contract's variables; a listener
with both is the job's.
"""

from __future__ import annotations

import os
import pwd

from ddpq import portholders
from ddpq.config import Settings
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import PortUseOut
from ddpq.server import identity


def account_uid(settings: Settings, account: str | None) -> int | None:
    """The uid a job mapped to ``account`` runs as here (None: no such account, so it
    cannot run), as the launch decides (``executors.local.spawn``)."""
    if os.geteuid() != 0 or not settings.auth:
        return os.geteuid()  # every job runs as the daemon itself
    if account is None:
        return None
    # "No such account" only when the database could be read (else 503, server.exhaustion).
    entry = identity.look_up(lambda: pwd.getpwnam(account))
    return None if entry is None else entry.pw_uid


def port_use(
    settings: Settings,
    job_id: int,
    attempt: int,
    port: int | None,
    running: bool,
    account: str | None,
) -> PortUseOut:
    """``account``: the Unix account the job runs as (None: as the daemon, or none)."""
    if port is None or not running:
        why = "holds no port" if running else "is not running"
        return PortUseOut(port=port, listener="nobody", detail=f"job {job_id} {why}")
    if not capabilities(settings.executor).on_this_host:
        return PortUseOut(
            port=port,
            listener="unknown",
            detail=f"job {job_id} runs on a Slurm node, whose ports this host cannot see",
        )
    found = portholders.who_listens(port, job_id, attempt, account_uid(settings, account))
    holder = found.holder
    if found.who == "nobody" or holder is None:
        return PortUseOut(port=port, listener="nobody", detail=f"nobody listens on port {port}")
    if found.who == "job":
        detail = f"job {job_id} listens on port {port} (pid {holder.pid})"
    elif found.who == "unknown":
        detail = f"a process of job {job_id}'s account listens on port {port}; which is unknown"
    else:
        detail = f"port {port} is not job {job_id}'s: {holder.describe()}"
    return PortUseOut(
        port=port,
        listener=found.who,
        uid=holder.uid,
        user=holder.user,
        pid=holder.pid,
        command=holder.comm,
        detail=detail,
    )
