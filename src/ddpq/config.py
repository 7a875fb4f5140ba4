"""Daemon settings: one frozen object, ``Settings``; each setting is declared once, in
``ddpq.config_decl``, and this class adds what is derived from them.

``Settings(home=..., fake_gpus=2)`` built directly (tests, tools) takes its arguments and
the declared defaults, nothing else. The daemon's commands build it with
``ddpq.daemon.settings.load_settings``: command-line flags, then ``DDPQ_*`` variables, then
a TOML config file, then the defaults; each value is checked, whatever its source.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic.fields import FieldInfo

from ddpq.config_decl import Declared
from ddpq.config_values import (
    DEFAULT_PORT_RANGE,
    EXECUTORS,
    MIN_LOG_CAP,
    NO_SOCKET,
    ConfigError,
    Public,
    check_port_range,
    default_home,
    parse_port_range,
    read_ephemeral_range,
)
from ddpq.core.loopback import is_loopback
from ddpq.core.names import MAX_SOCKET_PATH, SOCKET_FILE

# Named here for the modules that import them from ddpq.config.
__all__ = [
    "DEFAULT_PORT_RANGE",
    "EXECUTORS",
    "MIN_LOG_CAP",
    "NO_SOCKET",
    "ConfigError",
    "Public",
    "Settings",
    "check_port_range",
    "default_home",
    "is_loopback",
    "parse_port_range",
    "public_fields",
    "read_ephemeral_range",
]


class Settings(Declared):
    """What the daemon runs with. The worker and the server read these attributes."""

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
        _check_on_this_machine(self, ephemeral, runs_jobs=runs_jobs, listens=listens)


def _check_on_this_machine(
    settings: Settings, ephemeral: tuple[int, int] | None, *, runs_jobs: bool, listens: bool
) -> None:
    if ephemeral is None:
        try:
            ephemeral = read_ephemeral_range()
        except OSError:
            ephemeral = None
    if ephemeral is not None:
        check_port_range(settings.port_range, ephemeral)
    maximum, default = settings.idle_max_s, settings.idle_default_s
    if maximum is not None and (default is None or default > maximum):
        # Checked here, not per source: a flag may raise the maximum a file's default needs.
        raise ConfigError(
            "--idle must be at most --idle-max (a default of 'off' needs --idle-max off)"
        )
    sock = settings.socket_file
    if listens and sock is not None and len(os.fsencode(sock)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"the socket path {sock} is longer than the {MAX_SOCKET_PATH} bytes a Unix "
            "socket's address may hold; choose a shorter one with --socket (or --home), "
            "or --socket none"
        )
    if listens and not settings.auth and not is_loopback(settings.host):
        raise ConfigError(
            f"refusing to listen on {settings.host} without --auth: anyone on the network "
            "could run commands as the daemon's user; use --auth or 127.0.0.1"
        )
    if runs_jobs and settings.auth and os.geteuid() != 0 and not settings.shared_account:
        raise ConfigError(
            "refusing --auth without root: the daemon could not run jobs as their "
            "owners, so every job would run as this account and could read the database "
            "(tokens, everyone's --env secrets) and stop other users' jobs. Run as root, "
            "or add --shared-account if every user may be trusted with every job"
        )
    if not settings.auth and os.geteuid() == 0 and not settings.allow_root_without_auth:
        raise ConfigError(
            "refusing to run as root without --auth: any local user could run commands "
            "as root (and jobs could not run as their owners). Use --auth, or "
            "--allow-root on a machine where every local user is trusted with root"
        )


def public_fields() -> dict[str, tuple[Public, FieldInfo]]:
    """The settings people set, by attribute, in the order declared (the flags' order)."""
    found = {}
    for field, info in Settings.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Public):
                found[field] = (meta, info)
    return found
