"""Wiring for ``ddpq serve`` (API + worker in one process), ``ddpq server`` and ``ddpq worker``."""

from __future__ import annotations

import fcntl
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
    settings.validate()
    setup_logging()
    settings.home.mkdir(parents=True, exist_ok=True)
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
