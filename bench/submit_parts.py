"""Where a submission's CPU goes inside ddpq's own code: the route's parts, timed in-process.

    python bench/submit_parts.py [--runs 1000]

No HTTP, no daemon: a migrated database in a temporary folder, and the steps of
``server.routes.jobs.submit`` called as the route calls them, ``--runs`` times (after
50 to warm up): the body's validation from its JSON, ``job_spec``, the disk check, and
in the write transaction the GPU count, the queue cap, the job's row and event, its view
and its serialized answer. Prints the interpreter's CPU per submission for each
(``time.thread_time``). Set beside ``bench/post_cpu.py``'s server CPU a submission, the
difference is what uvicorn, Starlette and FastAPI add around the route.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from machine import machine_line, python_c_pass_ms

from ddpq.config import Settings
from ddpq.schemas.submit import JobSubmit
from ddpq.server import queue_caps, views
from ddpq.server import submission_checks as checks
from ddpq.server.deps import Caller
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.server.routes.jobs import SUBMITTED, job_spec
from ddpq.store import jobs as job_store
from ddpq.store.db import Database, migrate

BODY = b'{"command": ["true"], "gpus": 0}'
WARM = 50
Spent = defaultdict[str, float]


def timed(spent: Spent, part: str, step: Callable[..., Any], *args: Any) -> Any:
    began = time.thread_time()
    try:
        return step(*args)
    finally:
        spent[part] += time.thread_time() - began


def one_submission(spent: Spent, settings: Settings, db: Database) -> None:
    """The route's steps, in its order (``server.routes.jobs.submit``)."""
    body = timed(spent, "the body validated", JobSubmit.model_validate_json, BODY)
    who = Caller("bench", admin=False)
    spec = timed(spent, "job_spec", job_spec, body, who, settings, db, NotifyLookups())
    timed(spent, "the disk check", checks.refuse_if_disk_short, db)
    began = time.thread_time()
    with db.write() as s:
        timed(spent, "  the GPU count", checks.check_gpus, s, 0, None, settings)
        timed(spent, "  the queue cap", queue_caps.refuse_if_over, s, settings, "bench", 1)
        job = timed(spent, "  the job's row and event", job_store.create_job, s, spec, 0.0)
        waits = views.spec_waits(spec)
        out = timed(spent, "  its view", views.job_out, job, ([], None), waits)
        timed(spent, "  its answer serialized", views.answer, out, SUBMITTED)
    spent["the write transaction, in all"] += time.thread_time() - began


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddpq-submit-parts-"))
    spent: Spent = defaultdict(float)
    try:
        settings = Settings(home=home)
        migrate(settings.db_path)
        db = Database(settings.db_path)
        for run in range(WARM + args.runs):
            if run == WARM:
                spent.clear()
            one_submission(spent, settings, db)
        db.dispose()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; {args.runs} submissions")
    print("| part | interpreter CPU a submission |")
    print("|---|---|")
    for part, seconds in spent.items():
        print(f"| {part} | {seconds / args.runs * 1000:.3f} ms |")
    whole = sum(seconds for part, seconds in spent.items() if not part.startswith(" "))
    print(f"| all of the route's own steps | {whole / args.runs * 1000:.3f} ms |")


if __name__ == "__main__":
    main()
