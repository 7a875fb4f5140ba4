"""What a Slurm site accepts from ddpq's users: partition names and extra ``#SBATCH`` options.

Shared by the daemon's settings (``--slurm-partition``, ``--slurm-options``) and the API
(a job's own ``partition`` and ``slurm_options``): one definition of which options ddpq
keeps for itself.
"""

from __future__ import annotations

import re

# Options that ddpq writes into every batch script itself, or that the settings hold (the
# partition, the account): an extra option must not change what ddpq leased or tracks.
SLURM_OWNED_OPTIONS = frozenset(
    {
        *("--output", "-o", "--error", "-e", "--input", "-i", "--open-mode", "--hold", "-H"),
        *("--parsable", "--job-name", "-J", "--chdir", "-D", "--comment", "--requeue"),
        *("--no-requeue", "--export", "--export-file", "--wrap", "--array", "-a", "--nodes"),
        *("-N", "--ntasks-per-node", "--gres", "--gpus", "-G", "--gpus-per-node", "--time"),
        *("-t", "--signal", "--partition", "-p", "--account", "-A", "--test-only", "--uid"),
        *("--gid", "--wait", "-W", "--get-user-env"),
    }
)
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+,-]{1,128}\Z")


def slurm_option_error(option: str) -> str | None:
    """Why ``option`` cannot be an extra ``#SBATCH`` line; None if it can."""
    if any(c in option for c in "\n\r\x00"):
        return "must be one line"
    if not option.startswith("-") or option.startswith("---"):
        return "must be an sbatch option written as --name=value"
    name = option.split("=", 1)[0]
    if name in SLURM_OWNED_OPTIONS:
        return f"{name} is set by ddpq for every job (or by a setting of its own)"
    return None
