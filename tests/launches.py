"""Launches for executor tests: the job's spec and the launch's own fields, given as one
set of keywords (``command=``, ``gpus=``, ``unix_account=``...), as executors read them;
and a local executor that leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from ddpq.config import Settings
from ddpq.core.spec import JobSpec
from ddpq.executors.base import Launch
from ddpq.executors.local import cgroups, procs
from ddpq.executors.local.executor import LocalExecutor

# ``gpus`` is both: the launch's are the GPUs leased, the spec's how many were asked for.
OWN_FIELDS = frozenset(f.name for f in fields(Launch))


def a_launch(job_dir: Path, **kw: Any) -> Launch:
    """A launch into ``job_dir``: keywords that name a field of the launch go to it, the
    others to its spec (a ``preempt_signal`` makes it preemptible)."""
    own = {k: v for k, v in kw.items() if k in OWN_FIELDS}
    spec_kw = {k: v for k, v in kw.items() if k not in OWN_FIELDS}
    own.setdefault("job_id", 1)
    own.setdefault("attempt", 1)
    own.setdefault("gpus", ())
    own.setdefault("port", None)
    own.setdefault("unix_account", None)
    if "preempt_signal" in spec_kw:
        spec_kw.setdefault("preemptible", True)
    spec = JobSpec(
        **{
            "name": "j",
            "owner": "alice",
            "command": ["true"],
            "cwd": "/",
            "gpus": len(own["gpus"]),
            **spec_kw,
        }
    )
    return Launch(job_dir=job_dir, spec=spec, **own)


@contextmanager
def leaving_nothing(settings: Settings) -> Iterator[LocalExecutor]:
    """A local executor for ``settings``; afterwards, even when the block failed, what it
    left of its jobs (shims, cgroups) is killed and removed; a block that succeeded fails
    if anything was left."""
    made = LocalExecutor(settings, gpu_count=0)
    try:
        yield made
    finally:
        left = [w.ident.pid for w in made._watched.values()]
        procs.kill_all(left)
        made.close()
        cgroups_left = remove_job_cgroups(settings.home)
    assert left == [] and cgroups_left == [], (left, cgroups_left)


def remove_job_cgroups(home: Path) -> list[Path]:
    """End and remove what is left in the job cgroups of the state folder ``home``, and
    their tree, as a daemon restarted on that folder would find them (its own record); then
    the v1 cgroups of its jobs' limits, empty by then (a daemon killed with SIGKILL leaves
    them). The job cgroups that were left."""
    from ddpq.executors.local import cgroup_v1

    try:
        trees = [Path(p) for p in (home / cgroups.TREES_FILE).read_text().split()]
    except OSError:
        trees = []
    left = [job for tree in trees for job in tree.glob("job-*")]
    for job in left:
        cgroups.destroy(job, timeout=5)
    for tree in trees:
        cgroups.remove(tree)
    for _controller, tree in cgroup_v1.remembered(home):
        for job in tree.glob("job-*"):
            cgroups.remove(job)
        cgroups.remove(tree)
    return left
