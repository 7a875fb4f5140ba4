"""``store.transitions``: the one writer of a job's state and its history.

The first tests read the store's source: no module but ``transitions`` writes ``jobs.state``
or an event (and the reader that says so is checked against the ways it used to be done).
The others run the writer on a real SQLite file: illegal changes refused before anything is
written, one job and many, events with their reasons, and a change decided on a stale read
that writes nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from ddpq.core.spec import JobSpec
from ddpq.core.states import InvalidTransition, JobState, can_transition
from ddpq.store import jobs, transitions
from ddpq.store.db import Database
from ddpq.store.transitions import Change
from tests.template_db import migrated

STORE = Path(__file__).resolve().parents[1] / "src" / "ddpq" / "store"
# The writer itself, and the tables' declarations.
ALLOWED = {"transitions.py", "models.py"}
Q, H, ST, R = JobState.QUEUED, JobState.HELD, JobState.STARTING, JobState.RUNNING
C, S, F = JobState.CANCELLED, JobState.SUCCEEDED, JobState.FAILED

# ---- nobody else writes a state or an event -------------------------------------------------


def _names_jobs(node: ast.expr) -> bool:
    """The argument of an ``update(...)`` is the jobs table (``Job``, ``_jobs``...)."""
    return re.search(r"\b_?[Jj]obs?\b", ast.unparse(node)) is not None


def _root_call(call: ast.Call) -> ast.Call:
    """The first call of a chain such as ``update(t).where(...).values(...)``."""
    root, node = call, call.func
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Call):
            root, node = node, node.func
        else:
            node = node.value
    return root


BORN = "JobState.QUEUED"


def _state_in(keys: list[ast.expr | None], values: list[ast.expr]) -> bool:
    """A dict literal with a "state" key to anything but ``JobState.QUEUED`` (every job is
    born queued: a new row may say so)."""
    return any(
        isinstance(key, ast.Constant) and key.value == "state" and ast.unparse(value) != BORN
        for key, value in zip(keys, values, strict=True)
    )


def state_writes(source: str) -> list[str]:
    """Where ``source`` writes a job's state or an event, one line each."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if node.attr == "state":
                found.append(f"{line}: assigns .state (an ORM write)")
        elif isinstance(node, ast.Dict) and _state_in(node.keys, node.values):
            found.append(f"{line}: a row with a state")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(r"job_events|\bset\s+state\b", node.value, re.IGNORECASE):
                found.append(f"{line}: SQL on the state or the events")
        elif isinstance(node, ast.Attribute) and ast.unparse(node) == "JobEvent.__table__":
            found.append(f"{line}: the events' table")
        elif isinstance(node, ast.Call):
            found += [f"{line}: {why}" for why in _call_writes(node)]
    return found


def _call_writes(node: ast.Call) -> list[str]:
    func = ast.unparse(node.func)
    args = [ast.unparse(a) for a in node.args]
    if func == "JobEvent":
        return ["a JobEvent made (an ORM insert)"]
    if func in ("insert", "update", "delete") and args[:1] == ["JobEvent"]:
        return [f"{func}(JobEvent)"]
    if func == "setattr" and len(args) > 1 and args[1] in ("'state'", '"state"'):
        return ["setattr of state"]
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "values"):
        return []
    root = _root_call(node)
    if ast.unparse(root.func) != "update" or not root.args or not _names_jobs(root.args[0]):
        return []
    if any(kw.arg == "state" for kw in node.keywords):
        return ["update of the jobs' state"]
    if any(kw.arg is None for kw in node.keywords):
        return ["update of the jobs with columns not seen here (**)"]
    return []


def test_only_the_transitions_module_writes_a_state_or_an_event() -> None:
    modules = sorted(p for p in STORE.glob("*.py") if p.name not in ALLOWED)
    assert len(modules) > 20  # the store's modules, not an empty folder
    writes = {p.name: state_writes(p.read_text()) for p in modules}
    assert {name: found for name, found in writes.items() if found} == {}


@pytest.mark.parametrize(
    "source",
    [
        "job.state = new",
        "job.state, job.reason = state, reason",
        "setattr(job, 'state', JobState.RUNNING)",
        "session.add(JobEvent(job_id=1, at=0.0, to_state=new))",
        "conn.execute(insert(cast(Table, JobEvent.__table__)), rows)",
        "session.execute(insert(JobEvent).values(job_id=1))",
        "conn.execute(update(_jobs).where(_jobs.c.id == 1).values(state=JobState.RUNNING))",
        "session.execute(update(Job).where(Job.id == 1).values(state=new, reason=why))",
        "conn.execute(update(_jobs).where(_jobs.c.id == job_id).values(**values))",
        "values = {'exit_code': 0, 'state': disposition.job_state}",
        "rows = [{'b_id': i, 'state': JobState.HELD} for i in ids]",
        "conn.exec_driver_sql('UPDATE jobs SET state = ? WHERE id = ?', (s, i))",
        "session.execute(text('insert into job_events (job_id) values (1)'))",
    ],
)
def test_the_reader_finds_each_way_a_state_was_written(source: str) -> None:
    assert state_writes(source)


@pytest.mark.parametrize(
    "source",
    [
        "update(_attempts).where(_attempts.c.job_id == 1).values(state=s, reason=why)",
        "session.execute(update(Attempt).values(state=state))",
        "update(_jobs).where(_jobs.c.id == 1).values(stop_request='cancel')",
        "select(JobEvent).where(JobEvent.job_id == 1).order_by(JobEvent.id)",
        "values = {'name': n, 'state': JobState.QUEUED, 'reason': ''}",
        "if job.state is JobState.QUEUED: pass",
        "transitions.move(session, 1, JobState.QUEUED, JobState.HELD, 'held', now)",
    ],
)
def test_the_reader_leaves_other_writes_and_reads_alone(source: str) -> None:
    assert state_writes(source) == []


# ---- the writer ---------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(migrated(tmp_path / "ddpq.db"))


def new(db: Database, n: int = 1) -> list[int]:
    spec = JobSpec(name="j", owner="alice", command=["true"], cwd="/", gpus=1)
    with db.write() as s:
        return [jobs.create_job(s, spec, 100.0).id for _ in range(n)]


def put(db: Database, job_id: int, state: JobState) -> None:
    """Set a job's state behind the store's back (another writer, a test's setup)."""
    with db.write() as s:
        s.execute(text("UPDATE jobs SET state = :s WHERE id = :i"), {"s": state.value, "i": job_id})


def row(db: Database, job_id: int) -> tuple[JobState, str, float | None]:
    with db.read() as s:
        job = jobs.get_job(s, job_id)
        return job.state, job.reason, job.ended_at


def history(db: Database, job_id: int) -> list[tuple[JobState | None, JobState, str, float]]:
    with db.read() as s:
        return [(e.from_state, e.to_state, e.reason, e.at) for e in jobs.events_of(s, job_id)]


SUBMITTED = (None, Q, "submitted", 100.0)


def test_every_illegal_change_is_refused_and_writes_nothing(db: Database) -> None:
    pairs = [(a, b) for a in JobState for b in JobState if a is not b]
    illegal = [(a, b) for a, b in pairs if not can_transition(a, b)]
    assert len(illegal) > 40
    ids = new(db, len(illegal))
    for job_id, (old, new_state) in zip(ids, illegal, strict=True):
        put(db, job_id, old)
        with pytest.raises(InvalidTransition), db.write() as s:
            transitions.move(s, job_id, old, new_state, "no", 101.0)
        assert row(db, job_id)[0] is old
        assert history(db, job_id) == [SUBMITTED]


def test_one_illegal_change_among_many_writes_none_of_them(db: Database) -> None:
    a, b, c = new(db, 3)
    put(db, c, S)
    changes = [Change(a, Q, ST, "leased"), Change(b, Q, H, "held"), Change(c, S, Q, "again")]
    with pytest.raises(InvalidTransition), db.write() as s:
        transitions.move_many(s, changes, 101.0)
    assert [row(db, i)[0] for i in (a, b, c)] == [Q, Q, S]
    assert [history(db, i) for i in (a, b, c)] == [[SUBMITTED]] * 3


def test_one_job_moves_with_its_event_its_columns_and_its_end(db: Database) -> None:
    (job_id,) = new(db)
    with db.write() as s:
        assert transitions.move(s, job_id, Q, ST, "leased GPU 0", 101.0, job_dir="/d")
        assert transitions.move(s, job_id, ST, R, "started", 102.0)
        assert transitions.move(s, job_id, R, F, "exit code 1", 103.0, exit_code=1)
    assert row(db, job_id) == (F, "exit code 1", 103.0)  # a terminal state ends the job
    with db.read() as s:
        job = jobs.get_job(s, job_id)
        assert (job.job_dir, job.exit_code) == ("/d", 1)
    assert history(db, job_id) == [
        SUBMITTED,
        (Q, ST, "leased GPU 0", 101.0),
        (ST, R, "started", 102.0),
        (R, F, "exit code 1", 103.0),
    ]


def test_many_jobs_move_to_several_states_in_one_call(db: Database) -> None:
    ids = new(db, 5)
    put(db, ids[4], H)
    changes = [Change(i, Q, ST, f"leased {n}", {"attempt": n}) for n, i in enumerate(ids[:2])]
    changes += [Change(ids[2], Q, H, "held by user"), Change(ids[3], Q, C, "cancelled")]
    changes.append(Change(ids[4], H, H, "waiting for job 1"))  # a new reason, no transition
    with db.write() as s:
        moved = transitions.move_many(s, changes, 101.0, started_at=101.0)
    assert moved == ids
    with db.read() as s:
        got = [jobs.get_job(s, i) for i in ids]
        assert [(j.state, j.reason) for j in got] == [(c.new, c.reason) for c in changes]
        assert [j.attempt for j in got[:2]] == [0, 1]
        assert [j.started_at for j in got] == [101.0] * 5
        assert [j.ended_at for j in got] == [None, None, None, 101.0, None]
    for c in changes:
        assert history(db, c.job_id)[1:] == [(c.old, c.new, c.reason, 101.0)]


def test_a_job_ends_when_its_end_is_given_else_at_its_terminal_event(db: Database) -> None:
    a, b, c = new(db, 3)
    with db.write() as s:
        transitions.move(s, a, Q, C, "cancelled", 101.0, ended_at=99.0)  # its processes' end
        own = [Change(b, Q, C, "cancelled", {"ended_at": 98.0})]
        transitions.move_many(s, [*own, Change(c, Q, C, "cancelled", {"ended_at": None})], 101.0)
    assert [row(db, i)[2] for i in (a, b, c)] == [99.0, 98.0, None]


def test_a_change_decided_on_a_stale_read_writes_nothing(db: Database) -> None:
    one, many, other, same = new(db, 4)
    with db.read() as s:  # what the caller saw...
        seen = {i: jobs.get_job(s, i).state for i in (one, many, other, same)}
    put(db, one, C)  # ...before another writer moved three of the jobs
    put(db, many, H)
    put(db, same, H)
    with db.write() as s:
        assert not transitions.move(s, one, seen[one], ST, "leased", 101.0)
        changes = [Change(i, seen[i], H, "held by user") for i in (many, other, same)]
        assert transitions.move_many(s, changes, 101.0) == [other]
    assert row(db, one)[:2] == (C, "")
    assert row(db, many)[:2] == (H, "")
    assert row(db, same)[:2] == (H, "")  # already where the change went: still not its event
    assert row(db, other)[:2] == (H, "held by user")
    for job_id in (one, many, same):
        assert history(db, job_id) == [SUBMITTED]
    assert history(db, other) == [SUBMITTED, (Q, H, "held by user", 101.0)]


def test_jobs_loaded_in_the_session_show_their_new_state(db: Database) -> None:
    a, b = new(db, 2)
    with db.write() as s:
        job = jobs.get_job(s, a)
        transitions.move_many(s, [Change(a, Q, C, "cancelled"), Change(b, Q, H, "held")], 101.0)
        assert (job.state, job.reason, job.ended_at) == (C, "cancelled", 101.0)
        assert job not in s.dirty  # not written again by the ORM
        assert jobs.get_job(s, b).state is H


def test_a_job_changes_once_per_call(db: Database) -> None:
    (job_id,) = new(db)
    with pytest.raises(ValueError), db.write() as s:
        transitions.move_many(s, [Change(job_id, Q, ST, "a"), Change(job_id, ST, R, "b")], 1.0)
    assert history(db, job_id) == [SUBMITTED]


def test_notes_and_submissions_are_lines_without_a_change(db: Database) -> None:
    (job_id,) = new(db)
    with db.write() as s:
        transitions.note(s, job_id, Q, "preemption asked for by root", 101.0)
    assert row(db, job_id)[0] is Q
    assert history(db, job_id) == [SUBMITTED, (Q, Q, "preemption asked for by root", 101.0)]


def test_a_move_clears_the_predicted_start_of_the_queue_it_left(db: Database) -> None:
    """A prediction is of a job waiting as the forecast last saw it: held, started or
    ended, it would be stale when shown again (a released job waits for a new one)."""
    from ddpq.store import progress

    held, started, kept = new(db, 3)
    with db.write() as s:
        progress.set_predicted(s, {held: 500.0, started: 600.0, kept: 700.0})
    with db.write() as s:
        transitions.move_many(s, [Change(held, Q, H, "held"), Change(started, Q, ST, "go")], 101.0)
        transitions.move(s, held, H, Q, "released", 102.0)
    with db.read() as s:
        shown = {i: jobs.get_job(s, i).predicted_start for i in (held, started, kept)}
    assert shown == {held: None, started: None, kept: 700.0}


def test_a_users_repeated_changes_keep_a_bounded_history(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hold, release, hold... and edit after edit: the first line and the newest
    KEPT_EVENTS stay, however often (a loop of them must not fill the disk); another job's
    history is untouched."""
    from ddpq.store import edits

    monkeypatch.setattr(transitions, "KEPT_EVENTS", 10)
    mine, theirs = new(db, 2)
    with db.write() as s:
        jobs.set_hold(s, jobs.get_job(s, theirs), True, 101.0)
    for i in range(15):
        with db.write() as s:
            jobs.set_hold(s, jobs.get_job(s, mine), i % 2 == 0, 200.0 + i)
    for i in range(5):
        with db.write() as s:
            job = jobs.get_job(s, mine)
            assert edits.update_job(s, job, {"priority": i}, f"edit {i}", 300.0 + i)
    lines = history(db, mine)
    assert len(lines) == 10 and lines[0] == SUBMITTED
    assert [line[2] for line in lines[-5:]] == [f"edit {i}" for i in range(5)]
    assert [line[3] for line in lines[1:5]] == [211.0, 212.0, 213.0, 214.0]  # the newest holds
    assert len(history(db, theirs)) == 2


def test_a_sweeps_members_held_and_released_keep_bounded_histories(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's hold and release move every waiting member in one call: each member's
    history is bounded as a job's is."""
    from ddpq.store import sweeps

    monkeypatch.setattr(transitions, "KEPT_EVENTS", 6)
    members = new(db, 3)
    with db.write() as s:
        s.execute(
            text(
                "INSERT INTO sweeps (id, name, owner, submitted_at, size, params, template)"
                " VALUES (1, 's', 'alice', 100.0, 3, '{}', '{}')"
            )
        )
        s.execute(text("UPDATE jobs SET sweep_id = 1"))
    for i in range(12):
        with db.write() as s:
            sweeps.set_sweep_hold(s, 1, i % 2 == 0, 200.0 + i)
    for job in members:
        lines = history(db, job)
        assert len(lines) == 6 and lines[0] == SUBMITTED
        assert [line[3] for line in lines[1:]] == [207.0, 208.0, 209.0, 210.0, 211.0]
