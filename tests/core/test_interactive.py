"""Interactive sessions' pure rules: the idle limit, ``{port}``, and when GPUs are idle."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core.interactive import (
    GpuUse,
    Verdict,
    Watched,
    fill_port,
    idle_limit,
    in_use,
    judge,
    sample_every,
    uses_port,
)

H = 3600.0


def test_the_idle_limit_is_the_asked_one_or_the_default_and_never_past_the_maximum() -> None:
    assert idle_limit(None, 1800.0, 4 * H) == 1800.0
    assert idle_limit(600.0, 1800.0, 4 * H) == 600.0
    assert idle_limit(4 * H, 1800.0, 4 * H) == 4 * H
    assert idle_limit(None, None, None) is None  # the admin turned reclaim off
    assert idle_limit(10 * H, None, None) == 10 * H
    for asked, default in [(5 * H, 1800.0), (None, None)]:
        with pytest.raises(ValueError, match="at most 4h00m"):
            idle_limit(asked, default, 4 * H)


@pytest.mark.parametrize(
    ("argv", "port", "filled"),
    [
        (["jupyter", "lab", "--port", "{port}"], 29601, ["jupyter", "lab", "--port", "29601"]),
        (["x", "--ServerApp.port={port}"], 29601, ["x", "--ServerApp.port=29601"]),
        (["sh", "-c", "echo {{port}} {port}"], 29601, ["sh", "-c", "echo {port} 29601"]),
        (
            ["sh", "-c", "echo ${port} {ports} {PORT}"],
            29601,
            ["sh", "-c", "echo $29601 {ports} {PORT}"],
        ),
        (["bash"], 29601, ["bash"]),
        (["x", "{port}"], None, ["x", "{port}"]),
    ],
)
def test_port_placeholders(argv: list[str], port: int | None, filled: list[str]) -> None:
    assert fill_port(argv, port) == filled


def test_uses_port_sees_only_the_placeholder_not_its_escape() -> None:
    assert uses_port(["jupyter", "--port={port}"])
    assert not uses_port(["echo", "{{port}}"])
    assert not uses_port(["bash"])


def test_sampling_is_four_looks_per_shortest_limit_within_one_to_five_seconds() -> None:
    assert sample_every([]) == 5.0
    assert sample_every([None]) == 5.0
    assert sample_every([1800.0, 8.0]) == 2.0
    assert sample_every([1.0]) == 1.0
    assert sample_every([H]) == 5.0


def test_in_use_when_one_gpu_computes_cannot_tell_or_its_memory_grew() -> None:
    idle = GpuUse(0, 1000)
    assert not in_use([idle, idle], 2000)
    assert in_use([idle, GpuUse(1, 1000)], 2000)
    assert in_use([idle, GpuUse(None, 1000)], 2000)
    assert in_use([GpuUse(0, 2500)], 2000)
    assert not in_use([GpuUse(0, 2500)], None)  # the first look: nothing to grow from
    assert not in_use([GpuUse(0, None)], 2000)  # no memory figure: only utilisation counts


SESSION = Watched(1, True, 60.0, None, None)


def test_a_first_idle_look_starts_the_clock_and_use_clears_it() -> None:
    v = judge(SESSION, [GpuUse(0, 100)], None, 1000.0, 30.0)
    assert v == Verdict(1000.0, None, 100)
    busy = judge(replace(SESSION, idle_since=1000.0), [GpuUse(7, 100)], 100, 1010.0, 30.0)
    assert busy == Verdict(None, None, 100)


# One look: seconds since the previous, and each GPU's utilisation (None: unknown) and memory.
looks = st.lists(
    st.tuples(
        st.floats(0.5, 40.0),
        st.lists(
            st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 3)),
            min_size=2,
            max_size=2,
        ),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    looks=looks,
    interactive=st.booleans(),
    limit=st.one_of(st.none(), st.floats(1.0, 120.0)),
    grace=st.floats(0.0, 60.0),
)
def test_only_a_session_idle_through_its_limit_and_the_grace_is_reclaimed(
    looks: list[tuple[float, list[tuple[int | None, int]]]],
    interactive: bool,
    limit: float | None,
    grace: float,
) -> None:
    """The worker's use of ``judge`` over any sequence of looks: a reclaim comes only for a
    session with a limit, after a warning, and after ``limit + grace`` of looks that were
    all idle (none computing, none unknown, no memory growth since the last use)."""
    job = Watched(1, interactive, limit, None, None)
    peak: int | None = None
    now = 0.0
    idle_run_start: float | None = None  # the first look of the current run of idle looks
    warned = False
    for dt, gpus in looks:
        now += dt
        uses = [GpuUse(u, m) for u, m in gpus]
        busy = in_use(uses, peak)
        v = judge(job, uses, peak, now, grace)
        if busy:
            idle_run_start = None
            assert v.idle_since is None and v.warned_at is None and not (v.warn or v.reclaim)
            assert v.resumed == warned
            warned = False
        else:
            idle_run_start = now if idle_run_start is None else idle_run_start
            assert v.idle_since == idle_run_start
        if v.warn:
            assert interactive and limit is not None and not warned
            assert now - idle_run_start >= limit  # type: ignore[operator]
            warned = True
        if v.reclaim:
            assert interactive and limit is not None and warned
            assert idle_run_start is not None and now - idle_run_start >= limit + grace
        if not interactive or limit is None:
            assert not (v.warn or v.reclaim or v.resumed)
        peak = v.peak_mb
        job = replace(job, idle_since=v.idle_since, warned_at=v.warned_at)
