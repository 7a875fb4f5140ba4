"""One real Slurm for all the Slurm tests (a session's), and ddpq daemons pointed at it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import Daemon, free_port
from tests.slurm.cluster import CannotRunHere, SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """The test Slurm (``tests/slurm/cluster.py``); its commands find it through SLURM_CONF,
    for this process and every one it starts, until the session ends."""
    why = missing()
    if why is not None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="ddpq-slurm-"))
    try:
        cluster = SlurmCluster.start(root)
    except CannotRunHere as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(str(exc))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(root, ignore_errors=True)


def shared_folder(prefix: str) -> Path:
    """A folder other accounts can pass through (pytest's tmp_path is under a 0700 one): a
    job's owner must reach its job folder, on a cluster as on one host."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def slurm_daemons(slurm: SlurmCluster) -> Iterator[Callable[..., Daemon]]:
    """Start ``ddpq serve --executor slurm`` daemons (a 1 s grace) for a module's tests;
    each is stopped at the end, and Slurm is left with no job."""
    started: list[Daemon] = []

    def make(*args: str, prepare: Callable[[Path], object] | None = None) -> Daemon:
        """``prepare(home)`` runs before the daemon starts (``ddpq admin user add``)."""
        home = shared_folder("ddpq-slurm-home-") / "home"
        home.mkdir()
        if prepare is not None:
            prepare(home)
        d = Daemon(home, free_port(), ["--executor", "slurm", "--grace", "1s", *args])
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.stop()
    slurm.cancel_all()
    for d in started:
        shutil.rmtree(d.home.parent, ignore_errors=True)
