"""Getting one attempt ready for sbatch: whom it runs as, its folder, its script, its
environment.

With ``--auth`` the job's owner's mapped account submits it (``sbatch`` runs as that
account), so Slurm's accounting, limits and fair share see the right user; never root,
which Slurm would otherwise run jobs as. Without ``--auth`` the daemon's own account
submits every job, as it runs every local job.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from dataclasses import dataclass

from ddpq.config import Settings
from ddpq.core.disposition import attempt_header
from ddpq.executors.accounts import Account, NoAccount, account_for
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.contract import job_env
from ddpq.executors.slurm import script
from ddpq.jobdir import JobDir, make_folder, open_for_append, remove_entry

# Variables that steer Slurm's own commands (sbatch reads SBATCH_*, srun SLURM_* and
# SRUN_*): a job's --env may not change how ddpq submits or places it.
SLURM_PREFIXES = ("SBATCH_", "SLURM_", "SRUN_", "SALLOC_")


@dataclass(frozen=True)
class Submission:
    script: str
    env: dict[str, str]
    account: Account | None  # None: the daemon's own account submits
    owner: tuple[int, int] | None  # the folder's files are handed to this uid/gid


def submitter(launch: Launch, settings: Settings) -> Account | None:
    """The account that submits the job; raises LaunchFailed for one that may not."""
    if not settings.auth:
        return None
    try:
        account = account_for(launch.spec.owner, launch.unix_account)
    except NoAccount as exc:
        raise LaunchFailed(str(exc)) from None
    owner = launch.spec.owner
    if account is not None and account.uid == 0:
        raise LaunchFailed(
            f"owner {owner!r} is mapped to root, and ddpq never submits Slurm jobs as "
            f"root; map them to their own account (`ddpq admin user map {owner} NAME`)"
        )
    return account


CLUSTER_CONF = "SLURM_CONF"


def environment(launch: Launch, account: Account | None) -> tuple[dict[str, str], list[str]]:
    """The job's environment as sbatch passes it on (``--export=ALL``), and the job's own
    variables that were left out (they would steer Slurm)."""
    dropped = sorted(k for k in launch.spec.env if k.startswith(SLURM_PREFIXES))
    kept = {k: v for k, v in launch.spec.env.items() if k not in dropped}
    without = dataclasses.replace(launch, spec=dataclasses.replace(launch.spec, env=kept))
    env = job_env(without, os.environ, omp_threads=1)
    if "OMP_NUM_THREADS" not in kept:
        del env["OMP_NUM_THREADS"]  # the script divides the node's cores among its ranks
    if launch.gpus:
        # Slurm sets it from the GPUs it allocates on each node; ddpq's lease numbers are
        # slots of its budget, not devices. Without GPUs it stays empty, as locally.
        del env["CUDA_VISIBLE_DEVICES"]
    if account is not None:
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
    cluster = os.environ.get(CLUSTER_CONF)
    if cluster is not None:
        # The job runs on the cluster ddpq submits to: its srun must read the same
        # configuration, whatever the submitter's shell had (or an exported env lacks).
        env[CLUSTER_CONF] = cluster
        if launch.spec.env.get(CLUSTER_CONF) == cluster:
            dropped.remove(CLUSTER_CONF)  # the same value: nothing of the user's was lost
    return env, dropped


def prepare(launch: Launch, settings: Settings) -> Submission:
    """The folder made ready (``jobdir.make_folder``: new to the job, the account's, 0700,
    no earlier record), the attempt's header in its log, the script rendered into it;
    raises LaunchFailed with why not."""
    account = submitter(launch, settings)
    folder = JobDir(launch.job_dir)
    owner = (account.uid, account.gid) if account is not None else None
    try:
        # A folder that was there before the first attempt is not this job's: set aside.
        make_folder(folder, launch.attempt == 1, owner)
        env, dropped = environment(launch, account)
        text = script.render(script.batch_job(launch, settings))
        # The header first: the worker reads this attempt's output from it on (a port
        # clash names the header's port).
        with open_for_append(folder.log, owner) as log:
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(attempt_header(when, launch.gpus, launch.port).encode())
            if dropped:
                note = f"[ddpq] left out of the job's environment (they steer Slurm): {dropped}"
                log.write(f"{note}\n".encode())
        write_script(folder, text, owner)
    except OSError as exc:
        why = f"cannot prepare the job's folder: {exc}"
        # A full disk is the host's state, put off; a full quota (EDQUOT) is the account's.
        raise LaunchFailed(why, put_off=exc.errno == errno.ENOSPC) from None
    return Submission(text, env, account, owner)


def write_script(folder: JobDir, text: str, owner: tuple[int, int] | None) -> None:
    """The script into the folder, for people (and ``sbatch --test-only``) to read.

    The folder is the job's: a fresh file renamed over the name, never a write through
    whatever link the job may have left there.
    """
    tmp = folder.path / f".{folder.sbatch_script.name}.tmp"
    remove_entry(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    if folder.sbatch_script.is_dir() and not folder.sbatch_script.is_symlink():
        remove_entry(folder.sbatch_script)  # a folder cannot be renamed over: moved aside
    os.replace(tmp, folder.sbatch_script)
