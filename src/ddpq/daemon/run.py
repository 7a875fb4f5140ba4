"""Wiring for ``ddpq serve`` (the API, its worker in a child process: ``halves``), ``ddpq
server`` and ``ddpq worker``."""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, NoReturn

from ddpq import enforcement
from ddpq.config import ConfigError, Settings
from ddpq.core.names import SYSTEM_SOCKET
from ddpq.daemon.halves import ApiParent, WorkerProcess, fork_worker, leave
from ddpq.daemon.heap import freeze_startup_objects
from ddpq.daemon.job_ids import keep_job_ids_unique
from ddpq.daemon.lock_turns import take_short_turns
from ddpq.daemon.reach import require_jobs_can_run_the_shim
from ddpq.daemon.state_folder import agree_on_trust, make_private, worker_lock
from ddpq.daemon.unix_socket import UnixListener, closed_to_others, listen_unix
from ddpq.daemon.watchdog import Shutdown, WorkerDied, raise_open_files_limit, watched
from ddpq.server import identity
from ddpq.store.db import migrate

if TYPE_CHECKING:
    from ddpq.daemon.janitor import Janitor
    from ddpq.daemon.notifier import Notifier
    from ddpq.daemon.quota import DiskWatch
    from ddpq.worker.loop import Worker

log = logging.getLogger("ddpq")


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


def listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this. Without it a response written in two parts
    # (headers, body) waits on the client's delayed ACK: 40 ms on every keep-alive request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def _start_worker(settings: Settings) -> Worker:
    """The worker that ``run`` starts in a thread: its one construction, so that a change
    of the worker's interface touches only this function."""
    from ddpq.executors.choose import for_worker
    from ddpq.worker.devices import DevicesUnavailable
    from ddpq.worker.loop import Worker

    executor, devices, worker_settings = for_worker(settings)  # ConfigError: Slurm's refusal
    try:
        return Worker(worker_settings, executor=executor, devices=devices)
    except DevicesUnavailable as exc:
        raise ConfigError(str(exc)) from None


def _say_what_limits_jobs(settings: Settings, executor: object) -> None:
    """Log what enforces jobs' cores, memory and processes (a warning for each kind that
    nothing does), and leave it for the API (``ddpq gpus``, the page)."""
    from ddpq.core.enforcement import phrase
    from ddpq.executors.base import Enforcing

    controls = executor.controls() if isinstance(executor, Enforcing) else None
    for control in controls or []:
        level = logging.INFO if control.enforced else logging.WARNING
        log.log(level, "worker: %s", phrase(control))
    try:
        enforcement.publish(settings.home, controls)
    except OSError as exc:
        log.warning("cannot record what limits jobs (for ddpq gpus): %s", exc)


def _start_notifier(settings: Settings, shutdown: Shutdown) -> Notifier:
    from ddpq.daemon.notifier import Notifier

    notifier = Notifier(settings)
    # Watched as the worker is: a notifier dead alone would leave every message unsent.
    target = watched("notifier", notifier.run, shutdown)
    threading.Thread(target=target, name="ddpq-notifier", daemon=True).start()
    return notifier


def _start_janitor(
    settings: Settings, shutdown: Shutdown
) -> tuple[Janitor, threading.Thread] | None:
    """Retention in a thread of its own beside the worker (not in its pass: removing a
    year of checkpoints must not delay a job's start), when a limit is set."""
    from ddpq.daemon.janitor import Janitor, policy_of

    policy = policy_of(settings)
    if not policy.active:
        return None
    janitor = Janitor(settings)
    target = watched("janitor", janitor.run, shutdown)  # dead alone, no folder is ever freed
    thread = threading.Thread(target=target, name="ddpq-janitor", daemon=True)
    thread.start()
    limits = []
    if policy.keep_finished_s is not None:
        from ddpq.daemon.janitor import written_duration

        rows = " and their rows" if policy.prune_rows else ""
        kept = written_duration(policy.keep_finished_s)
        limits.append(f"finished jobs' folders{rows} kept {kept} after they end")
    if policy.budget_bytes is not None:
        from ddpq.daemon.janitor import approx_size

        limits.append(f"job folders kept under {approx_size(policy.budget_bytes)}")
    log.info("retention: %s", "; ".join(limits))
    return janitor, thread


def _start_disk_watch(settings: Settings, shutdown: Shutdown) -> DiskWatch:
    """The database's reserve and the per-job folder limit, in a thread of their own
    (watched: dead alone, no folder limit would hold and no reserve come back)."""
    from ddpq.daemon.quota import DiskWatch, shared_disk

    warning = shared_disk(settings)
    if warning is not None:
        log.warning("%s", warning)
    watch = DiskWatch(settings)
    target = watched("disk watch", watch.run, shutdown)
    threading.Thread(target=target, name="ddpq-disk", daemon=True).start()
    return watch


def _say_who_is_trusted(settings: Settings) -> None:
    """The trust mode, before the API listens: whom the API believes, and why."""
    if not settings.auth:
        log.warning(
            "no --auth: a mode for a single-user machine. Over TCP the API believes whatever "
            "user name a client sends and every caller is an admin; every job runs as this "
            "daemon's account (%s). On a shared machine use --auth: local users then need "
            "no token (the Unix socket knows who they are)",
            getpass.getuser(),
        )
        return
    group = settings.admin_group
    if group is None:
        log.info("admins: root, and users made with `ddpq admin user add --admin`")
    elif not identity.group_exists(group):
        log.info(
            "admins: root and users made with --admin (the admin group %r does not exist: "
            "`groupadd %s` and add members to have more, or set admin_group)",
            group,
            group,
        )
    else:
        log.info("admins: root, members of the Unix group %r, users made with --admin", group)


def _say_where_the_socket_is(settings: Settings, listener: UnixListener | None) -> None:
    path = settings.socket_file
    if listener is None or path is None:
        return
    shut = closed_to_others(path)
    if shut:
        log.warning(
            "%s is not open to other accounts (no search permission on %s): only this "
            "account can use the socket; choose another with --socket (e.g. %s)",
            path,
            shut[0],
            SYSTEM_SOCKET,
        )
    how = "each caller is their Unix account, no token" if settings.auth else "no-auth"
    log.info("API on the Unix socket %s (%s)", path, how)


def run(settings: Settings, *, api: bool = True, worker: bool = True) -> None:
    """Run the daemon until a signal stops it; ``WorkerDied`` if its worker died.

    ``ddpq serve`` (both) runs its worker in a child process (``daemon.halves``)."""
    settings.validate(runs_jobs=worker, listens=api)
    require_jobs_can_run_the_shim(settings, runs_jobs=worker)
    # A signal mask outlives exec: a daemon started by a parent that blocked SIGTERM would
    # never hear a stop, nor would its worker's fork server reap (SIGCHLD). Before any
    # thread or child exists, so all start with nothing blocked (the shims reset theirs too).
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    setup_logging()
    # Everything the daemon creates is its own alone (the database holds token hashes
    # and every job's environment); jobs get an ordinary umask of their own.
    os.umask(0o077)
    make_private(settings)
    trust = agree_on_trust(settings)
    if worker and settings.auth and settings.shared_account:
        log.warning(
            "--shared-account: every job runs as this daemon's account (%s), so any job can "
            "read the database (token hashes, every job's --env), other jobs' folders and "
            "logs, and signal other jobs. Tokens only keep honest users apart.",
            getpass.getuser(),
        )
    migrate(settings.db_path)
    if worker:  # the worker's account can list the job folders; before any submission
        keep_job_ids_unique(settings)
    sock = listen_socket(settings.host, settings.port) if api else None
    unix = listen_unix(settings.socket_file) if api and settings.socket_file else None
    # Held by both halves of `serve` (the child inherits it): the lock is free once both end.
    lock = worker_lock(settings.home) if worker else None
    child: WorkerProcess | None = None
    if api and worker:
        _import_both_halves()  # once, here, not once in each half after the fork
        freeze_startup_objects()  # and the child's copy of them left unwritten by the GC
        forked = fork_worker()
        if isinstance(forked, ApiParent):
            for listening in (sock, unix.sock if unix is not None else None):
                if listening is not None:
                    listening.close()  # the parent's to serve (and the socket file its to remove)
            _run_worker_child(settings, forked)
        child = forked
    try:
        _run_halves(settings, sock, unix, child, worker=child is None and worker)
    finally:
        if lock is not None:
            lock.close()
        trust.close()


def _import_both_halves() -> None:
    """What the API and the worker import to start, imported before the fork."""
    import uvicorn  # noqa: F401

    import ddpq.daemon.janitor
    import ddpq.daemon.notifier
    import ddpq.daemon.quota
    import ddpq.executors.local
    import ddpq.server.app
    import ddpq.server.protocol
    import ddpq.worker.loop  # noqa: F401


def _run_worker_child(settings: Settings, parent: ApiParent) -> NoReturn:
    """The worker's process under ``serve``: start, say so to the parent, run until a
    SIGTERM (the parent's, or a service manager's) or the parent's end. Never returns:
    what is up the stack is the parent's."""
    from ddpq.executors.local import cgroups

    shutdown = Shutdown()
    signal.signal(signal.SIGTERM, lambda *_: shutdown.event.set())  # SIGINT: ignored
    cgroups.companion(parent.pid)  # in the daemon's cgroup too: moved along (cgroup v2)
    try:
        try:
            half = _WorkerHalf(settings, shutdown)
        except ConfigError as exc:
            parent.refuse(str(exc))
        try:
            parent.ready()
            parent.watch(shutdown)
            freeze_startup_objects()
            take_short_turns()
            while not shutdown.event.wait(3600):
                pass
        finally:
            shutdown.stopping = True
            half.stop(settings)
    except BaseException as exc:  # whatever it is, this process ends here
        why = f"the worker process failed ({type(exc).__name__}: {exc})"
        log.critical("%s; stopping the daemon (exit status 1)", why, exc_info=True)
        parent.died(why)
        leave(1)
    if shutdown.died is not None:
        parent.died(shutdown.died)
    leave(0 if shutdown.died is None else 1)


def _run_halves(
    settings: Settings,
    sock: socket.socket | None,
    unix: UnixListener | None,
    child: WorkerProcess | None,
    *,
    worker: bool,
) -> None:
    """The API (if ``sock``), with the worker in this process (``worker``) or in ``child``."""
    shutdown = Shutdown()
    # First: a setting the worker refuses (no sbatch here, say) stays a failed start's only line.
    half = _WorkerHalf(settings, shutdown) if worker else None
    if child is not None:
        child.wait_ready()
        child.watch(shutdown)
    # The API's socket per connection (said once: by the worker's half where it has one).
    open_files = half.open_files if half else raise_open_files_limit(say=child is None)
    if sock is not None:  # after the worker: a setting it refuses stays a failed start's only line
        _say_who_is_trusted(settings)
        _say_where_the_socket_is(settings, unix)
    try:
        _serve(settings, sock, unix, shutdown, open_files)
    finally:
        shutdown.stopping = True
        if unix is not None:
            unix.close()
        if half is not None:
            half.stop(settings)
        if child is not None:
            ended = child.stop()
            if ended is not None and shutdown.died is None:
                shutdown.died = f"the worker process (pid {child.pid}) {ended} while stopping"
    if shutdown.died is not None:
        raise WorkerDied(f"{shutdown.died}; see the log above")


class _WorkerHalf:
    """The worker's thread and those beside it (notifications, retention, the disk)."""

    def __init__(self, settings: Settings, shutdown: Shutdown) -> None:
        self.agent = _start_worker(settings)
        # Before the worker opens a pidfd per running job (and the API, here, a socket
        # per connection).
        self.open_files = raise_open_files_limit()
        target = watched("worker", self.agent.run, shutdown)
        self.thread = threading.Thread(target=target, name="ddpq-worker", daemon=True)
        self.thread.start()
        # The API answers only once the jobs of the last run are adopted or finalised: a
        # restarted daemon never shows "running" for a job that ended while it was down.
        while not self.agent.reconciled.wait(0.1) and self.thread.is_alive():
            pass
        log.info(
            "worker: %d GPU(s)%s, ports %d-%d",
            len(self.agent.devices),
            " (fake)" if settings.fake_gpus is not None else "",
            *settings.port_range,
        )
        log.info("worker: %s", self.agent.executor.describe())
        _say_what_limits_jobs(settings, self.agent.executor)
        # Beside the worker, not in its pass: a receiver that hangs never delays scheduling.
        self.notifier = _start_notifier(settings, shutdown)
        self.janitor = _start_janitor(settings, shutdown)
        self.disk = _start_disk_watch(settings, shutdown)

    def stop(self, settings: Settings) -> None:
        self.disk.stop()
        if self.janitor is not None:
            self.janitor[0].stop()
            self.janitor[1].join(timeout=5)  # a pass half done is finished by the next daemon
        if settings.stop_jobs_on_exit and self.thread.is_alive():
            log.info("stopping: cancelling running jobs (--stop-jobs)")
        else:
            log.info("stopping: running jobs keep running and are re-adopted on restart")
        self.agent.stop()
        self.thread.join()
        keep_job_ids_unique(settings)  # the mark a restore of an older backup must pass
        self.notifier.stop()


def _serve(
    settings: Settings,
    sock: socket.socket | None,
    unix: UnixListener | None,
    shutdown: Shutdown,
    open_files: int,
) -> None:
    """Answer the API (if it listens) until a signal, or a death in ``shutdown``."""
    if sock is not None:
        import uvicorn

        from ddpq.executors.local.freeze import pauser
        from ddpq.server.app import create_app
        from ddpq.server.protocol import http_config

        # uvicorn with a header deadline and a connection bound (slowloris).
        app = create_app(settings, pauser(settings))
        config = http_config(app, open_files, per_account=settings.auth)
        listening = [sock] if unix is None else [sock, unix.sock]
        server = uvicorn.Server(config)
        # uvicorn re-raises the signal that stopped it once it is done; with the default
        # handler that would kill us before the worker is stopped. Until uvicorn takes
        # the signals over (start-up, the heap's freeze: up to a second), one that comes
        # asks the server to stop as soon as it has started, not ignored: a SIGTERM there
        # was lost, and the daemon served on (tests/test_trust.py, 1 run in 4).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
        # Said once a SIGTERM would stop it (tests/test_stop_at_start.py waits for it).
        log.info("API on http://%s:%d (home %s)", settings.host, settings.port, settings.home)
        shutdown.attach(server)
        freeze_startup_objects()  # the worker and the app are made (daemon.heap)
        take_short_turns()  # a submission waits less for the lock after each statement
        server.run(sockets=listening)
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: shutdown.event.set())
    freeze_startup_objects()
    take_short_turns()
    while not shutdown.event.wait(3600):
        pass
