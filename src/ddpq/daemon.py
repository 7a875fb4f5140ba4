"""Wiring for ``ddpq serve`` (API + worker in one process), ``ddpq server`` and ``ddpq worker``."""

from __future__ import annotations

import fcntl
import getpass
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import IO

from ddpq.config import ConfigError, Settings
from ddpq.store.db import migrate

log = logging.getLogger("ddpq")


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


def make_private(settings: Settings) -> None:
    """State folder 0711 (jobs running as their owners' accounts must pass through to
    their own folders; nobody else may list it), the database and its side files 0600.

    Also for folders made by an older ddpq, whose modes were looser.
    """
    for folder in (settings.home, settings.jobs_dir):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
    for path in settings.home.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)
    for job_dir in settings.jobs_dir.iterdir():
        if job_dir.is_dir() and not job_dir.is_symlink():
            job_dir.chmod(0o700)


def worker_lock(home: Path) -> IO[str]:
    """One worker per state folder: two would each think the other's jobs were lost."""
    home.mkdir(parents=True, exist_ok=True)
    f = open(home / "worker.lock", "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise ConfigError(f"another ddpq worker (pid {pid}) already runs on {home}") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def agree_on_trust(settings: Settings) -> IO[str]:
    """Hold the state folder's trust mode for this process's life; refuse a different one.

    ``ddpq server`` without --auth believes any user name a client sends; paired with
    a root ``ddpq worker --auth`` that would run anyone's job as any account. So the
    first process on a state folder writes its mode to ``trust-mode`` under a shared
    lock, and a process started with another mode while that one runs refuses to start.
    The file is locked exclusively only while nobody holds it, i.e. when it is free to
    (re)write.
    """
    mine = settings.trust_mode
    f = open(settings.trust_file, "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another ddpq process runs on this folder: its mode stands
    else:
        f.seek(0)
        f.truncate()
        f.write(mine)
        f.flush()
    fcntl.flock(f, fcntl.LOCK_SH)
    f.seek(0)
    theirs = f.read().strip()
    if theirs != mine:
        f.close()
        raise ConfigError(
            f"another ddpq process on {settings.home} runs in {theirs} mode and this one "
            f"in {mine} mode; `ddpq server` and `ddpq worker` must both have --auth or "
            "neither (a worker with --auth would run jobs as whatever user a client without "
            "a token names)"
        )
    return f


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


def run(settings: Settings, *, api: bool = True, worker: bool = True) -> None:
    settings.validate(runs_jobs=worker)
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
    sock = listen_socket(settings.host, settings.port) if api else None
    lock = worker_lock(settings.home) if worker else None
    agent = None
    thread = None
    if worker:
        from ddpq.worker.devices import DevicesUnavailable
        from ddpq.worker.loop import Worker

        try:
            agent = Worker(settings)
        except DevicesUnavailable as exc:
            raise ConfigError(str(exc)) from None
        thread = threading.Thread(target=agent.run, name="ddpq-worker", daemon=True)
        thread.start()
        log.info(
            "worker: %d GPU(s)%s, ports %d-%d",
            len(agent.devices),
            " (fake)" if settings.fake_gpus is not None else "",
            *settings.port_range,
        )
        log.info("worker: %s", agent.executor.describe())
    try:
        if sock is not None:
            import uvicorn

            from ddpq.server.app import create_app
            from ddpq.server.protocol import http_config

            # uvicorn with a header deadline and a connection bound (slowloris).
            config = http_config(create_app(settings))
            log.info("API on http://%s:%d (home %s)", settings.host, settings.port, settings.home)
            # uvicorn re-raises the signal that stopped it once it is done; with
            # the default handler that would kill us before the worker is stopped.
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: None)
            uvicorn.Server(config).run(sockets=[sock])
        else:
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(3600):
                pass
    finally:
        if agent is not None and thread is not None:
            if settings.stop_jobs_on_exit:
                log.info("stopping: cancelling running jobs (--stop-jobs)")
            else:
                log.info("stopping: running jobs keep running and are re-adopted on restart")
            agent.stop()
            thread.join()
        if lock is not None:
            lock.close()
        trust.close()
