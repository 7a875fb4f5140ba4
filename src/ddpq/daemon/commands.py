"""``ddpq serve``, ``ddpq server`` and ``ddpq worker``: the daemon's commands.

Every option defaults to unset (None): an absent flag never overrides a ``DDPQ_*`` variable
or the config file; ``ddpq.config.load_settings`` merges them and holds the defaults. This
module imports only Typer: the settings (pydantic-settings), the server, the worker and
SQLAlchemy are imported by the command that runs, so that `ddpq ls` does not pay for them.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperOption

app = typer.Typer(rich_markup_mode=None)


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"ddpq: {message}", err=True)
    raise typer.Exit(code)


class ShowsSettingsDefaults(TyperCommand):
    """A command whose help shows each option's default as ``Settings`` holds it.

    Read when help is asked for, not when the command line is built: that would import the
    settings on every `ddpq` command, and the defaults would be written twice.
    """

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from ddpq.daemon.settings import DEFAULT_CONFIG_FILE, written_defaults

        defaults = {**written_defaults(), "config": f"{DEFAULT_CONFIG_FILE}, if it exists"}
        for param in self.params:
            if not isinstance(param, TyperOption) or param.name not in defaults:
                continue
            if param.is_flag and not param.secondary_opts:
                continue  # --allow-root: off unless given, as Typer shows such a flag
            if "[default:" not in (param.help or ""):
                shown = _as_flag(param, defaults[param.name])
                param.help = f"{param.help}  [default: {shown}]"
        super().format_help(ctx, formatter)


def _as_flag(param: TyperOption, default: object) -> object:
    """A boolean's default as the flag that gives it (``no-auth``), as Typer shows it."""
    if isinstance(default, bool):
        return (param.opts if default else param.secondary_opts)[0].lstrip("-")
    return default


HomeOpt = Annotated[
    Path | None,
    typer.Option(help="state folder (default $DDPQ_HOME or ~/.local/state/ddpq)"),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help='settings file (TOML, keys named as these options: grace = "30s"); flags and '
        "DDPQ_* variables override it",
    ),
]
HostOpt = Annotated[str | None, typer.Option(help="address to listen on")]
PortOpt = Annotated[int | None, typer.Option(help="API port")]
FakeOpt = Annotated[
    int | None,
    typer.Option(help="use N fake GPUs instead of NVML; jobs run on the CPU ($DDPQ_FAKE_GPUS)"),
]
RangeOpt = Annotated[str | None, typer.Option(help="rendezvous ports to lease, LOW-HIGH")]
ExternalOpt = Annotated[
    str | None, typer.Option(help="GPUs running processes ddpq did not start: avoid or ignore")
]
OutsideUseOpt = Annotated[
    str | None,
    typer.Option(
        help="GPU time of processes in no job: count (in their user's fair share) or show"
    ),
]
GraceOpt = Annotated[
    str | None,
    typer.Option(help="SIGTERM-to-SIGKILL grace period when stopping a job (30s, 2m, 0)"),
]
LogCapOpt = Annotated[
    str | None,
    typer.Option(help="output kept per job (head + newest), in bytes or as 64M, 1G"),
]
AuthOpt = Annotated[bool | None, typer.Option(help="require per-user tokens (ddpq admin user add)")]
StopJobsOpt = Annotated[
    bool | None,
    typer.Option(help="on shutdown, stop running jobs instead of leaving them to re-adopt"),
]
AllowRootOpt = Annotated[
    bool | None,
    typer.Option(
        "--allow-root",
        help="run as root without --auth (every local user can then run commands as root)",
    ),
]
SharedOpt = Annotated[
    bool | None,
    typer.Option(
        "--shared-account",
        help="--auth without root: every job runs as the daemon's account and can read the "
        "database and other jobs' files; tokens only keep honest users apart",
    ),
]
SocketOpt = Annotated[
    str | None,
    typer.Option(
        help="Unix socket to listen on too (0666): its callers are their Unix accounts, with "
        "no token; 'none' for none  [default: ddpq.sock in the state folder]"
    ),
]
AdminGroupOpt = Annotated[
    str | None,
    typer.Option(help="Unix group whose members are admins (root always is; 'none': root only)"),
]
RemoteAccountsOpt = Annotated[
    bool | None,
    typer.Option(
        help="let a token a local user made for themselves submit over TCP, the jobs running "
        "as that user's account (without it such tokens watch, read and cancel)"
    ),
]
PortsPerUserOpt = Annotated[
    int | None,
    typer.Option(help="rendezvous ports one user's jobs may hold at once (0: a quarter of them)"),
]

KeepFinishedOpt = Annotated[
    str | None,
    typer.Option(
        help="remove finished jobs' folders this long after they ended (30d, 12h; "
        "'forever' keeps them)  [default: forever]"
    ),
]
JobsBudgetOpt = Annotated[
    str | None,
    typer.Option(
        help="most that all job folders may hold (500G): the oldest finished jobs' "
        "checkpoints go first, then their logs  [default: unlimited]"
    ),
]
PruneRowsOpt = Annotated[
    bool | None,
    typer.Option(help="with --keep-finished, also delete those jobs from the database"),
]
StateReserveOpt = Annotated[
    str | None,
    typer.Option(
        help="room kept on the state folder's disk for cancels and jobs' ends when a job "
        "fills it (64M, 0 for none); new jobs are refused while less is free"
    ),
]
JobFolderMaxOpt = Annotated[
    str | None,
    typer.Option(
        help="most one running job's folder may hold (10G, or 50% of the disk it is on; "
        "'unlimited'): a job over it is stopped and fails saying so"
    ),
]
# The options of the processes that run jobs (their folders are on that host), not the API's.
RETENTION_OPTIONS = ("keep_finished", "jobs_budget", "prune_rows")
HeadroomOpt = Annotated[
    str | None,
    typer.Option(
        help="GPU memory kept free on every GPU that jobs share by memory (--gpu-mem), "
        "as 1G, 512M or 0"
    ),
]
WORKER_ONLY_OPTIONS = (*RETENTION_OPTIONS, "gpu_mem_headroom", "job_folder_max")


PolicyOpt = Annotated[
    str | None,
    typer.Option(help="scheduling policy: fairshare, las (preempts), or fifo"),
]
PreemptGraceOpt = Annotated[
    str | None,
    typer.Option(help="time a preemptible job has to checkpoint before it is stopped"),
]
PreemptMinRunOpt = Annotated[
    str | None,
    typer.Option(help="the policy preempts a job only once it has run this long"),
]
MaxPreemptionsOpt = Annotated[
    int | None,
    typer.Option(help="the policy preempts one job at most this many times"),
]
NotifyUrlOpt = Annotated[
    str | None,
    typer.Option(
        help="POST every job's end (a sweep's: once, when all of it has ended) here unless "
        "it names its own --notify URL"
    ),
]
NotifyLoopbackOpt = Annotated[
    bool | None,
    typer.Option(
        "--notify-allow-loopback",
        help="let notifications go to this host's own addresses (refused: they could reach "
        "local services no user should drive)",
    ),
]
IdleOpt = Annotated[
    str | None,
    typer.Option(
        help="an interactive session (ddpq shell) whose GPUs stay unused this long is warned, "
        "then ended (reason idle) after --idle-grace, unless it asked for another limit "
        "('off': only those that ask are)"
    ),
]
IdleMaxOpt = Annotated[
    str | None,
    typer.Option(help="the longest idle limit a session may ask for ('off': no maximum)"),
]
IdleGraceOpt = Annotated[
    str | None,
    typer.Option(help="time between an idle session's warning and its end"),
]

ExecutorOpt = Annotated[
    str | None,
    typer.Option(help="where jobs run: local (this host) or slurm (sbatch; docs/slurm.md)"),
]
SlurmPartitionOpt = Annotated[
    str | None, typer.Option(help="Slurm partition for every job  [default: Slurm's default]")
]
SlurmAccountOpt = Annotated[
    str | None, typer.Option(help="Slurm account for every job  [default: the user's default]")
]
SlurmOptionsOpt = Annotated[
    str | None,
    typer.Option(
        help="extra #SBATCH options for every job, as one string: "
        '"--qos=high --cpus-per-gpu=8"  [default: none]'
    ),
]
SlurmUserOptionsOpt = Annotated[
    str | None,
    typer.Option(
        help="the #SBATCH options a job's own --slurm-opt may set: sbatch's long names, "
        'comma-separated ("none": no option)'
    ),
]
SlurmGpusOpt = Annotated[
    int | None,
    typer.Option(
        help="GPUs ddpq may hold in Slurm at once  [default: every GPU of the partition, "
        "from sinfo]"
    ),
]


def _run_daemon(*, api: bool, worker: bool, config: Path | None, flags: dict[str, Any]) -> None:
    """``flags``: the command's options, named as the settings are (``grace``, ``log_cap``)."""
    from ddpq.config import ConfigError
    from ddpq.daemon.run import run
    from ddpq.daemon.settings import load_settings
    from ddpq.daemon.watchdog import WorkerDied

    try:
        run(load_settings(flags, config), api=api, worker=worker)
    except ConfigError as exc:
        fail(str(exc), 2)
    except WorkerDied as exc:  # 1: a failure the service manager restarts (2 it does not)
        fail(str(exc), 1)


def _api_command(with_worker: bool, doc: str) -> Any:
    """`serve` and `server` take the same options; only whether the worker runs differs."""

    def command(
        home: HomeOpt = None,
        config: ConfigOpt = None,
        host: HostOpt = None,
        port: PortOpt = None,
        fake_gpus: FakeOpt = None,
        port_range: RangeOpt = None,
        external_gpus: ExternalOpt = None,
        outside_use: OutsideUseOpt = None,
        grace: GraceOpt = None,
        log_cap: LogCapOpt = None,
        auth: AuthOpt = None,
        stop_jobs: StopJobsOpt = None,
        allow_root: AllowRootOpt = None,
        shared_account: SharedOpt = None,
        socket: SocketOpt = None,
        admin_group: AdminGroupOpt = None,
        remote_accounts: RemoteAccountsOpt = None,
        ports_per_user: PortsPerUserOpt = None,
        notify_url: NotifyUrlOpt = None,
        notify_allow_loopback: NotifyLoopbackOpt = None,
        policy: PolicyOpt = None,
        preempt_grace: PreemptGraceOpt = None,
        preempt_min_run: PreemptMinRunOpt = None,
        max_preemptions: MaxPreemptionsOpt = None,
        keep_finished: KeepFinishedOpt = None,
        jobs_budget: JobsBudgetOpt = None,
        prune_rows: PruneRowsOpt = None,
        idle: IdleOpt = None,
        idle_max: IdleMaxOpt = None,
        idle_grace: IdleGraceOpt = None,
        executor: ExecutorOpt = None,
        slurm_partition: SlurmPartitionOpt = None,
        slurm_account: SlurmAccountOpt = None,
        slurm_options: SlurmOptionsOpt = None,
        slurm_user_options: SlurmUserOptionsOpt = None,
        slurm_gpus: SlurmGpusOpt = None,
        gpu_mem_headroom: HeadroomOpt = None,
        state_reserve: StateReserveOpt = None,
        job_folder_max: JobFolderMaxOpt = None,
    ) -> None:
        flags = {k: v for k, v in locals().items() if k not in ("config", "with_worker")}
        _run_daemon(api=True, worker=with_worker, config=config, flags=flags)

    command.__doc__ = doc
    if not with_worker:
        # `ddpq server` removes nothing: Typer reads the options from this signature.
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.name not in WORKER_ONLY_OPTIONS]
        command.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    return command


app.command("serve", cls=ShowsSettingsDefaults)(
    _api_command(True, "Run the API and the worker in one process (a one-box lab).")
)
app.command("server", cls=ShowsSettingsDefaults)(
    _api_command(False, "Run only the API (pair it with `ddpq worker` on the same state folder).")
)


@app.command(cls=ShowsSettingsDefaults)
def worker(
    home: HomeOpt = None,
    config: ConfigOpt = None,
    fake_gpus: FakeOpt = None,
    port_range: RangeOpt = None,
    external_gpus: ExternalOpt = None,
    outside_use: OutsideUseOpt = None,
    grace: GraceOpt = None,
    log_cap: LogCapOpt = None,
    stop_jobs: StopJobsOpt = None,
    auth: AuthOpt = None,
    allow_root: AllowRootOpt = None,
    shared_account: SharedOpt = None,
    ports_per_user: PortsPerUserOpt = None,
    notify_allow_loopback: NotifyLoopbackOpt = None,
    policy: PolicyOpt = None,
    preempt_grace: PreemptGraceOpt = None,
    preempt_min_run: PreemptMinRunOpt = None,
    max_preemptions: MaxPreemptionsOpt = None,
    keep_finished: KeepFinishedOpt = None,
    jobs_budget: JobsBudgetOpt = None,
    prune_rows: PruneRowsOpt = None,
    idle: IdleOpt = None,
    idle_max: IdleMaxOpt = None,
    idle_grace: IdleGraceOpt = None,
    executor: ExecutorOpt = None,
    slurm_partition: SlurmPartitionOpt = None,
    slurm_account: SlurmAccountOpt = None,
    slurm_options: SlurmOptionsOpt = None,
    slurm_user_options: SlurmUserOptionsOpt = None,
    slurm_gpus: SlurmGpusOpt = None,
    gpu_mem_headroom: HeadroomOpt = None,
    state_reserve: StateReserveOpt = None,
    job_folder_max: JobFolderMaxOpt = None,
) -> None:
    """Run only the worker loop (launches and watches jobs, sends notifications); --auth as
    the API has it."""
    flags = {k: v for k, v in locals().items() if k != "config"}
    _run_daemon(api=False, worker=True, config=config, flags=flags)
