"""Launches for executor tests: the job's spec and the launch's own fields, given as one
set of keywords (``command=``, ``gpus=``, ``unix_account=``...), as executors read them."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ddpq.core.spec import JobSpec
from ddpq.executors.base import Launch

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
