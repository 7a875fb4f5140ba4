"""The API's Unix socket: made when the daemon starts, removed when it stops.

Mode 0666, so that every local account can connect: the socket does not decide who may do
what, it tells the API who is calling (``ddpq.server.peer``). Its folder must let others
pass through (search, the x bit): the state folder is 0711, and a folder ddpq makes for
the socket (``/run/ddpq``) 0755. A socket left by a daemon that was killed is replaced; one
that a running daemon answers on is not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from ddpq.config import ConfigError

BACKLOG = 128


@dataclass(frozen=True)
class UnixListener:
    sock: socket.socket
    path: Path
    inode: int  # of the socket file made at bind: removed at exit only if still there

    def close(self) -> None:
        """Close the socket and remove its file, unless a successor's replaced it."""
        with contextlib.suppress(OSError):
            if self.path.lstat().st_ino == self.inode:
                self.path.unlink()
        self.sock.close()


def listen_unix(path: Path) -> UnixListener:
    """A listening socket at ``path``, mode 0666; ``ConfigError`` if that cannot be."""
    missing = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    try:
        for folder in reversed(missing):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o755)  # made under the daemon's umask 077: others must pass
    except OSError as exc:
        raise ConfigError(f"cannot make {exc.filename} for the socket: {exc.strerror}") from None
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # Made under umask 077 (nobody could connect until now): open it to every account.
        os.chmod(path, 0o666)
        sock.listen(BACKLOG)
        inode = path.lstat().st_ino
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on the socket {path}: {exc.strerror}") from None
    return UnixListener(sock, path, inode)


def _clear_stale(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError(f"{path} exists and is not a socket; remove it or choose --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # nobody listens: a killed daemon's
        return
    except OSError as exc:
        raise ConfigError(f"cannot use the socket {path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise ConfigError(f"another ddpq daemon listens on {path}")


def closed_to_others(path: Path) -> list[Path]:
    """The folders above ``path`` that other accounts cannot pass through (no o+x): the
    socket is out of their reach while there is one."""
    shut = []
    for folder in path.parents:
        try:
            mode = folder.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            shut.append(folder)
    return shut
