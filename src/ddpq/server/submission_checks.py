"""The checks a submission passes before it is queued, shared by the routes that take one:
a job (``routes.jobs``), a sweep's members (``routes.sweeps``) and a job's edits
(``routes.job_edits``). Each refuses with the API's error (``ApiError``), naming the field."""

from __future__ import annotations

import os
import pwd

from ddpq import notify_target
from ddpq.config import Settings
from ddpq.core import slurm as core_slurm
from ddpq.core.gpus import hardware_of
from ddpq.core.scheduler.gates import unavailable_hardware
from ddpq.core.sharing import MIB, GpuMemory
from ddpq.core.spec import JobSpec
from ddpq.core.units import size_for_people
from ddpq.schemas import USER_PRIORITY_MAX
from ddpq.server import exhaustion, identity, paths
from ddpq.server.deps import Caller
from ddpq.server.errors import ApiError
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.store import devices as device_store
from ddpq.store import users as user_store
from ddpq.store.db import Database, Session
from ddpq.workloads.registry import BadWorkload, resolve


def check_notify(url: str, settings: Settings, lookups: NotifyLookups, caller: str) -> None:
    """Refuse now, not only at each delivery, a notification URL whose host is, or only
    resolves to, an address no notification may go to, or does not exist; one whose name
    gets no answer in a moment is taken (``server.notify_lookups``: delivery checks it)."""
    try:
        lookups.check(
            url,
            caller,
            allow_loopback=settings.notify_allow_loopback,
            timeout=settings.notify_timeout_s,
        )
    except notify_target.Refused as exc:  # names the host, never the rest of the URL
        raise ApiError(422, "invalid", f"notify: {exc}") from None


def refuse_if_disk_short(db: Database) -> None:
    """New work waits while the state disk is short of the room kept for cancels and jobs'
    ends (store.headroom): 507, naming it. Cancels, holds and releases are still taken."""
    why = db.shortage()
    if why is not None:
        raise ApiError(507, "insufficient_storage", why)


def cluster_options(spec: JobSpec, settings: Settings) -> tuple[str, ...]:
    """A job's own #SBATCH options as its script will hold them; 422 for an option that
    users may not set (as sbatch reads it: ``-G8`` is ``--gpus``). Only an executor that
    takes them gets here with any (``Capabilities.refuses``)."""
    if not spec.slurm_options:
        return ()
    try:
        return core_slurm.user_options(
            spec.slurm_options, settings.slurm_user_options, settings.slurm_options
        )
    except core_slurm.SlurmOptionError as exc:
        raise ApiError(422, "invalid", f"slurm_options: {exc}") from None


def workload_command(workload: str, args: list[str], where: str = "args") -> list[str]:
    """The command of a built-in workload with ``args``; 422 naming what is wrong."""
    try:
        return resolve(workload, args)
    except BadWorkload as exc:
        raise ApiError(422, "invalid", f"{where}: {exc}") from None


def check_gpus(
    s: Session, gpus: int, gpu_mem: int | None = None, settings: Settings | None = None
) -> None:
    """Refuse what this server could never run: more GPUs than it has, or a reservation
    larger than what any of its GPUs has to share."""
    total = device_store.count(s)
    if gpus > total:
        raise ApiError(
            422,
            "invalid",
            f"gpus: asked for {gpus} GPUs but this server has {total}",
        )
    if gpu_mem is None or settings is None:
        return
    headroom = settings.gpu_mem_headroom_bytes
    memory = GpuMemory(
        {d.index: d.memory_total_mb * MIB for d in device_store.all_devices(s)}, {}, headroom
    )
    if total and not memory.can_ever_hold(gpu_mem, gpus):
        raise ApiError(
            422,
            "invalid",
            f"gpu_mem: asked for {size_for_people(gpu_mem)} on each of {gpus} GPU(s); "
            f"the GPUs here have at most {size_for_people(memory.largest())} to share "
            f"({size_for_people(headroom)} of each is kept free)",
        )


def check_hardware(s: Session, gpus: int, gpu_type: str | None, gpu_link: str | None) -> None:
    """Refuse a GPU type or link class no set of this server's GPUs could ever give (the
    scheduler's gate says the same of a job queued before, ``gates.unavailable_hardware``);
    nothing to judge before the worker has said what GPUs there are."""
    if gpu_type is None and gpu_link is None:
        return
    devices = device_store.all_devices(s)
    hw, here = hardware_of(devices), [d.index for d in devices]
    why = unavailable_hardware(hw, here, gpus, gpu_type, gpu_link) if devices else None
    if why is not None:
        typed = unavailable_hardware(hw, here, gpus, gpu_type, None) is None
        raise ApiError(422, "invalid", f"{'gpu_link' if typed else 'gpu_type'}: {why}")


def refuse_unmapped(settings: Settings, db: Database, owner: str, run_as: str | None) -> None:
    """A root daemon with --auth runs a job as the account its owner is mapped to (or the
    one the caller proved): an owner mapped to none, or to one this host lacks, is refused
    now, not queued to fail at its launch (``executors.accounts.account_for``)."""
    if not settings.auth or os.geteuid() != 0 or run_as is not None:
        return
    with db.read() as s:
        mapped = user_store.unix_accounts(s, {owner}).get(owner)
    if mapped is not None and identity.look_up(lambda: pwd.getpwnam(mapped)) is not None:
        return
    why = "to no Unix account" if mapped is None else f"to {mapped!r}, which this host lacks"
    raise ApiError(
        403,
        "forbidden",
        f"{owner} is mapped {why}, so no job of theirs can run here; an admin maps one: "
        f"sudo ddpq admin user map {owner} ACCOUNT",
    )


def check_priority(priority: int | None, who: Caller) -> None:
    """Above ``USER_PRIORITY_MAX`` needs an admin: at submission, update and restart."""
    if priority is not None and priority > USER_PRIORITY_MAX and not who.admin:
        raise ApiError(
            403,
            "forbidden",
            f"priority: at most {USER_PRIORITY_MAX} for users; above that needs an admin",
        )


def check_cwd(
    settings: Settings, db: Database, cwd: str, owner: str, run_as: str | None = None
) -> None:
    """Refuse a working directory the job could not enter, without revealing more.

    A root daemon with --auth runs the job as the account its submission proved
    (``run_as``) or else its owner's mapped account, so it judges the path as that account
    would (missing and out of reach read the same); without either the launch refuses the
    job anyway. Otherwise jobs run as the daemon's own account (without --auth every
    caller is trusted with it), which the kernel asks.
    """
    if settings.auth and os.geteuid() == 0:
        mapped = run_as
        if mapped is None:
            with db.read() as s:
                mapped = user_store.unix_accounts(s, {owner}).get(owner)
        account = paths.account(mapped) if mapped else None
        if account is None:
            return
        ok = paths.can_enter(cwd, account)
    else:
        ok = paths.daemon_can_enter(cwd)
    if not ok:
        exhaustion.check()  # a walk that could not open a folder proves nothing then
        raise ApiError(422, "invalid", f"cwd: {cwd} is not a directory the job can enter")
