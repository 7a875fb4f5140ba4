"""Every setting of the daemon, declared once: the fields of ``Declared``, which
``ddpq.config.Settings`` (the object the daemon runs with) extends with what it derives.

A field's declaration is the whole of a setting: its name, its type (which reads values as
people write them: ``grace_s`` takes "1h30m" or seconds, ``log_cap_bytes`` "64M" or bytes,
``port_range`` "29600-29999"; see ``ddpq.config_values``), its default and, for a setting
people set, its ``Public`` name and help. From these come the flags of ``ddpq serve``,
``server`` and ``worker`` and the docs' table (``ddpq.daemon.options``), the ``DDPQ_*``
variables and the TOML keys (``ddpq.daemon.settings``). A field with no ``Public`` is an
internal (``python``, ``poll_s``). Adding a setting is one field here, and its use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ddpq.config_bounds import QueueBounds
from ddpq.config_host import HostSettings
from ddpq.config_values import (
    DEFAULT_PORT_RANGE,
    EXECUTORS,
    NAMES,
    AnySize,
    Budget,
    Bytes,
    FolderMax,
    Fraction,
    IdleLimit,
    KeepFor,
    Period,
    PortRange,
    Public,
    Seconds,
    absolute,
    at_least,
    between,
    checked_url,
    default_home,
    group_name,
    one_of,
    slurm_name,
    socket_path,
)
from ddpq.core import notify, slurm
from ddpq.core.names import DEFAULT_API_ADDRESS
from ddpq.core.policy import DEFAULT_POLICY, Policy
from ddpq.core.preempt import DEFAULT_GUARDS

_HOST, _PORT = DEFAULT_API_ADDRESS


class _Service(BaseSettings):
    """Where the daemon keeps its state and listens, and how it treats a job's output."""

    home: Annotated[
        Path,
        AfterValidator(absolute),
        Public("home", "state folder (default $DDPQ_HOME or ~/.local/state/ddpq)"),
    ] = Field(default_factory=default_home, validate_default=True)
    host: Annotated[str, Public("host", "address to listen on", only="api")] = _HOST
    port: Annotated[int, AfterValidator(between(0, 65535)), Public("port", "API port", "api")] = (
        _PORT
    )
    fake_gpus: Annotated[
        int | None,
        AfterValidator(between(0, 1024)),
        Public("fake_gpus", "use N fake GPUs instead of NVML; jobs run on the CPU"),
    ] = None
    port_range: Annotated[
        PortRange, Public("port_range", "rendezvous ports to lease, LOW-HIGH")
    ] = DEFAULT_PORT_RANGE
    external_policy: Annotated[
        str,
        AfterValidator(one_of("avoid", "ignore")),
        Public("external_gpus", "GPUs running processes ddpq did not start: avoid or ignore"),
    ] = "avoid"
    # "count": outside use by an account that is a ddpq user's adds to their fair share.
    outside_use: Annotated[
        str,
        AfterValidator(one_of("count", "show")),
        Public(
            "outside_use",
            "GPU time of processes in no job: count (in their user's fair share) or show",
        ),
    ] = "count"
    grace_s: Annotated[
        Seconds,
        Public("grace", "SIGTERM-to-SIGKILL grace period when stopping a job (30s, 2m, 0)"),
    ] = 10.0
    log_cap_bytes: Annotated[
        Bytes, Public("log_cap", "output kept per job (head + newest), in bytes or as 64M, 1G")
    ] = 64 * 1024 * 1024
    auth: Annotated[bool, Public("auth", "require per-user tokens (ddpq admin user add)")] = False
    stop_jobs_on_exit: Annotated[
        bool,
        Public("stop_jobs", "on shutdown, stop running jobs instead of leaving them to re-adopt"),
    ] = False


class _Trust(BaseSettings):
    """Whom the daemon believes (docs/architecture.md, trust modes)."""

    allow_root_without_auth: Annotated[
        bool,
        Public(
            "allow_root",
            "run as root without --auth (every local user can then run commands as root)",
            negatable=False,
        ),
    ] = False
    # Only with the admin's explicit yes: jobs can read each other's files and the database.
    shared_account: Annotated[
        bool,
        Public(
            "shared_account",
            "--auth without root: every job runs as the daemon's account and can read the "
            "database and other jobs' files; tokens only keep honest users apart",
            negatable=False,
        ),
    ] = False
    # A caller on the socket is the Unix account the kernel says it is (SO_PEERCRED). None:
    # SOCKET_FILE in the state folder; NO_SOCKET: none.
    unix_socket: Annotated[
        str | None,
        BeforeValidator(socket_path),
        Public(
            "socket",
            "Unix socket to listen on too (0666): its callers are their Unix accounts, with "
            "no token; 'none' for none",
            only="api",
            default_is="ddpq.sock in the state folder",
        ),
    ] = None
    # Admins through the socket, or with a token they made there. None: root alone.
    admin_group: Annotated[
        str | None,
        BeforeValidator(group_name),
        Public(
            "admin_group",
            "Unix group whose members are admins (root always is; 'none': root only)",
            only="api",
        ),
    ] = "ddpq-admin"
    remote_accounts: Annotated[
        bool,
        Public(
            "remote_accounts",
            "let a token a local user made for themselves submit over TCP, the jobs running "
            "as that user's account (without it such tokens watch, read and cancel)",
            only="api",
        ),
    ] = False


class _Jobs(BaseSettings):
    """What jobs may hold and where their ends are told; the policy that orders them."""

    # So that one user's flood of torchrun jobs cannot take every port.
    max_user_ports: Annotated[
        int,
        AfterValidator(at_least(0)),
        Public(
            "ports_per_user",
            "rendezvous ports one user's jobs may hold at once (0: a quarter of them)",
        ),
    ] = 0
    notify_url: Annotated[
        str | None,
        AfterValidator(checked_url),
        Public(
            "notify_url",
            "POST every job's end (a sweep's: once, when all of it has ended) here unless it "
            "names its own --notify URL",
            only="api",
        ),
    ] = None
    notify_allow_loopback: Annotated[
        bool,
        Public(
            "notify_allow_loopback",
            "let notifications go to this host's own addresses (refused: they could reach "
            "local services no user should drive)",
            negatable=False,
        ),
    ] = False
    # core.policy; chosen by trace replay.
    policy: Annotated[
        Policy, Public("policy", "scheduling policy: las, srpt-progress, fairshare or fifo")
    ] = DEFAULT_POLICY
    preempt_grace_s: Annotated[
        Seconds,
        Public("preempt_grace", "time a preemptible job has to checkpoint before it is stopped"),
    ] = 60.0
    # The policy's guards against thrashing (core.preempt).
    preempt_min_run_s: Annotated[
        Seconds,
        Public("preempt_min_run", "the policy preempts a job only once it has run this long"),
    ] = DEFAULT_GUARDS.min_run_s
    max_preemptions: Annotated[
        int,
        Field(ge=0, le=1000),
        Public("max_preemptions", "the policy preempts one job at most this many times"),
    ] = DEFAULT_GUARDS.max_preemptions


class _Retention(BaseSettings):
    """Retention and interactive sessions' idle limits."""

    # Retention (ddpq.daemon.janitor); jobs that are not finished are never touched.
    keep_finished_s: Annotated[
        KeepFor,
        Public(
            "keep_finished",
            "remove finished jobs' folders this long after they ended (30d, 12h; 'forever' "
            "keeps them)",
            only="worker",
        ),
    ] = None
    jobs_budget_bytes: Annotated[
        Budget,
        Public(
            "jobs_budget",
            "most that all job folders may hold (500G): finished jobs' checkpoints go first, "
            "then their logs, from the user holding the most, oldest first",
            only="worker",
        ),
    ] = None
    prune_rows: Annotated[
        bool,
        Public(
            "prune_rows",
            "with --keep-finished, also delete those jobs from the database",
            only="worker",
        ),
    ] = False
    # Interactive sessions (core.interactive). Batch jobs idle longer than --idle are shown,
    # not ended.
    idle_default_s: Annotated[
        IdleLimit,
        Public(
            "idle",
            "an interactive session (ddpq shell) whose GPUs stay unused this long is warned, "
            "then ended (reason idle) after --idle-grace, unless it asked for another limit "
            "('off': only those that ask are)",
        ),
    ] = 30 * 60.0
    idle_max_s: Annotated[
        IdleLimit,
        Public("idle_max", "the longest idle limit a session may ask for ('off': no maximum)"),
    ] = 4 * 3600.0
    idle_grace_s: Annotated[
        Seconds, Public("idle_grace", "time between an idle session's warning and its end")
    ] = 5 * 60.0


class _Slurm(BaseSettings):
    """Where jobs run: this host or a Slurm cluster (docs/slurm.md)."""

    # docs/slurm.md.
    executor: Annotated[
        str,
        AfterValidator(one_of(*EXECUTORS)),
        Public("executor", "where jobs run: local (this host) or slurm (sbatch; docs/slurm.md)"),
    ] = "local"
    slurm_partition: Annotated[
        str | None,
        AfterValidator(slurm_name),
        Public("slurm_partition", "Slurm partition for every job", default_is="Slurm's default"),
    ] = None
    slurm_account: Annotated[
        str | None,
        AfterValidator(slurm_name),
        Public("slurm_account", "Slurm account for every job", default_is="the user's default"),
    ] = None
    slurm_options: Annotated[
        tuple[str, ...],
        BeforeValidator(slurm.daemon_options_setting),
        Public(
            "slurm_options",
            'extra #SBATCH options for every job, as one string: "--qos=high --cpus-per-gpu=8"',
            default_is="none",
        ),
    ] = ()
    # core.slurm.DEFAULT_USER_OPTIONS unless the admin lists others.
    slurm_user_options: Annotated[
        tuple[str, ...],
        BeforeValidator(slurm.user_options_setting),
        NAMES,
        Public(
            "slurm_user_options",
            "the #SBATCH options a job's own --slurm-opt may set: sbatch's long names, "
            'comma-separated ("none": no option)',
        ),
    ] = slurm.DEFAULT_USER_OPTIONS
    slurm_gpus: Annotated[
        int | None,
        AfterValidator(between(0, 1_000_000)),
        Public(
            "slurm_gpus",
            "GPUs ddpq may hold in Slurm at once",
            default_is="every GPU of the partition, from sinfo",
        ),
    ] = None


class _Resources(BaseSettings):
    """GPUs shared by memory (core.sharing) and the state disk (core.quota)."""

    # Sharing GPUs by memory (core.sharing).
    gpu_mem_headroom_bytes: Annotated[
        AnySize,
        Public(
            "gpu_mem_headroom",
            "GPU memory kept free on every GPU that jobs share by memory (--gpu-mem), as 1G, "
            "512M or 0",
            only="worker",
        ),
    ] = 1 << 30
    gpu_mem_margin: Annotated[
        Fraction,
        Public(
            "gpu_mem_margin",
            "added to a job's measured peak GPU memory by --gpu-mem auto (10%, or 0.1)",
            only="worker",
        ),
    ] = 0.10
    gpu_poll_s: Annotated[
        Period,
        Public(
            "gpu_poll",
            "how often NVML is asked for the GPUs' processes and each running job's memory",
            only="worker",
        ),
    ] = 5.0
    # The state disk (store.headroom, core.quota), measured every disk_every_s by the
    # process that runs jobs.
    state_reserve_bytes: Annotated[
        AnySize,
        Public(
            "state_reserve",
            "room kept on the state folder's disk for cancels and jobs' ends when a job fills "
            "it (64M, 0 for none); new jobs are refused while less is free",
        ),
    ] = 64 << 20
    job_folder_max: Annotated[
        FolderMax,
        Public(
            "job_folder_max",
            "most one running job's folder may hold (10G, or 50% of the disk it is on; "
            "'unlimited'): a job over it is stopped and fails saying so",
            only="worker",
        ),
    ] = 0.5
    job_pids_max: Annotated[  # each job cgroup's pids.max: a fork bomb stops at its own cap
        int,
        Field(ge=0, le=4_194_304),  # the kernel's own pid_max at most
        Public("job_pids_max", "processes and threads one job may have (0: no cap)", "worker"),
    ] = 4096


# The groups above, listed last first: pydantic orders inherited fields from the last base
# to the first, and their order is the flags' and the docs' order.
class Declared(QueueBounds, HostSettings, _Resources, _Slurm, _Retention, _Jobs, _Trust, _Service):
    """Every setting, each with its type, default and (if people set it) ``Public``; the
    internals, which no flag, variable or key sets, are declared here."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built directly: the arguments and the defaults. A test's settings must not
        # depend on the machine's /etc/ddpq or on the environment it runs in.
        return (init_settings,)

    disk_every_s: float = 5.0
    usage_window_s: float = 7 * 24 * 3600.0
    max_port_retries: int = 3
    # How often the janitor looks (it also looks once when the daemon starts).
    prune_every_s: float = 600.0
    # Interpreter for the shim and for torchrun: the daemon's own, which has torch
    # installed on a GPU host.
    python: str = sys.executable
    # How often the worker looks at the database even when nothing woke it
    # (another process's cancel, a time limit, progress files).
    poll_s: float = 0.5
    notify_timeout_s: float = notify.TIMEOUT_S
    notify_retry_s: tuple[float, ...] = notify.RETRY_DELAYS_S
