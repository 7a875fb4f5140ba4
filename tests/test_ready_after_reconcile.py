"""A daemon's API answers only once its worker has adopted or finalised the jobs of the
last run: a restarted daemon never shows "running" for a job that ended while it was
down (tests/test_supervision.py's kill -9 test met that, about one run in ten, once the
test daemons started quickly)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.daemon import run
from ddpq.daemon.watchdog import Shutdown
from ddpq.worker.loop import Worker
from tests.template_db import migrated


@pytest.mark.parametrize("fails", [False, True], ids=["reconciled", "reconcile failed"])
def test_the_worker_half_is_ready_only_after_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    # The worker's reconcile, entered and then held until the test lets it go; one that
    # fails is logged and the daemon serves on, as before.
    entered, go_on = threading.Event(), threading.Event()
    real = Worker.reconcile

    def held(self: Worker) -> None:
        entered.set()
        assert go_on.wait(60), "the test never let reconcile go on"
        if fails:
            raise RuntimeError("broken for the test")
        real(self)

    monkeypatch.setattr(Worker, "reconcile", held)
    settings = Settings(home=tmp_path, fake_gpus=2, grace_s=0.5)
    migrated(settings.db_path)
    made: list[run._WorkerHalf] = []
    maker = threading.Thread(target=lambda: made.append(run._WorkerHalf(settings, Shutdown())))
    maker.start()
    try:
        assert entered.wait(30), "reconcile never started"
        maker.join(1.0)  # bounded: while reconcile is held, the half must not be ready
        assert maker.is_alive() and not made
    finally:
        go_on.set()
        maker.join(30)
    assert not maker.is_alive() and made
    made[0].stop(settings)
