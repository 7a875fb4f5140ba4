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
    """A local executor for ``settings``; afterwards, what a failed test left of its jobs
    (shims, cgroups) is killed and removed, and the test fails if anything was left."""
    made = LocalExecutor(settings, gpu_count=0)
    yield made
    left = [w.ident.pid for w in made._watched.values()]
    procs.kill_all(left)
    made.close()
    tree = made.tracking.tree
    cgroups_left = list(tree.glob("job-*")) if tree is not None else []
    for cgroup in cgroups_left:
        cgroups.destroy(cgroup, timeout=10)
    if tree is not None:
        cgroups.remove(tree)
    # The v1 cgroups of its limits (a failed test's processes are killed above).
    for v1_tree in made.limits.v1.values():
        for cgroup in v1_tree.glob("job-*"):
            cgroups.remove(cgroup)
        cgroups.remove(v1_tree)
    assert left == [] and cgroups_left == [], (left, cgroups_left)
