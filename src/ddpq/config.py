"""Daemon settings: one frozen object, with every default written here, once.

``Settings(home=..., fake_gpus=2)`` built directly (tests, tools) takes its arguments and
these defaults, nothing else. The daemon's commands build it with
``ddpq.daemon.settings.load_settings``: command-line flags, then ``DDPQ_*`` variables, then
a TOML config file, then these defaults. Every value may be written as people write it:
``grace_s`` takes "1h30m" (or seconds), ``log_cap_bytes`` "64M" (or bytes), ``port_range``
"29600-29999"; each is checked here, whatever its source.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ddpq.core import notify, quota, slurm
from ddpq.core.names import MAX_SOCKET_PATH, SOCKET_FILE, state_folder
from ddpq.core.policy import DEFAULT_POLICY, Policy
from ddpq.core.preempt import DEFAULT_GUARDS
from ddpq.core.units import parse_duration, parse_size
from ddpq.schemas import DEFAULT_API_ADDRESS

DEFAULT_PORT_RANGE = (29600, 29999)
_DEFAULT_RANGE_TEXT = "{}-{}".format(*DEFAULT_PORT_RANGE)
MIN_LOG_CAP = 4096


class ConfigError(ValueError):
    """A setting that ddpq refuses to start with; the message says why."""


def default_home() -> Path:
    """Per-user state folder: $DDPQ_HOME, else $XDG_STATE_HOME/ddpq, else ~/.local/state/ddpq."""
    return Path(state_folder(os.environ, str(Path.home()))).expanduser()


def parse_port_range(text: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ConfigError(
            f"port range {text!r} is not of the form LOW-HIGH, e.g. {_DEFAULT_RANGE_TEXT}"
        ) from None
    return _check_ports((lo, hi))


def read_ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    with open(path) as f:
        lo, hi = f.read().split()
    return int(lo), int(hi)


def check_port_range(ports: tuple[int, int], ephemeral: tuple[int, int]) -> None:
    """Refuse a range that overlaps the kernel's ephemeral ports.

    The kernel hands those out to any outgoing connection, so a rendezvous port
    there can be taken between ddpq's check and torchrun's bind.
    """
    lo, hi = ports
    elo, ehi = ephemeral
    if lo <= ehi and elo <= hi:
        raise ConfigError(
            f"port range {lo}-{hi} overlaps the kernel's ephemeral range {elo}-{ehi} "
            f"(/proc/sys/net/ipv4/ip_local_port_range); choose ports outside it, "
            f"e.g. --port-range {_DEFAULT_RANGE_TEXT}"
        )


# ---- values as people write them -------------------------------------------------------
# Each reader takes what a flag, a variable (always a string) or a TOML value may hold, and
# raises ValueError with a message for people; pydantic then checks the type.


def _not_a_bool(value: object) -> object:
    # A TOML `true` is no number of seconds or bytes, though bool is an int to Python.
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a string, not {str(value).lower()}")
    return value


def _duration(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value, allow_zero=True)  # a grace of 0: SIGKILL at once
    return _not_a_bool(value)


def _size(value: object) -> object:
    return parse_size(value) if isinstance(value, str) else _not_a_bool(value)


def _or_never(word: str, read: Callable[[str], object]) -> Callable[[object], object]:
    """A limit that may be lifted: ``word`` ("forever", "unlimited") is None, so that a
    flag can undo what a lower source set."""

    def check(value: object) -> object:
        if isinstance(value, str):
            return None if value.strip().lower() == word else read(value)
        return _not_a_bool(value)

    return check


def _ports(value: object) -> object:
    return parse_port_range(value) if isinstance(value, str) else value


def _check_ports(ports: tuple[int, int]) -> tuple[int, int]:
    lo, hi = ports
    if not (1024 <= lo <= hi <= 65535):
        raise ConfigError(f"port range {lo}-{hi} must lie within 1024-65535, low before high")
    return ports


def _between(low: int, high: int) -> Callable[[int | None], int | None]:
    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return check


def _at_least(low: int, unit: str = "") -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < low:
            raise ValueError(f"must be at least {low}{unit}")
        return value

    return check


def _external_policy(value: str) -> str:
    if value not in ("avoid", "ignore"):
        raise ValueError("must be 'avoid' or 'ignore'")
    return value


def _outside_use(value: str) -> str:
    if value not in ("count", "show"):
        raise ValueError("must be 'count' or 'show'")
    return value


def _notify_url(url: str | None) -> str | None:
    return None if url is None else notify.check_url(url)


def _absolute(path: Path) -> Path:
    return path.expanduser().resolve()


NO_SOCKET = "none"
# A group name as groupadd takes it (and the upper case some directories use).
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def _socket(value: object) -> object:
    """A socket path (absolute once ``~`` is expanded), or "none" for no socket."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in (NO_SOCKET, "off", ""):
        return NO_SOCKET
    path = os.path.expanduser(text)
    if not os.path.isabs(path) or "\x00" in path:
        raise ValueError(f"{value!r} is not an absolute path (or 'none')")
    return os.path.normpath(path)


def _group(value: object) -> object:
    """A Unix group's name, or None ("none", empty) for no admin group."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("none", ""):
        return None
    if not _GROUP.fullmatch(text):
        raise ValueError(f"{value!r} is not a Unix group name")
    return text


EXECUTORS = ("local", "slurm")


def _executor(value: str) -> str:
    if value not in EXECUTORS:
        raise ValueError("must be 'local' or 'slurm'")
    return value


def _slurm_name(value: str | None) -> str | None:
    if value is not None and not slurm.SLURM_NAME.match(value):
        raise ValueError("must be a Slurm name: letters, digits, '.', '_', '+', '-' (',' lists)")
    return value


Seconds = Annotated[float, BeforeValidator(_duration), Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[int, BeforeValidator(_size), AfterValidator(_at_least(MIN_LOG_CAP, " bytes"))]
# Retention: how long a finished job's folder is kept, and how much all job folders may hold.
KeepFor = Annotated[
    Annotated[float, Field(gt=0, allow_inf_nan=False)] | None,
    BeforeValidator(_or_never("forever", parse_duration)),
]
Budget = Annotated[
    Annotated[int, Field(gt=0)] | None, BeforeValidator(_or_never("unlimited", parse_size))
]
# An interactive session's idle limit: "off" (None) is no reclaim at all.
IdleLimit = Annotated[
    Annotated[float, Field(gt=0, allow_inf_nan=False)] | None,
    BeforeValidator(_or_never("off", parse_duration)),
]
PortRange = Annotated[tuple[int, int], BeforeValidator(_ports), AfterValidator(_check_ports)]
# A size that may be none at all (a headroom of 0).
AnySize = Annotated[int, BeforeValidator(_size), Field(ge=0)]


def _fraction(value: object) -> object:
    """``0.1`` or ``"10%"``."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a fraction (0.1) or a percentage (10%)") from None
    return _not_a_bool(value)


Fraction = Annotated[float, BeforeValidator(_fraction), Field(ge=0, le=10, allow_inf_nan=False)]


# A job folder's limit (core.quota): bytes, a share of the disk (a float), or None.
FolderMax = Annotated[int | float | None, BeforeValidator(quota.read_limit)]


class Settings(BaseSettings):
    """What the daemon runs with. The worker and the server read these attributes."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    home: Annotated[Path, AfterValidator(_absolute)] = Field(
        default_factory=default_home, validate_default=True
    )
    host: str = DEFAULT_API_ADDRESS[0]
    port: Annotated[int, AfterValidator(_between(0, 65535))] = DEFAULT_API_ADDRESS[1]
    fake_gpus: Annotated[int | None, AfterValidator(_between(0, 1024))] = None
    port_range: PortRange = DEFAULT_PORT_RANGE
    # avoid: GPUs running processes ddpq did not start are not handed out.
    external_policy: Annotated[str, AfterValidator(_external_policy)] = "avoid"
    # GPU time of processes in no job, by an account that is a ddpq user's: "count" adds it
    # to that user's fair share; "show" only shows it (ddpq gpus, ddpq usage, /metrics).
    outside_use: Annotated[str, AfterValidator(_outside_use)] = "count"
    grace_s: Seconds = 10.0
    log_cap_bytes: Bytes = 64 * 1024 * 1024
    auth: bool = False
    # A root daemon without --auth lets every local user run commands as root.
    allow_root_without_auth: bool = False
    # --auth without root: every job runs as the daemon's one account, so jobs can
    # read each other's files and the database. Only with the admin's explicit yes.
    shared_account: bool = False
    # The Unix socket the API listens on beside TCP, mode 0666: a caller there is the
    # Unix account the kernel says it is (SO_PEERCRED), with no token. None: SOCKET_FILE
    # in the state folder; NO_SOCKET: none.
    unix_socket: Annotated[str | None, BeforeValidator(_socket)] = None
    # Members of this Unix group are admins when they come through the socket, or with a
    # token they made there; root always is. None: root alone.
    admin_group: Annotated[str | None, BeforeValidator(_group)] = "ddpq-admin"
    # Whether a token a local user made for themselves (`ddpq token create`) may submit
    # jobs over TCP, to run as that user's own Unix account. Off: such a token may watch,
    # read and cancel, and submissions come through the socket.
    remote_accounts: bool = False
    stop_jobs_on_exit: bool = False
    usage_window_s: float = 7 * 24 * 3600.0
    max_port_retries: int = 3
    # Rendezvous ports one user's jobs may hold at once (0: a quarter of --port-range),
    # so one user's flood of torchrun jobs cannot take every port.
    max_user_ports: Annotated[int, AfterValidator(_at_least(0))] = 0
    # Retention (``ddpq.daemon.janitor``): finished jobs' folders older than this are
    # removed (None: kept forever), and with ``prune_rows`` their rows too; the oldest
    # finished jobs' checkpoints, then their logs, go while all job folders hold more than
    # ``jobs_budget_bytes``. Jobs that are not finished are never touched.
    keep_finished_s: KeepFor = None
    jobs_budget_bytes: Budget = None
    prune_rows: bool = False
    # How often the janitor looks (it also looks once when the daemon starts).
    prune_every_s: float = 600.0
    # The state disk (store.headroom, core.quota): room kept for the database's cancels and
    # jobs' ends when the disk fills (0: none), and the most one job's folder may hold (a
    # size, a share of the disk the folders are on as a float, None: no limit), measured
    # every disk_every_s by the process that runs jobs.
    state_reserve_bytes: AnySize = 64 << 20
    job_folder_max: FolderMax = 0.5
    disk_every_s: float = 5.0
    # Interpreter for the shim and for torchrun: the daemon's own, which has torch
    # installed on a GPU host.
    python: str = sys.executable
    # How often the worker looks at the database even when nothing woke it
    # (another process's cancel, a time limit, progress files).
    poll_s: float = 0.5
    # Which scheduling policy orders the queue (core.policy; chosen by trace replay).
    policy: Policy = DEFAULT_POLICY
    # How long a preemptible job has to checkpoint once told to, before it is stopped.
    preempt_grace_s: Seconds = 60.0
    # The policy's guards against thrashing (core.preempt): a job runs this long between
    # preemptions, and is preempted at most this often.
    preempt_min_run_s: Seconds = DEFAULT_GUARDS.min_run_s
    max_preemptions: Annotated[int, Field(ge=0, le=1000)] = DEFAULT_GUARDS.max_preemptions
    # Where jobs run: "local" (a shim on this host) or "slurm" (sbatch to a cluster, see
    # docs/slurm.md). Then the partition and account every job is submitted to (Slurm's
    # defaults if unset), extra #SBATCH options, and how many GPUs ddpq may hold in Slurm
    # at once (unset: every GPU of the partition's nodes, as sinfo counts them).
    executor: Annotated[str, AfterValidator(_executor)] = "local"
    slurm_partition: Annotated[str | None, AfterValidator(_slurm_name)] = None
    slurm_account: Annotated[str | None, AfterValidator(_slurm_name)] = None
    slurm_options: Annotated[tuple[str, ...], BeforeValidator(slurm.daemon_options_setting)] = ()
    # The #SBATCH options a job's own --slurm-opt may set (sbatch's long names; a plugin's
    # options in full): core.slurm.DEFAULT_USER_OPTIONS unless the admin lists others.
    slurm_user_options: Annotated[tuple[str, ...], BeforeValidator(slurm.user_options_setting)] = (
        slurm.DEFAULT_USER_OPTIONS
    )
    slurm_gpus: Annotated[int | None, AfterValidator(_between(0, 1_000_000))] = None
    # Sharing GPUs by memory (core.sharing): kept free on every shared GPU; added to the
    # measured peak by ``--gpu-mem auto``; how often NVML is asked (each running job's
    # memory is sampled then, and outside processes are seen then).
    gpu_mem_headroom_bytes: AnySize = 1 << 30
    gpu_mem_margin: Fraction = 0.10
    gpu_poll_s: Annotated[float, BeforeValidator(_duration), Field(gt=0, allow_inf_nan=False)] = 5.0
    # Where every job's end is POSTed unless it names its own URL (set at submission).
    notify_url: Annotated[str | None, AfterValidator(_notify_url)] = None
    # Notifications may go to this host's own addresses (a relay here; tests).
    notify_allow_loopback: bool = False
    notify_timeout_s: float = notify.TIMEOUT_S
    notify_retry_s: tuple[float, ...] = notify.RETRY_DELAYS_S
    # Interactive sessions (``ddpq shell``, core.interactive): one whose GPUs stay unused
    # this long is warned in its terminal, then ended (reason "idle") after the grace. A
    # session may ask for less, or more up to the maximum ("off": no maximum; a default
    # of "off" needs that). Batch jobs idle longer than the default are shown, not ended.
    idle_default_s: IdleLimit = 30 * 60.0
    idle_max_s: IdleLimit = 4 * 3600.0
    idle_grace_s: Seconds = 5 * 60.0

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

    @property
    def db_path(self) -> Path:
        return self.home / "ddpq.db"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def reserve_path(self) -> Path:
        return self.home / "db-reserve"

    @property
    def wake_socket(self) -> Path:
        return self.home / "worker.sock"

    @property
    def socket_file(self) -> Path | None:
        """Where the API's Unix socket is, or None if it has none."""
        if self.unix_socket == NO_SOCKET:
            return None
        return Path(self.unix_socket) if self.unix_socket else self.home / SOCKET_FILE

    @property
    def trust_file(self) -> Path:
        return self.home / "trust-mode"

    @property
    def samples_outside_use(self) -> bool:
        """Whether the worker looks for GPU use outside the queue: on this host's GPUs only.
        With jobs on Slurm the worker's GPUs are a budget of slots in the cluster, and it
        looks at no device here (nor at the nodes' devices, which Slurm owns)."""
        from ddpq.executors.capabilities import capabilities  # a table: imports no executor

        return capabilities(self.executor).on_this_host

    @property
    def counts_outside_use(self) -> bool:
        """Whether outside use counts in its user's fair share: so configured, and sampled."""
        return self.outside_use == "count" and self.samples_outside_use

    @property
    def idle_long_s(self) -> float:
        """When a job's GPUs count as idle long (``ddpq gpus``, the page, ``/metrics``): the
        default idle limit, or 30 minutes where sessions are never reclaimed."""
        return self.idle_default_s or 30 * 60.0

    @property
    def ports_per_user(self) -> int:
        lo, hi = self.port_range
        return self.max_user_ports or max(1, (hi - lo + 1) // 4)

    @property
    def trust_mode(self) -> str:
        """Whom the API believes; ``ddpq server`` and ``ddpq worker`` must agree on it."""
        return "auth" if self.auth else "no-auth"

    # The name pydantic keeps for its deprecated v1 classmethod: the worker, the server and
    # the daemon call this one.
    def validate(  # type: ignore[override]
        self,
        ephemeral: tuple[int, int] | None = None,
        *,
        runs_jobs: bool = True,
        listens: bool = True,
    ) -> None:
        """What can only be checked on the machine the daemon starts on (each value's own
        form was checked when the settings were made)."""
        if ephemeral is None:
            try:
                ephemeral = read_ephemeral_range()
            except OSError:
                ephemeral = None
        if ephemeral is not None:
            check_port_range(self.port_range, ephemeral)
        maximum, default = self.idle_max_s, self.idle_default_s
        if maximum is not None and (default is None or default > maximum):
            # Checked here, not per source: a flag may raise the maximum a file's default needs.
            raise ConfigError(
                "--idle must be at most --idle-max (a default of 'off' needs --idle-max off)"
            )
        sock = self.socket_file
        if listens and sock is not None and len(os.fsencode(sock)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"the socket path {sock} is longer than the {MAX_SOCKET_PATH} bytes a Unix "
                "socket's address may hold; choose a shorter one with --socket (or --home), "
                "or --socket none"
            )
        if listens and not self.auth and not is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without --auth: anyone on the network "
                "could run commands as the daemon's user; use --auth or 127.0.0.1"
            )
        if runs_jobs and self.auth and os.geteuid() != 0 and not self.shared_account:
            raise ConfigError(
                "refusing --auth without root: the daemon could not run jobs as their "
                "owners, so every job would run as this account and could read the database "
                "(tokens, everyone's --env secrets) and stop other users' jobs. Run as root, "
                "or add --shared-account if every user may be trusted with every job"
            )
        if not self.auth and os.geteuid() == 0 and not self.allow_root_without_auth:
            raise ConfigError(
                "refusing to run as root without --auth: any local user could run commands "
                "as root (and jobs could not run as their owners). Use --auth, or "
                "--allow-root on a machine where every local user is trusted with root"
            )


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
