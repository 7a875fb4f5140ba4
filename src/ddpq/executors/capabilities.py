"""What each executor supports, looked up by its kind (``settings.executor``).

The server (which starts no process and imports no executor) and the worker ask this
record, never the executor's name: a new executor is a row here, and the layers above
read what it can do. Standard library and ``core`` only, so that asking costs no import
of an executor itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ddpq.core.spec import JobSpec

# The spec's fields that only an executor placing jobs on a cluster's nodes reads, in the
# order a refusal names the first one given.
CLUSTER_FIELDS = ("nodes", "gpus_per_node", "partition", "slurm_options")
_DEFAULTS = {f.name: f.default for f in fields(JobSpec) if f.name in CLUSTER_FIELDS}


@dataclass(frozen=True)
class Capabilities:
    """What jobs of one executor can ask for, and where they run."""

    kind: str  # the name it is chosen by (``settings.executor``)
    # Its jobs' GPUs are this host's devices: NVML here sees them (idle sessions, outside
    # use, measured peaks) and its jobs' ports are this host's. Else they are slots of a
    # budget in a cluster whose nodes this host cannot look at.
    on_this_host: bool
    shares_gpus_by_memory: bool  # a job may reserve part of a GPU (gpu_mem)
    interactive_sessions: bool  # a session's terminal can be relayed to its owner
    places_on_nodes: bool  # takes nodes, gpus_per_node, a partition, #SBATCH options
    runs_jobs_as_root: bool  # may run a job as uid 0 (a cluster would run it on every node)
    # Runs an elastic job (``gpus_max``): each attempt on its lease's size, resized at a
    # checkpoint its own preemption signal asks for.
    resizes_jobs: bool = False

    def refuses(self, spec: JobSpec) -> str | None:
        """Why this executor cannot run ``spec`` (one line naming the field), or None."""
        if not self.places_on_nodes:
            given = [f for f in CLUSTER_FIELDS if getattr(spec, f) != _DEFAULTS[f]]
            if given:
                return (
                    f"{given[0]}: this daemon runs jobs on this host, not on Slurm "
                    "(only --executor slurm takes nodes, partitions and #SBATCH options)"
                )
        shares = spec.gpu_mem_bytes is not None or spec.gpu_mem_auto
        if not self.shares_gpus_by_memory and shares:
            # Slurm hands out whole GPUs (gres), and no NVML sample of a cluster node reaches
            # this daemon: neither a share nor a measured peak would hold there.
            return (
                "gpu_mem: this daemon runs jobs on Slurm, which gives jobs whole GPUs; "
                "sharing GPUs by memory needs the local executor"
            )
        if not self.interactive_sessions and spec.interactive:
            # Its shim would run on a Slurm node, with its terminal's socket in a folder
            # there: nothing relays that yet, so the user would wait for a session they
            # cannot reach.
            return (
                "interactive: this daemon runs jobs on Slurm, where ddpq cannot relay a "
                "session's terminal yet (use salloc/srun --pty, or a daemon with --executor local)"
            )
        if not self.on_this_host and (spec.gpu_link is not None or spec.gpu_type is not None):
            # Slurm picks the devices: a budget slot has no model or links ddpq could match.
            return (
                "gpu_link, gpu_type: this daemon runs jobs on Slurm, which chooses the GPUs "
                "(ask it with --slurm-option --gres=gpu:TYPE:N)"
            )
        if not self.on_this_host and (spec.cpus is not None or spec.ram_bytes is not None):
            # This host's cores and memory are not the nodes': Slurm's own options ask
            # for those, and Slurm enforces them.
            field = "cpus" if spec.cpus is not None else "mem"
            return (
                f"{field}: this daemon runs jobs on Slurm; ask it for cores and memory with "
                "--slurm-opt cpus-per-task=N / mem=SIZE"
            )
        if not self.resizes_jobs and spec.gpus_max is not None:
            # Its batch script asks Slurm for a fixed count, and a preemption there is a
            # plain stop, not the job's checkpoint signal.
            return "gpus_max: this daemon runs jobs on Slurm, where a job's size is fixed"
        return None


LOCAL = Capabilities(
    kind="local",
    on_this_host=True,
    shares_gpus_by_memory=True,
    interactive_sessions=True,
    places_on_nodes=False,
    runs_jobs_as_root=True,
    resizes_jobs=True,
)
SLURM = Capabilities(
    kind="slurm",
    on_this_host=False,
    shares_gpus_by_memory=False,
    interactive_sessions=False,
    places_on_nodes=True,
    runs_jobs_as_root=False,
)
_BY_KIND = {c.kind: c for c in (LOCAL, SLURM)}


def capabilities(kind: str) -> Capabilities:
    """The capabilities of the executor ``settings.executor`` names (config checks it is
    one of these; anything else is a bug, and raises KeyError)."""
    return _BY_KIND[kind]
