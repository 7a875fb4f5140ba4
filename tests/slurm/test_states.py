"""Reading Slurm's answers (squeue, sacct, sinfo) and turning its states into exit records."""

from __future__ import annotations

import time

import pytest

from ddpq.core.rules import describe_exit
from ddpq.executors.slurm import states
from ddpq.executors.slurm.states import SlurmJob


def test_squeue_lines_by_job_id() -> None:
    text = (
        "12|RUNNING|None|2026-12-01T20:42:15|2026-12-01T21:42:15|n[1-2]\n"
        "13|PENDING|Resources|N/A|N/A|\n"
        "14|CANCELLED by 0|None|2026-12-01T20:42:15|2026-12-01T20:43:00|n1\n"
        "15_3|RUNNING|None|N/A|N/A|n1\n"  # an array task: never ddpq's
        "garbage\n"
    )
    jobs = states.parse_queue(text)
    assert sorted(jobs) == ["12", "13", "14"]
    assert jobs["12"].state == "RUNNING" and jobs["12"].nodes == "n[1-2]" and not jobs["12"].final
    assert jobs["12"].reason == "" and jobs["12"].started_at is not None
    assert jobs["13"].waiting and jobs["13"].reason == "Resources" and jobs["13"].started_at is None
    assert jobs["14"].state == "CANCELLED" and jobs["14"].final


def test_slurm_times_are_local_times() -> None:
    at = states.parse_time("2026-12-01T20:42:15")
    assert at is not None
    assert time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) == "2026-12-01T20:42:15"
    for none in ("N/A", "NONE", "Unknown", "", "yesterday"):
        assert states.parse_time(none) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0:0", (0, None)),
        ("3:0", (3, None)),
        ("0:15", (None, 15)),
        ("0:9", (None, 9)),
        ("", (None, None)),
    ],
)
def test_exit_code_is_code_colon_signal(text: str, expected: tuple[int | None, int | None]) -> None:
    assert states.parse_exit_code(text) == expected


def test_sacct_lines_carry_the_exit_code() -> None:
    text = (
        "20|FAILED|2:0|2026-12-01T20:42:15|2026-12-01T20:42:16|NonZeroExitCode\n"
        "21|CANCELLED by 1000|0:15|2026-12-01T20:42:15|2026-12-01T20:42:30|None\n"
        "21.batch|CANCELLED|0:15|||\n"
    )
    jobs = states.parse_accounting(text)
    assert sorted(jobs) == ["20", "21"]
    assert (jobs["20"].exit_code, jobs["20"].signal, jobs["20"].reason) == (
        2,
        None,
        "NonZeroExitCode",
    )
    assert (jobs["21"].state, jobs["21"].exit_code, jobs["21"].signal) == ("CANCELLED", None, 15)


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:4", 4),
        ("gpu:a100:2(S:0-1)", 2),
        ("gpu:a100:2,gpu:v100:2,shard:8", 4),
        ("gpu:h100:8(S:0,1)", 8),
        ("(null)", 0),
        ("shard:8", 0),
    ],
)
def test_gpus_of_a_node_from_its_gres(gres: str, count: int) -> None:
    assert states.gpu_count(gres) == count


def test_gpus_of_a_partition_count_each_node_once() -> None:
    text = "n1|gpu*|gpu:4\nn2|gpu*|gpu:4\nn2|all|gpu:4\nn3|cpu|(null)\nn4|big|gpu:a100:8\n"
    assert states.partition_gpus(text, None) == 8  # the default partition (marked *)
    assert states.partition_gpus(text, "gpu") == 8
    assert states.partition_gpus(text, "big") == 8
    assert states.partition_gpus(text, "all") == 4
    assert states.partition_gpus(text, "cpu") == 0
    assert states.partition_gpus(text, "nope") == 0


def test_a_job_slurm_no_longer_knows_is_lost() -> None:
    record = states.record_from_slurm("77", None, 100.0)
    assert record.error is not None and record.error.startswith("lost: ")
    assert "77" in record.error and "squeue" in record.error


def test_slurm_states_as_exit_records() -> None:
    ended = SlurmJob("5", "NODE_FAIL", "", 10.0, 20.0)
    record = states.record_from_slurm("5", ended, 99.0)
    assert record.error == "lost: a node of Slurm job 5 failed"
    assert (record.started_at, record.ended_at) == (10.0, 20.0)
    killed = SlurmJob("6", "CANCELLED", "", None, None, signal=15)
    record = states.record_from_slurm("6", killed, 99.0)
    assert record.signal == 15 and record.error == "Slurm job 6 was cancelled"
    assert (record.started_at, record.ended_at) == (99.0, 99.0)
    odd = SlurmJob("7", "SPECIAL_EXIT", "JobHeldAdmin")
    assert describe_exit(states.record_from_slurm("7", odd, 1.0)) == (
        "Slurm job 7 ended as SPECIAL_EXIT (JobHeldAdmin)"
    )
    done = states.record_from_slurm("8", SlurmJob("8", "COMPLETED", ""), 1.0)
    assert done.error is not None and done.error.startswith("lost: ")


def test_only_a_real_reason_to_wait_is_shown() -> None:
    assert states.waiting_reason(SlurmJob("1", "PENDING", "Resources")) == (
        "waiting in Slurm: Resources"
    )
    assert states.waiting_reason(SlurmJob("1", "PENDING", states.HELD)) is None  # ddpq's hold
    assert states.waiting_reason(SlurmJob("1", "PENDING", "")) is None
    assert states.waiting_reason(SlurmJob("1", "RUNNING", "")) is None
