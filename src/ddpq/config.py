"""Daemon settings: one frozen object built from flags and ``DDPQ_*`` variables."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_PORT_RANGE = (29600, 29999)


class ConfigError(ValueError):
    """A setting that ddpq refuses to start with; the message says why."""


def default_home() -> Path:
    """Per-user state folder: $DDPQ_HOME, else $XDG_STATE_HOME/ddpq, else ~/.local/state/ddpq."""
    if os.environ.get("DDPQ_HOME"):
        return Path(os.environ["DDPQ_HOME"]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "ddpq"


def parse_port_range(text: str) -> tuple[int, int]:
    try:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ConfigError(
            f"port range {text!r} is not of the form LOW-HIGH, e.g. 29600-29999"
        ) from None
    if not (1024 <= lo <= hi <= 65535):
        raise ConfigError(f"port range {text!r} must lie within 1024-65535, low before high")
    return lo, hi


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
            f"e.g. --port-range {DEFAULT_PORT_RANGE[0]}-{DEFAULT_PORT_RANGE[1]}"
        )


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = 8765
    fake_gpus: int | None = None
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    # avoid: GPUs running processes ddpq did not start are not handed out.
    external_policy: str = "avoid"
    grace_s: float = 10.0
    log_cap_bytes: int = 64 * 1024 * 1024
    auth: bool = False
    # A root daemon without --auth lets every local user run commands as root.
    allow_root_without_auth: bool = False
    # --auth without root: every job runs as the daemon's one account, so jobs can
    # read each other's files and the database. Only with the admin's explicit yes.
    shared_account: bool = False
    stop_jobs_on_exit: bool = False
    usage_window_s: float = 7 * 24 * 3600.0
    max_port_retries: int = 3
    # Rendezvous ports one user's jobs may hold at once (0: a quarter of --port-range),
    # so one user's flood of torchrun jobs cannot take every port.
    max_user_ports: int = 0
    # Interpreter for the shim and for torchrun: the daemon's own, which has torch
    # installed on a GPU host.
    python: str = sys.executable
    # How often the worker looks at the database even when nothing woke it
    # (another process's cancel, a time limit, progress files).
    poll_s: float = 0.5

    @property
    def db_path(self) -> Path:
        return self.home / "ddpq.db"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def wake_socket(self) -> Path:
        return self.home / "worker.sock"

    @property
    def trust_file(self) -> Path:
        return self.home / "trust-mode"

    @property
    def ports_per_user(self) -> int:
        lo, hi = self.port_range
        return self.max_user_ports or max(1, (hi - lo + 1) // 4)

    @property
    def trust_mode(self) -> str:
        """Whom the API believes; ``ddpq server`` and ``ddpq worker`` must agree on it."""
        return "auth" if self.auth else "no-auth"

    def validate(self, ephemeral: tuple[int, int] | None = None, *, runs_jobs: bool = True) -> None:
        if self.fake_gpus is not None and not 0 <= self.fake_gpus <= 1024:
            raise ConfigError("--fake-gpus must be between 0 and 1024")
        if self.external_policy not in ("avoid", "ignore"):
            raise ConfigError("--external-gpus must be 'avoid' or 'ignore'")
        if self.max_user_ports < 0:
            raise ConfigError("--ports-per-user must not be negative")
        if self.grace_s < 0:
            raise ConfigError("--grace must not be negative")
        if self.log_cap_bytes < 4096:
            raise ConfigError("--log-cap must be at least 4096 bytes")
        if ephemeral is None:
            try:
                ephemeral = read_ephemeral_range()
            except OSError:
                ephemeral = None
        if ephemeral is not None:
            check_port_range(self.port_range, ephemeral)
        if not self.auth and not is_loopback(self.host):
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
