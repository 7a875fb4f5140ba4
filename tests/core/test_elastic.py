"""Elastic jobs' decisions (``core.scheduler.elastic``) on plain data: the size a job
starts at, when a running one grows, and when one shrinks rather than being preempted."""

from __future__ import annotations

import random
from dataclasses import replace

from ddpq.core.limits import Limit, Limits
from ddpq.core.policy import Order, Policy
from ddpq.core.preempt import Guards, Preemption, Running, Waiting
from ddpq.core.scheduler import QueuedJob, RunningJob, World, decide
from ddpq.core.scheduler.elastic import (
    Resizable,
    Shrink,
    anyone_may_give,
    grow,
    note,
    shrink_or_preempt,
)

NOW = 10_000.0
LAS = Order(Policy.LAS, {})
GUARDS = Guards(min_run_s=60.0, max_preemptions=3)
HOUR = 3600.0


def q(
    job_id: int,
    gpus: int,
    most: int | None = None,
    *,
    time_limit_s: float | None = None,
    resize_to: int | None = None,
    attained_s: float = 0.0,
) -> QueuedJob:
    return QueuedJob(
        job_id,
        "ann",
        gpus,
        0,
        NOW - 100 + job_id,
        time_limit_s,
        attained_s=attained_s,
        gpus_max=most,
        resize_to=resize_to,
    )


def world(gpus: int = 4, running: tuple[RunningJob, ...] = ()) -> World:
    return World(list(range(gpus)), running, list(range(29500, 29510)), NOW)


def sizes(queued: list[QueuedJob], w: World) -> dict[int, int]:
    return {p.job_id: len(p.gpus) for p in decide(queued, w, LAS).placements}


# ---- start: what is free, at least its least, none a job ahead waits for -------------


def test_an_elastic_job_starts_on_what_is_free_up_to_its_most() -> None:
    blocker = RunningJob(9, (0, 1), NOW - 10, None, "bob")
    assert sizes([q(1, 2, 4)], world(running=(blocker,))) == {1: 2}
    assert sizes([q(1, 2, 4)], world()) == {1: 4}
    assert sizes([q(1, 2, 3)], world()) == {1: 3}  # never above its most


def test_an_elastic_job_waits_for_its_least() -> None:
    blocker = RunningJob(9, (0, 1, 2), NOW - 10, None, "bob")
    plan = decide([q(1, 2, 4)], world(running=(blocker,)), LAS)
    assert plan.placements == [] and plan.stopped_by[1] == "backfill"


def test_an_elastic_job_takes_no_gpu_a_job_ahead_waits_for() -> None:
    # Job 1 (ahead) waits for 3 GPUs, 2 are free. Under fairshare (EASY backfill) job 2
    # may start only at its least, and only if that cannot delay job 1: with no time
    # limit it may not; with one that ends before job 1 could start, it may.
    blocker = RunningJob(9, (0, 1), NOW - 10, 100.0, "bob")
    ahead, w = q(1, 3), world(running=(blocker,))
    fair = Order(Policy.FAIRSHARE, {})
    assert decide([ahead, q(2, 1, 4)], w, fair).placements == []
    short = q(2, 1, 4, time_limit_s=50.0)
    assert [len(p.gpus) for p in decide([ahead, short], w, fair).placements] == [1]
    # Under las (greedy backfill: preemption makes room) it starts, but at its least: the
    # other free GPU stays for job 1.
    assert sizes([ahead, q(2, 1, 4)], w) == {2: 1}


def test_a_job_being_resized_goes_first_at_the_size_asked() -> None:
    later = QueuedJob(1, "bob", 2, 0, NOW - 500)  # submitted long before: LAS ranks it first
    resizing = q(5, 2, 4, resize_to=2, attained_s=HOUR / 2)
    assert sizes([later, resizing], world()) == {5: 2, 1: 2}
    growing = q(5, 2, 4, resize_to=4)
    assert sizes([later, growing], world()) == {5: 4}


# ---- grow: when GPUs are free and the guards allow --------------------------------------


def r(
    job_id: int,
    held: int,
    *,
    started_at: float = NOW - HOUR,
    preemptions: int = 0,
    resize_to: int | None = None,
) -> Resizable:
    return Resizable(job_id, held, 2, 4, started_at, preemptions, resize_to, "ann")


def grown(
    jobs: list[Resizable], free: int, waits: bool = False, room: dict[str, int] | None = None
) -> dict[int, int]:
    return grow(jobs, free, waits, NOW, GUARDS, room)


def test_a_running_elastic_job_grows_onto_free_gpus() -> None:
    assert grown([r(1, 2)], 2) == {1: 4}
    assert grown([r(1, 2)], 1) == {1: 3}
    assert grown([r(1, 2), r(2, 2)], 3) == {1: 4, 2: 3}
    assert grown([r(1, 4)], 2) == {}  # at its most
    assert grown([r(1, 2)], 0) == {}


def test_no_grow_before_its_minimum_run_nor_past_its_resizes() -> None:
    assert grown([r(1, 2, started_at=NOW - 30)], 2) == {}
    assert grown([r(1, 2, preemptions=3)], 2) == {}
    assert grown([r(1, 2, resize_to=3)], 2) == {}  # under way


def test_no_grow_while_a_queued_job_waits_for_gpus() -> None:
    # The free GPUs are kept for the waiting job (which preemption may make room for).
    assert grown([r(1, 2)], 2, waits=True) == {}


# ---- shrink instead of whole preemption -------------------------------------------------


def running(job_id: int, gpus: int, started_at: float = NOW - HOUR) -> Running:
    return Running(job_id, "ann", 0, NOW - 2 * HOUR, 20 * HOUR, gpus, started_at, True, 0)


def waiting(job_id: int, gpus: int) -> Waiting:
    return Waiting(job_id, "bob", 0, NOW - 5, 0.0, gpus)


def test_an_elastic_job_shrinks_rather_than_being_preempted_whole() -> None:
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 2)], [running(5, 4)], {5: 2}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [Shrink(5, 2, 7)] and whole == []
    # One GPU free already: it gives only the one more the waiting job lacks.
    shrinks, _ = shrink_or_preempt(
        [waiting(7, 2)], [running(5, 4)], {5: 2}, free=1, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [Shrink(5, 3, 7)]


def test_gpus_above_its_least_come_back_to_any_waiting_job_whatever_its_rank() -> None:
    # The elastic job ranks as well as the waiting one (no service to speak of): the
    # preemption rule would not pick it, but what it holds above its least was lent.
    young = Running(5, "ann", 0, NOW - 2 * HOUR, 60.0, 4, NOW - HOUR, True, 0)
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 2)], [young], {5: 2}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [Shrink(5, 2, 7)] and whole == []
    # Its least is its own: a job wanting more than it lent waits (nothing outranked).
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 3)], [young], {5: 2}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [] and whole == []


def test_a_policy_that_preempts_nobody_still_takes_back_what_was_lent() -> None:
    args = ([running(5, 4)], {5: 2})
    lent, whole = shrink_or_preempt([waiting(7, 2)], *args, 0, LAS, NOW, GUARDS, preempt=False)
    assert lent == [Shrink(5, 2, 7)] and whole == []
    lent, whole = shrink_or_preempt([waiting(7, 3)], *args, 0, LAS, NOW, GUARDS, preempt=False)
    assert lent == [] and whole == []  # preempting it whole is no choice here


def test_an_elastic_job_that_cannot_keep_its_least_is_preempted_whole() -> None:
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 3)], [running(5, 4)], {5: 2}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [] and whole == [Preemption(5, 7)]


def test_a_fixed_size_job_is_preempted_as_before() -> None:
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 2)], [running(5, 4)], {}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [] and whole == [Preemption(5, 7)]


def test_no_shrink_before_its_minimum_run() -> None:
    young = running(5, 4, started_at=NOW - 30)
    shrinks, whole = shrink_or_preempt(
        [waiting(7, 2)], [young], {5: 2}, free=0, order=LAS, now=NOW, guards=GUARDS
    )
    assert shrinks == [] and whole == []


def test_when_nobody_may_give_the_rule_finds_nothing_for_any_waiting_job() -> None:
    # The worker skips the rule (and reading each job's service) when anyone_may_give
    # says no: over random queues and running sets, the rule must agree it had nothing.
    rng = random.Random(7)
    said_no = said_yes = 0
    for _ in range(3000):
        running_jobs = [
            Running(
                i,
                rng.choice(["ann", "bob"]),
                rng.choice([0, 0, 1]),
                NOW - rng.uniform(0, 2 * HOUR),
                rng.uniform(0, 20 * HOUR),
                rng.randint(1, 4),
                NOW - rng.choice([5.0, 30.0, 90.0, HOUR]),  # before or after min_run_s
                rng.random() < 0.5,
                rng.randint(0, 4),  # at or past max_preemptions, or not
            )
            for i in range(rng.randint(0, 4))
        ]
        least = {r.id: rng.randint(1, r.gpus) for r in running_jobs if rng.random() < 0.4}
        queue = [
            Waiting(10 + i, rng.choice(["ann", "bob"]), rng.choice([0, 1]), NOW - i, 0.0, g)
            for i, g in enumerate(rng.choices([1, 2, 3, 4], k=rng.randint(1, 4)))
        ]
        preempt = rng.random() < 0.7
        free = rng.randint(0, 2)
        found = shrink_or_preempt(queue, running_jobs, least, free, LAS, NOW, GUARDS, preempt)
        if anyone_may_give(running_jobs, least, NOW, GUARDS, preempt):
            said_yes += 1
        else:
            said_no += 1
            assert found == ([], []), (running_jobs, least, queue, preempt, free)
    assert said_no > 500 and said_yes > 500  # both sides were tried


def test_the_waiting_reason_names_an_elastic_job_that_gives_gpus_up() -> None:
    assert note([r(5, 4, resize_to=2)]) == "elastic job 5 is shrinking to 2 GPUs"
    assert note([r(5, 3)]) == "elastic job 5 holds 1 GPU above its least"
    assert note([r(5, 2)]) is None


def test_an_elastic_job_stays_within_its_owners_gpu_limit() -> None:
    limited = replace(world(), limits=Limits({"ann": Limit(gpus=3)}))
    assert sizes([q(1, 2, 4)], limited) == {1: 3}
    # Growing, too: ann may take one more, whatever is free.
    assert grown([r(1, 2)], 2, room={"ann": 1}) == {1: 3}
    assert grown([r(1, 2)], 2, room={"ann": 0, "bob": 4}) == {}
