"""A job's spec is written and read back by one mapping (``store.models.job``): every field
of ``core.spec.JobSpec`` survives the store, and a launch carries the spec as submitted.

The sample spec is made from the fields' types, so a field added to JobSpec (with its
column's migration) is checked here without touching this file.
"""

from __future__ import annotations

import types
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Union, cast, get_args, get_origin, get_type_hints

import pytest
from sqlalchemy import Table, update

from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import attempts, jobs, sweeps
from ddpq.store.db import Database, migrate
from ddpq.store.models import KEPT_ELSEWHERE, SPEC_COLUMNS, Job, columns_of
from tests.worker.rig import make_rig

JOBS = cast(Table, Job.__table__)


def sample(name: str, hint: Any) -> Any:
    """A value of type ``hint`` that is no field's default (nor empty, nor false)."""
    if get_origin(hint) in (Union, types.UnionType):
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    origin, args = get_origin(hint), get_args(hint)
    if hint is bool:
        return True
    if hint is int:
        return 3
    if hint is float:
        return 12.5
    if hint is str:
        return f"{name[:4]}-x"
    if origin is list:
        return [sample(name, args[0]), "b"]
    if origin is dict:
        return {name.upper(): sample(name, args[1])}
    if origin is tuple:
        return (sample(name, args[0]),)
    raise AssertionError(f"JobSpec.{name}: no sample for {hint}; add one here")


def full_spec(**given: Any) -> JobSpec:
    """Every field set to a value other than its default, but those ``given``."""
    hints = get_type_hints(JobSpec)
    spec = JobSpec(**{f.name: sample(f.name, hints[f.name]) for f in fields(JobSpec)} | given)
    for f in fields(JobSpec):
        if f.name in given:
            continue
        default = f.default_factory() if callable(f.default_factory) else f.default
        assert getattr(spec, f.name) != default, f"JobSpec.{f.name}: the sample is its default"
    return spec


@pytest.fixture
def db(tmp_path: Path) -> Database:
    migrate(tmp_path / "ddpq.db")
    return Database(tmp_path / "ddpq.db")


def ended_waits(db: Database) -> dict[str, tuple[int, ...]]:
    """A job and a one-member sweep for each dependency field, ended as its kind asks
    (succeeded; failed for afternotok), set in place: how they ran is not what this file
    checks."""
    plain = JobSpec(name="dep", owner="alice", command=["true"], cwd="/", gpus=1)
    member = sweeps.NewMember(0, "m", ["true"], {})
    out: dict[str, tuple[int, ...]] = {}
    with db.write() as s:
        for field in sorted(KEPT_ELSEWHERE):
            if field.endswith("sweeps"):
                new = sweeps.NewSweep(plain, {}, {}, None, None, [member])
                out[field] = (sweeps.create_sweep(s, new, 1.0).id,)
                where = JOBS.c.sweep_id == out[field][0]
            else:
                out[field] = (jobs.create_job(s, plain, 1.0).id,)
                where = JOBS.c.id == out[field][0]
            ended = JobState.FAILED if "notok" in field else JobState.SUCCEEDED
            s.connection().execute(update(JOBS).where(where).values(state=ended))
    return out


def no_waits() -> dict[str, tuple[int, ...]]:
    return dict.fromkeys(KEPT_ELSEWHERE, ())


def test_every_field_is_a_jobs_column_or_kept_in_a_table_of_its_own() -> None:
    names = {f.name for f in fields(JobSpec)}
    assert set(SPEC_COLUMNS) | KEPT_ELSEWHERE == names
    assert set(SPEC_COLUMNS.values()) <= set(JOBS.c.keys())


def test_every_field_round_trips_through_the_store(db: Database) -> None:
    spec = full_spec(**ended_waits(db))
    with db.write() as s:
        job_id = jobs.create_job(s, spec, 2.0).id
    with db.read() as s:
        job = jobs.get_job(s, job_id)
        assert jobs.spec_of(s, job) == spec
        assert job.state is JobState.HELD  # the sample holds it: stored as user_hold


def test_a_queued_job_is_returned_as_written_with_its_spec(db: Database) -> None:
    spec = full_spec(hold=False, singleton=False, **no_waits())
    with db.write() as s:
        written = jobs.create_job(s, spec, 2.0)
    assert written.spec() == spec  # the snapshot create_job returns, unread


def test_a_lease_carries_the_spec_as_submitted(db: Database) -> None:
    spec = full_spec(hold=False, **ended_waits(db))
    with db.write() as s:
        job_id = jobs.create_job(s, spec, 2.0).id
        placed = attempts.Placed(job_id, (0, 1), 29600, "/jobs/x", 0.1, mem_bytes=1 << 30)
        (leased,) = attempts.lease_and_start(s, [placed], 3.0)
    assert leased.spec == spec
    assert (leased.job_id, leased.attempt, leased.gpus, leased.port) == (job_id, 1, (0, 1), 29600)
    assert (leased.job_dir, leased.reserved_mem_bytes) == ("/jobs/x", 1 << 30)


def test_columns_of_copies_what_a_row_could_share(db: Database) -> None:
    spec = full_spec()
    values = columns_of(spec)
    assert values["command"] == spec.command and values["command"] is not spec.command
    assert values["env"] == spec.env and values["env"] is not spec.env
    assert values["slurm_options"] == list(spec.slurm_options)  # a JSON list in the row
    assert columns_of(replace(spec, slurm_options=()))["slurm_options"] is None


def test_the_worker_launches_the_spec_it_read_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    # What the fake GPUs can run, every other field as the full sample has it.
    runnable = dict(gpus=1, nodes=1, gpus_per_node=None, hold=False, interactive=False, cpus=1)
    shared = dict(gpu_mem_bytes=None, gpu_mem_auto=False, gpu_share=None, idle_s=None)
    hardware = dict(gpu_link=None, gpu_type="FAK")  # fake GPUs' model is "fake"
    spec = full_spec(**runnable, **shared, **hardware, **no_waits())
    with rig.api.write() as s:
        job_id = jobs.create_job(s, spec, rig.clock()).id
    rig.step()
    launch = rig.host.attempt_of(job_id).launch
    assert launch.spec == spec
    # What it was leased of the host: one core (a host has one), the memory it asked for.
    assert len(launch.cores) == 1 and launch.ram_bytes == spec.ram_bytes
    assert launch.preempt_with == spec.preempt_signal  # the sample is preemptible
