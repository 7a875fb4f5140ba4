"""What accounting reads and writes: outside use's intervals, and the attempts' records.

The worker records each sample of outside use here (``record_sample``); the usage report,
fair share and ``/metrics`` read it back with the attempts and jobs. The decisions (what a
sample extends, how a window is cut, who an account is) are ``core.usage``'s. Flush,
never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.orm import Session

from ddpq.core import usage as core
from ddpq.core.names import UNIX_NAME
from ddpq.core.rules import Run
from ddpq.core.states import TERMINAL
from ddpq.store.models import Attempt, Job, OutsideUse, User

_outside = cast(Table, OutsideUse.__table__)


def record_sample(
    session: Session, seen: Sequence[core.Sighting], now: float, credit_s: float
) -> None:
    """One sample: each account seen on a GPU extends its interval there (if its latest
    ended ``MERGE_GAP_S`` ago or less), or opens one that stands for ``credit_s``."""
    conn = session.connection()
    t = _outside
    for s in seen:
        latest = conn.execute(
            select(t.c.id, t.c.ended_at)
            .where(
                t.c.gpu == s.gpu,
                t.c.uid.is_(None) if s.uid is None else t.c.uid == s.uid,
                t.c.ended_at >= now - core.MERGE_GAP_S,
            )
            .order_by(t.c.ended_at.desc())
            .limit(1)
        ).first()
        if latest is not None:
            if now > latest.ended_at:  # a clock stepped back extends nothing
                conn.execute(update(t).where(t.c.id == latest.id).values(ended_at=now))
            continue
        conn.execute(
            insert(t).values(
                uid=s.uid, account=s.account, gpu=s.gpu, started_at=now - credit_s, ended_at=now
            )
        )


def outside_spans(session: Session, since: float, until: float) -> list[core.OutsideSpan]:
    """The intervals that reach into [since, until], whole (the report clips them)."""
    rows = session.execute(
        select(OutsideUse.uid, OutsideUse.account, OutsideUse.started_at, OutsideUse.ended_at)
        .where(OutsideUse.ended_at >= since, OutsideUse.started_at <= until)
        .order_by(OutsideUse.id)
    )
    return [core.OutsideSpan(*row) for row in rows]


def job_spans(session: Session, since: float) -> list[core.JobSpan]:
    """Every attempt that ran at some time since ``since`` (or runs still), with the number
    of GPUs it was leased (recorded on the attempt when the leases were taken)."""
    rows = session.execute(
        select(
            Job.owner,
            func.json_array_length(Attempt.gpus),
            Attempt.started_at,
            Attempt.ended_at,
            Attempt.gpu_mem_bytes,
            Attempt.peak_mem_bytes,
            func.coalesce(func.json_array_length(Attempt.cores), 0),
        )
        .join(Job, Job.id == Attempt.job_id)
        .where((Attempt.ended_at.is_(None)) | (Attempt.ended_at >= since))
    )
    return [
        core.JobSpan(owner, int(n or 0), start, end, mem, peak, int(cores))
        for owner, n, start, end, mem, peak, cores in rows
    ]


def finished(session: Session, since: float) -> list[core.Finished]:
    rows = session.execute(
        select(Job.owner, Job.state, Job.ended_at).where(
            Job.state.in_(list(TERMINAL)), Job.ended_at >= since
        )
    )
    return [core.Finished(owner, state, end) for owner, state, end in rows if end is not None]


def first_starts(session: Session, since: float) -> list[core.FirstStart]:
    """Jobs first started since ``since``, with their wait (the start of attempt 1 less the
    submission, as ``ddpq_queue_wait_seconds`` measures it)."""
    rows = session.execute(
        select(Job.owner, Attempt.started_at, Attempt.started_at - Job.submitted_at)
        .join(Job, Job.id == Attempt.job_id)
        .where(Attempt.number == 1, Attempt.started_at >= since)
    )
    return [core.FirstStart(owner, start, max(0.0, wait)) for owner, start, wait in rows]


# Accounts asked about per statement: far below SQLite's bound on a statement's variables.
_PEOPLE_CHUNK = 500


def people(session: Session, accounts: Collection[str], names_are_users: bool) -> dict[str, str]:
    """account -> the ddpq user its use belongs to (``core.usage.attribute``)."""
    # Only an account name can be mapped ("uid 1234", "(unknown)" cannot), and a host
    # whose users cycle through sub-uids may have seen thousands of those.
    names = sorted(a for a in accounts if UNIX_NAME.match(a))
    mapped: dict[str, list[str]] = {}
    for i in range(0, len(names), _PEOPLE_CHUNK):
        chunk = names[i : i + _PEOPLE_CHUNK]
        rows = session.execute(select(User.unix_user, User.name).where(User.unix_user.in_(chunk)))
        for account, name in rows:
            if account is not None:
                mapped.setdefault(account, []).append(name)
    return core.attribute(names, mapped, names_are_users)


def outside_runs(session: Session, since: float, names_are_users: bool) -> list[Run]:
    """Outside use since ``since`` as fair share's runs, for the accounts that are a ddpq
    user's: one GPU each, for its interval."""
    spans = outside_spans(session, since, float("inf"))
    labels = {core.account_label(o.uid, o.account) for o in spans}
    who = people(session, labels, names_are_users)
    runs = []
    for o in spans:
        user = who.get(core.account_label(o.uid, o.account))
        if user is not None:
            runs.append(Run(user, 1, o.started_at, o.ended_at))
    return runs


@dataclass(frozen=True)
class AccountTotal:
    label: str  # core.usage.account_label
    first_at: float  # its first interval's start: the order in which accounts appeared
    seconds: float


def totals(session: Session) -> list[AccountTotal]:
    """GPU-seconds of outside use per account since the table began, in the order the
    accounts first appeared. The intervals only grow, so each total only grows."""
    rows = session.execute(
        select(
            OutsideUse.uid,
            OutsideUse.account,
            func.min(OutsideUse.started_at),
            func.sum(OutsideUse.ended_at - OutsideUse.started_at),
        ).group_by(OutsideUse.uid, OutsideUse.account)
    )
    by_label: dict[str, tuple[float, float]] = {}
    for uid, account, first, seconds in rows:
        label = core.account_label(uid, account)
        was_first, was_seconds = by_label.get(label, (first, 0.0))
        by_label[label] = (min(first, was_first), was_seconds + float(seconds or 0.0))
    out = [AccountTotal(label, first, s) for label, (first, s) in by_label.items()]
    return sorted(out, key=lambda t: (t.first_at, t.label))


def report(
    session: Session, since: float, now: float, by: core.By, names_are_users: bool
) -> core.Report:
    """The usage report for [since, now] (``core.usage.report``), from the attempts, the
    jobs and the outside intervals as they are now."""
    outside = outside_spans(session, since, now)
    labels = {core.account_label(o.uid, o.account) for o in outside}
    return core.report(
        job_spans(session, since),
        outside,
        finished(session, since),
        first_starts(session, since),
        people(session, labels, names_are_users),
        since,
        now,
        by,
    )
