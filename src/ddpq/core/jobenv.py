"""A job's environment: what a submitter's shell sends, what is left out, how it is stored.

``ddpq submit`` sends the submitter's environment by default (``--export ALL``, as Slurm's
``sbatch`` does), so a job runs the Python of the venv or conda env that was active. What
travels and what a job then gets:

- Variables that only make sense in the submitting terminal (``TERMINAL_ONLY``: the SSH
  agent, the X display, the terminal type, the shell's own bookkeeping) are left out, by
  the CLI (they never travel) and again by the daemon (a client that sent them anyway).
- ddpq's own variables (``is_reserved``: the job contract's and every ``DDPQ_*``, the
  user's ``DDPQ_TOKEN`` among them) are left out of an exported environment silently (a
  shell may well have ``MASTER_PORT`` set); in an explicit ``--env`` they are refused.
- The job starts from the exported environment instead of the daemon's, then ``--env``,
  then the job contract (``executors.contract``), which always wins. An API client that
  exports nothing gets the daemon's environment plus ``env``, as before.

Standard library only: the CLI uses it without pydantic, the schemas and the executors too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# The job contract's names for which job and attempt a process belongs to (the API tells a
# session's own server from another listener on its port by them, and by its account).
JOB_ID_VAR = "DDPQ_JOB_ID"
ATTEMPT_VAR = "DDPQ_ATTEMPT"
# A variable an explicit `--env NAME=VALUE` (the API's `env`) or `--export A,B` may name.
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
# Set by ddpq for every job (the job contract); a submission may not override them.
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
    }
)

# Meaningful only in the terminal a job was submitted from: the job has no terminal, no
# display and no agent of its own, and a stale one would mislead it (an editor opened on
# a dead DISPLAY, ssh asking an agent socket that is gone, tmux commands sent to the
# submitter's session). Documented in the README; `--env NAME=VALUE` passes one anyway.
TERMINAL_ONLY = frozenset(
    {
        # the SSH session and its agent
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_CONNECTION",
        "SSH_CLIENT",
        "SSH_TTY",
        "SSH_ASKPASS",
        "GPG_TTY",
        # the graphical session
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "XAUTHORITY",
        "WINDOWID",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_SESSION_ID",
        "XDG_SESSION_TYPE",
        "XDG_SESSION_CLASS",
        "XDG_SEAT",
        "XDG_VTNR",
        "XDG_RUNTIME_DIR",
        # the terminal and its multiplexers
        "TERM",
        "COLORTERM",
        "TERM_PROGRAM",
        "TERM_PROGRAM_VERSION",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOW",
        "COLUMNS",
        "LINES",
        # the interactive shell's own bookkeeping
        "SHLVL",
        "OLDPWD",
        "PWD",
        "_",
    }
)

# What an environment may hold, in all (keys and values, after what is left out): a conda
# shell's is typically 10-80 KiB (a 64 KiB PATH + LD_LIBRARY_PATH, ~150 variables).
MAX_ENV_VARS = 1024
MAX_ENV_VALUE = 64 * 1024  # the kernel takes at most 128 KiB per "KEY=VALUE" string
MAX_ENV_BYTES = 256 * 1024  # with the command (64 KiB), far below execve's 2 MiB
MAX_ENV_KEY = 1024

# The environment a job gets when its submitter exported none of these: Slurm's choice for
# `--export=NONE`. HOME, USER and LOGNAME are those of the account the job runs as.
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
ACCOUNT_VARS = ("HOME", "USER", "LOGNAME")
# Carried from the submitter's shell even by `--export NONE` or a list: the language of
# the job's messages and the encoding of its file names.
ALWAYS_EXPORTED = ("LANG",)

# The stored form: one mapping, whose this key (no variable can be named so: '=' ends a
# name) says that the variables are the job's whole starting environment.
EXPORTED_MARK = "=exported"


def is_reserved(key: str) -> bool:
    """A variable the job contract sets (or any ``DDPQ_*``): never the submitter's."""
    return key in RESERVED_ENV or key.startswith("DDPQ_")


def left_out(key: str) -> bool:
    """A variable an exported environment never carries."""
    return key in TERMINAL_ONLY or is_reserved(key)


def is_exportable_name(key: str) -> bool:
    """A name the kernel can pass in an environment (not only shell identifiers: Bash
    exports functions as ``BASH_FUNC_module%%``, which Lmod's ``module`` needs)."""
    return 0 < len(key) <= MAX_ENV_KEY and "=" not in key and "\x00" not in key


def without_left_out(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not left_out(k)}


def parse_export(spec: str) -> tuple[str, ...] | None:
    """``--export``: None for ALL, () for NONE, else the names listed (``A,B``).

    Raises ``ValueError`` for a list that holds something that is not a variable name.
    """
    cleaned = spec.strip()
    if cleaned.upper() == "ALL":
        return None
    if cleaned.upper() == "NONE":
        return ()
    names = tuple(name.strip() for name in cleaned.split(","))
    for name in names:
        if not ENV_KEY_RE.match(name):
            raise ValueError(f"{name!r} is not a variable name (give ALL, NONE or NAME,NAME,...)")
    return names


def exported(
    environ: Mapping[str, str], names: Iterable[str] | None
) -> tuple[dict[str, str], list[str]]:
    """What the CLI sends of ``environ`` for ``--export`` (``names`` as ``parse_export``
    gives them), and the names it had to leave out because they are not valid UTF-8."""
    if names is None:
        chosen = dict(environ)
    else:
        chosen = {k: environ[k] for k in (*ALWAYS_EXPORTED, *names) if k in environ}
    out: dict[str, str] = {}
    undecodable: list[str] = []
    for key, value in chosen.items():
        if left_out(key) or not is_exportable_name(key):
            continue
        try:
            # os.environ holds bytes that are not UTF-8 as lone surrogates, which JSON
            # cannot carry as text and the daemon refuses.
            key.encode()
            value.encode()
        except UnicodeEncodeError:
            undecodable.append(key.encode("utf-8", "replace").decode())
            continue
        out[key] = value
    return out, undecodable


def pack(exported_env: Mapping[str, str] | None, env: Mapping[str, str]) -> dict[str, str]:
    """The stored form of a submission's environment: ``env`` over ``exported_env``, marked
    as the whole starting environment when there is one (the daemon's otherwise)."""
    if exported_env is None:
        return dict(env)
    return {EXPORTED_MARK: "1", **exported_env, **env}


def unpack(stored: Mapping[str, str]) -> tuple[bool, dict[str, str]]:
    """(whether the variables are the job's whole starting environment, the variables)."""
    variables = {k: v for k, v in stored.items() if k != EXPORTED_MARK}
    return EXPORTED_MARK in stored, variables
