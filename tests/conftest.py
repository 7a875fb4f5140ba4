from __future__ import annotations

import compileall
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

from tests.helpers import SHARED_ZYGOTES, ZYGOTE, Daemon, free_port, remove_reachable_folders
from tests.shared_install import remove_shared_install
from tests.template_db import remove_template

# Under pytest-xdist (`make test`: `-n auto`) the tests of one group run one after another on
# one worker, because they share one thing:
# - fixed --port-range blocks in 29600-29999 and blocks that free_block picks there, which the
#   others test-bind or lease (every other test daemon leases from its own worker's range:
#   tests/helpers.port_range_flags);
# - the test Slurm, started once by each worker that runs one of its tests (tests/slurm/cluster.py).
GROUPS = {
    "rendezvous-port-blocks": (
        "tests/worker/test_busy_ports.py",
        "tests/test_leases.py",
        "tests/test_resources.py",
        "tests/test_soak.py",
    ),
    "test-slurm": (
        "tests/slurm/test_executor_on_slurm.py",
        "tests/slurm/test_script.py",
        "tests/slurm/test_slurm_settings.py",
        "tests/slurm/test_through_ddpq.py",
    ),
}
# Sent to the workers first (the ResNet18 runs, which train two or three times each, and the
# groups), so that no worker is left at the end alone on a three-minute test.
LONG_FIRST = (
    "tests/test_workload_ddpq.py",
    "tests/workload/",
    *(path for paths in GROUPS.values() for path in paths),
)


def group_of(nodeid: str) -> str | None:
    return next((name for name, paths in GROUPS.items() if nodeid.startswith(paths)), None)


ROOT = Path(__file__).resolve().parents[1]
# Test modules are rewritten by pytest and cached under their own name: not compiled here.
NOT_COMPILED = re.compile(r"(^|/)(test_[^/]*|conftest)\.py$")


def pytest_configure(config: pytest.Config) -> None:
    """Keep bytecode as an installed package does, even where PYTHONDONTWRITEBYTECODE is set
    (some shells and CI images): else every xdist worker rewrites and compiles all the test
    modules again (a third of its 20 s of CPU to collect) and every ddpq process the suite
    starts (daemons, CLI calls, workers) compiles ddpq again (~0.25 s of CPU each, hundreds
    of times). The controller compiles before any worker starts; those processes only read
    the bytecode."""
    sys.dont_write_bytecode = False  # before the test modules are collected
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller has compiled them
    for folder in (ROOT / "src" / "ddpq", ROOT / "tests"):
        compileall.compile_dir(folder, quiet=1, rx=NOT_COMPILED)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """Load scheduling with GROUPS kept together. Not xdist's `--dist loadgroup`: with pytest 9
    its marks never reach the test's name it groups by (it sets `item._nodeid`, which pytest 9
    no longer reads), so the tests it was to keep apart ran on every worker at once."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid  # a test of no group is a unit of its own


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> GroupScheduling:
    return GroupScheduling(config, log)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker more than the cores. Many tests wait on the clock (a port's
    cool-down, a grace period, a job's sleep) with a core idle; a third worker on two cores
    fills those waits: 9 min 14 s – 10 min 05 s against 10 min 14 s for two; four cost
    more CPU for no gain (bench/RESULTS.md, "The suite with forked daemons")."""
    return (len(os.sched_getaffinity(0)) or 1) + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first, the rest in their order (a stable sort: every worker collects the
    same order, as xdist requires)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.fixture(scope="session", autouse=True)
def _shared_install_removed() -> Iterator[None]:
    """The install other accounts reach (``tests/shared_install.py``) and the migrated
    database template (``tests/template_db.py``) are made on first use; removed when the
    session ends, with the folders tests made for other accounts to reach and the process
    daemons are forked from (``tests/zygote.py``)."""
    yield
    ZYGOTE.close()
    for zygote in SHARED_ZYGOTES.values():
        zygote.close()
    remove_shared_install()
    remove_template()
    remove_reachable_folders()


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons on this test's folder; every one is stopped (jobs too) at the end."""
    started: list[Daemon] = []

    def make(*args: str, home: Path | None = None, **env: str) -> Daemon:
        d = Daemon(home or tmp_path / "home", free_port(), list(args), dict(env))
        d.home.mkdir(parents=True, exist_ok=True)
        started.append(d)
        return d.start()

    yield make
    _stop_and_clean_up(started, tmp_path)


@pytest.fixture(scope="module")
def module_daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Daemon]]:
    """Start daemons that live as long as the module's tests (as ``make_daemon`` starts
    them, on a ``home`` of the caller's, e.g. one its users were added to, or one of their
    own), for tests that share one (see ``shared_daemon``): a daemon start is ~3 s of
    CPU; all are stopped, their jobs too, when the module ends."""
    root = tmp_path_factory.mktemp("module-daemons")
    started: list[Daemon] = []

    def make(*args: str, home: Path | None = None, **env: str) -> Daemon:
        d = Daemon(home or root / f"home{len(started)}", free_port(), list(args), dict(env))
        d.home.mkdir(parents=True, exist_ok=home is not None)
        started.append(d)
        return d.start()

    try:
        yield make
    finally:
        _stop_and_clean_up(started, root)


@pytest.fixture(scope="module")
def shared_daemon(module_daemons: Callable[..., Daemon]) -> Daemon:
    """One daemon as ``daemon`` starts it (4 fake GPUs, a 1 s grace), shared by a module's
    tests that only submit and read and never expect an empty queue: usage errors refused
    before anything is queued (an unchanged count of jobs), jobs looked at by their own
    ids. A test that stops the daemon, changes its settings or counts the queue's jobs
    takes ``daemon``."""
    return module_daemons("--fake-gpus", "4", "--grace", "1s")


def _stop_and_clean_up(started: list[Daemon], root: Path) -> None:
    deaf: list[str] = []
    for d in started:
        try:
            d.stop()
        except subprocess.TimeoutExpired:  # a daemon that does not hear SIGTERM: a failure,
            deaf.append(str(d.home))  # after its whole session is killed and cleaned up
            d.kill_session()
    # A test must not leave jobs running: stop them through a last daemon if any remain.
    _kill_leftover_shims(root)
    for d in started:
        _kill_recorded_shims(d.home)
    from tests.launches import remove_job_cgroups  # the executor's import, only here

    for d in started:
        remove_job_cgroups(d.home)
    assert not deaf, f"daemons that SIGTERM did not stop (killed): {deaf}"


def _kill_recorded_shims(home: Path) -> None:
    """Kill the shims the daemon's attempts record (those the fork server started have the
    server's command line and environment, so only their handles name them)."""
    import contextlib
    import os
    import signal
    import sqlite3

    from ddpq.executors.local import procs

    try:
        with contextlib.closing(sqlite3.connect(home / "ddpq.db")) as db:
            handles = [h for (h,) in db.execute("SELECT handle FROM attempts WHERE handle")]
    except sqlite3.Error:
        return
    for handle in handles:
        pid, _, ticks = str(handle).partition(":")
        if (
            pid.isdigit()
            and ticks.isdigit()
            and procs.is_alive(procs.Identity(int(pid), int(ticks)))
        ):
            with contextlib.suppress(OSError):
                os.killpg(int(pid), signal.SIGKILL)


def _kill_leftover_shims(root: Path) -> None:
    """Kill every process a test's jobs left: their shims and anything in their environment.

    Daemons stop without --stop-jobs in most tests, so running jobs outlive them.
    """
    import contextlib
    import os
    import signal

    needle = str(root).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        is_shim = b"shim.py" in cmdline and needle in cmdline
        in_job = any(e.startswith(b"DDPQ_JOB_DIR=" + needle) for e in environ.split(b"\x00"))
        if is_shim or in_job:
            with contextlib.suppress(OSError):
                os.kill(int(name), signal.SIGKILL)


@pytest.fixture
def daemon(make_daemon: Callable[..., Daemon]) -> Daemon:
    """A daemon with 4 fake GPUs and a 1 s grace period."""
    return make_daemon("--fake-gpus", "4", "--grace", "1s")
