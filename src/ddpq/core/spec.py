"""What a job is: one frozen record of what its submission asked for, checked.

Every layer reads this one record: the API validates a submission into it
(``server.routes.jobs``), the store persists it (``store.jobs.create_job``) and reads it
back (``models.Job.spec``), the planner and the executors read it, and a launch is this
spec plus what the worker leased it (``executors.base.Launch``). Adding a job field is:
a field here, a migration for its column, the API's field and the CLI option if it has
one; nothing else copies fields by hand.

Pure data (standard library only): the spec says nothing about where the job runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobSpec:
    """A submission as checked by the API: who owns it, what it runs, what it needs."""

    name: str
    owner: str
    command: list[str]
    cwd: str
    gpus: int  # an elastic job's minimum
    launcher: str = "plain"  # plain | torchrun
    # The exported environment and --env in one marked mapping (core.jobenv.pack).
    env: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    time_limit_s: float | None = None
    max_retries: int = 0
    after: tuple[int, ...] = ()
    hold: bool = False
    after_sweeps: tuple[int, ...] = ()  # waits for every member of these sweeps to succeed
    notify_url: str | None = None
    preemptible: bool = False
    preempt_signal: str = "USR1"
    interactive: bool = False  # a session (ddpq shell): its shim holds a terminal
    idle_s: float | None = None  # a session's idle limit (core.interactive); None: never
    run_as: str | None = None  # the Unix account the submission proved (models.Job.run_as)
    nodes: int = 1
    gpus_per_node: int | None = None
    partition: str | None = None
    slurm_options: tuple[str, ...] = ()
    gpu_mem_bytes: int | None = None  # sharing GPUs by memory: reserved on each
    gpu_mem_auto: bool = False  # reserve what earlier runs of it were measured to use
    gpu_share: int | None = None
    mem_key: str | None = None  # which earlier jobs are the same job (``auto``)
    # Hardware it asks for (``core.topology``): the worst link class its GPUs may have
    # among them (NV, PIX, PXB, PHB, NODE, SYS; ``--gpu-link``), and a model or MIG profile
    # its GPUs' names must contain (``--gpu-type``, case-insensitive).
    gpu_link: str | None = None
    gpu_type: str | None = None
    # The host's CPU cores and memory it asks for (``--cpus``, ``--mem``); None: the
    # daemon's defaults when it is placed (``core.hostres``).
    cpus: int | None = None
    ram_bytes: int | None = None
    # Slurm's other dependency kinds (``--dependency``, ``core.deps``): jobs and sweeps
    # that must end (afterany) or end without success (afternotok); ``after`` and
    # ``after_sweeps`` are afterok. singleton: waits until every earlier job of its owner
    # with its name has ended.
    after_any: tuple[int, ...] = ()
    after_notok: tuple[int, ...] = ()
    after_any_sweeps: tuple[int, ...] = ()
    after_notok_sweeps: tuple[int, ...] = ()
    singleton: bool = False
    # Elastic (``--gpus 2-4``, ``core.scheduler.elastic``): the most GPUs it may be given,
    # above ``gpus``, its least; None: it runs on ``gpus`` exactly. Each attempt's size is
    # its lease (``DDPQ_GPUS``), grown or shrunk at a checkpoint (the preemption signal).
    gpus_max: int | None = None
