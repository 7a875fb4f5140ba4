"""Recording the attempts an executor reports ended: the decision is ``core.disposition``'s,
every write the store's.

All the attempts that ended since the last look are recorded in the caller's transaction
(with the next jobs' leases: under a stream of short jobs that keeps the write lock free
for submissions), together in a few statements (``store.endings.record_exits_many``), in
one savepoint. If that fails, or for an end that adds to a count on its job's row, each
is recorded in a savepoint of its own: one bad exit must not undo the others, and one
whose recording fails is recorded again as failed without reading anything the job
wrote, since that may be what failed. Each end is said in the log once its transaction has
committed (``store.db.when_committed``): a pass that rolls back said ends it never recorded.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from ddpq.config import Settings
from ddpq.core.disposition import after_exit, cuda_out_of_memory, rendezvous_port_clash
from ddpq.core.rules import ExitRecord, within_attempt
from ddpq.core.states import ACTIVE
from ddpq.executors.base import Ended
from ddpq.jobdir import JobDir
from ddpq.store import endings as ending_store
from ddpq.store.db import Session, when_committed

log = logging.getLogger("ddpq.worker")

UNRECORDABLE = "its end could not be recorded"


def record_exits(s: Session, ended: Sequence[Ended], settings: Settings, now: float) -> None:
    if not ended:
        return
    endings = ending_store.endings(s, [e.job_id for e in ended])
    together: list[ending_store.Exit] = []
    alone: list[tuple[ending_store.Ending, Ended]] = []
    for e in ended:
        ending = endings.get(e.job_id)
        if ending is None or ending.state not in ACTIVE or ending.attempt != e.attempt:
            continue  # already recorded (a restart raced us), or an older attempt's
        try:
            decided = _decide(ending, e.record, settings, now, read_files=True)
        except Exception:  # recorded alone, which says what failed
            alone.append((ending, e))
            continue
        if decided.together:
            together.append(decided)
        else:
            alone.append((ending, e))
    if together:
        try:
            with s.begin_nested():
                ending_store.record_exits_many(s, together, now)
        except Exception:
            log.exception("%d ends could not be recorded together; one by one", len(together))
            alone += [(d.ending, e) for d in together for e in ended if e.job_id == d.ending.job_id]
        else:
            for d in together:
                _say_when_committed(s, d.ending.job_id, d.disposition.attempt_reason)
    for ending, e in alone:
        _record_alone(s, ending, e, settings, now)


def _record_alone(
    s: Session, ending: ending_store.Ending, e: Ended, settings: Settings, now: float
) -> None:
    """One end in a savepoint of its own; if that fails, the job failed, recorded without
    reading anything it wrote."""
    # Said only once its savepoint is released: one rolled back at its release (a flush
    # that fails there) must not leave its end to be said at the commit.
    try:
        with s.begin_nested():
            said = _record(s, ending, e.record, settings, now, read_files=True)
    except Exception:
        log.exception("job %s: could not record its end; marking it failed", e.job_id)
        broken = ExitRecord(None, None, now, now, error=UNRECORDABLE)
        try:
            with s.begin_nested():
                said = _record(s, ending, broken, settings, now, read_files=False)
        except Exception:  # left to reconcile at the next start; the others go on
            log.exception("job %s: could not mark it failed either", e.job_id)
            return
    _say_when_committed(s, ending.job_id, said)


def _decide(
    ending: ending_store.Ending,
    record: ExitRecord,
    settings: Settings,
    now: float,
    *,
    read_files: bool,
) -> ending_store.Exit:
    record = within_attempt(record, ending.attempt_started, now)
    folder = JobDir(Path(ending.job_dir)) if read_files and ending.job_dir else None
    progress = folder.read_progress() if folder is not None else None
    disposition = after_exit(
        record,
        ending.facts,
        grace_s=settings.grace_s,
        max_port_retries=settings.max_port_retries,
        now=now,
        port_clash=lambda: folder is not None and rendezvous_port_clash(folder.log_tail()),
        preempt_grace_s=settings.preempt_grace_s,
        checkpointed=progress is not None and progress.get("preempted") is True,
        out_of_memory=lambda: folder is not None and cuda_out_of_memory(folder.log_tail()),
    )
    return ending_store.Exit(ending, record, disposition, progress)


def _record(
    s: Session,
    ending: ending_store.Ending,
    record: ExitRecord,
    settings: Settings,
    now: float,
    *,
    read_files: bool,
) -> str:
    """Record one end; what the log is to say of it once committed."""
    d = _decide(ending, record, settings, now, read_files=read_files)
    ending_store.record_exit(s, ending, d.record, d.disposition, d.progress, now)
    return d.disposition.attempt_reason


def _say_when_committed(s: Session, job_id: int, reason: str) -> None:
    """Log a job's end once the transaction that records it has committed: one that rolls
    back (a full disk, say) leaves the end to be recorded, and said, by a later pass."""
    when_committed(s, functools.partial(log.info, "job %s: %s", job_id, reason))
