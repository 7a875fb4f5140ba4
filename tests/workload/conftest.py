"""Fixtures of the workload's tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.workload.runs import PREEMPT_ENV, TORCHRUN_ENV, TRAINING_ZYGOTE


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For the workload's main() run in this process: world size 1 (no torchrun), one thread,
    none of a preemptible job's settings; the test sets DDPQ_JOB_DIR. A run of one rank this
    way costs a torch process fewer than the program would (~5 s of CPU to import torch and
    the torch._dynamo an optimiser imports: bench/RESULTS.md, "The suite, fifth pass"). The
    signal handlers main() installs are put back when it returns."""
    for name in (*TORCHRUN_ENV, *PREEMPT_ENV, "DDPQ_CIFAR_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    yield
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == before


@pytest.fixture(scope="session", autouse=True)
def _training_zygote_ended() -> Iterator[None]:
    """The process plain runs are forked from (``runs.TRAINING_ZYGOTE``) ends with the
    session; runs it started were each waited for or killed by their test."""
    yield
    TRAINING_ZYGOTE.close()
