"""A long-lived parent for shims: one fork per attempt, no new Python each time.

``python -S forkserver.py --socket-fd N``, started once by the local executor (standard
library only, like the shim it imports). For each request on its socket it forks a child
that is born in the attempt's v2 cgroup (``clone_into``) or joins it, becomes the job's
account in a session of its own, and runs ``shim.main`` there: the same shim as ``python
-S shim.py`` runs, without paying for an interpreter's start (~10 ms of CPU) and an exec in
the worker (~6 ms, with the worker waiting), nor a move into ``cgroup.procs`` (~8 ms: the
kernel's cgroup migration waits for an RCU grace period; ``join_cgroups`` says how the
shim avoids it). The worker's part is one message each way.

Requests arrive as one datagram each on a SOCK_SEQPACKET socket: a JSON object
``{"argv", "env", "uid", "gid", "groups", "umask", "cgroup", "limits"}`` (and ``"shm"``
where the attempt gets a /dev/shm of its own: its size or null, ``shim_shm``) with two
descriptors passed along (SCM_RIGHTS): the read end of the shim's gate pipe, and its stderr
file. A request too large for one datagram is ``{"request_fd": true}`` with a third
descriptor, a memory file holding the object. The answer is ``{"pid": N}`` or
``{"error": "..."}``. The server reaps its children, and exits when the worker's end of the
socket closes; shims it forked run on.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import time

import clone_into  # type: ignore[import-not-found]  # beside this file (python -S puts it first)
import shim  # type: ignore[import-not-found]
import shim_shm  # type: ignore[import-not-found]

MAX_REQUEST = 1 << 20  # inline, in the datagram
MAX_REQUEST_FILE = 16 << 20  # in a memory file passed along ({"request_fd": true})
SHIM_TITLE = "ddpq-shim"  # a forked shim's command name and first word (procs.find_shim)


def reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def retitle(words: list[str]) -> None:
    """Show this process as the shim it now is (``ps``, ``top``), not as the fork server it
    was forked from: its command name, and its command line written over the server's
    (which was started with room to spare for a job folder's path)."""
    import ctypes

    title = "\0".join(words).encode()
    try:
        shim.shim_libc.libc().prctl(15, title.split(b"\0")[0][:15], 0, 0, 0)  # PR_SET_NAME
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    except (OSError, ValueError, IndexError, AttributeError):
        return
    if end - start > len(title):
        ctypes.memmove(start, title.ljust(end - start, b"\0"), end - start)


def child(
    request: dict[str, object], gate: int, err: int, server: socket.socket, born_in: bool
) -> None:
    """The forked child: become the attempt's shim (``born_in``: already in its v2
    cgroup, ``clone_into``). Never returns."""
    code = 1
    try:
        server.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        env, argv = request["env"], request["argv"]
        assert isinstance(env, dict) and isinstance(argv, list)
        opts = shim.parse_args(shim.take_gate(argv)[2])
        retitle([SHIM_TITLE, "--job-dir", opts.job_dir])
        os.environ.clear()
        os.environ.update(env)
        refused = join_cgroups(request, born_in)
        if refused is None:
            private_shm(request)
        os.umask(int(request["umask"]))  # type: ignore[call-overload]
        become(request)
        if refused is not None:
            # Written as the job's account, never as root: the record's folder is the
            # job's, which may hold a link where the record goes.
            code = shim.shim_record.failed_to_start(opts.record, time.time(), refused)
            return
        os.chdir("/")
        code = shim.main(["--wait-fd", str(gate), *argv])
    except SystemExit as exc:  # the shim's usage error: say it, as python would
        if isinstance(exc.code, int):
            code = exc.code
        else:
            code = 2
            os.write(2, f"{exc.code}\n".encode())
    except BaseException as exc:  # report, then end: nothing may return into the server
        try:
            os.write(2, f"ddpq shim: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(code)


def join_cgroups(request: dict[str, object], born_in: bool = False) -> str | None:
    """Join the attempt's cgroups: those of its limits (v1 hierarchies), then its own (v2)
    unless it was born there; None, or why one could not be joined. Still as the daemon's
    account: the job's may not write cgroup.procs. A job that cannot be confined does not
    run, and its record says why.

    A v1 cgroup is joined through its ``tasks`` file, which moves one thread: this child
    has one (a fork copies only the thread that forked), so the whole process moves. The
    kernel lets a thread that moves itself skip the global lock a ``cgroup.procs`` write
    takes, whose every taking waits for an RCU grace period (bench/cgroup_join.py: ~8 ms
    a write through ``cgroup.procs`` on this project's AMD machine, 0.5 ms through
    ``tasks``). v2 has no such file for a process that is not threaded: a child born in
    its v2 cgroup (``clone_into``) skips that wait; one forked where the kernel cannot
    still writes ``cgroup.procs``.
    """
    limits, cgroup = request.get("limits"), request.get("cgroup")
    joins = [(p, "tasks") for p in limits if isinstance(p, str)] if isinstance(limits, list) else []
    if isinstance(cgroup, str) and not born_in:
        joins.append((cgroup, "cgroup.procs"))
    for path, name in joins:
        try:
            with open(os.path.join(path, name), "w") as f:
                f.write("0")
        except OSError as exc:
            return f"cannot join its cgroup {path}: {exc.strerror or exc}"
    return None


def private_shm(request: dict[str, object]) -> None:
    """A /dev/shm of the attempt's own (``"shm"``: asked for, with its size in bytes or
    null), made while still root (``shim_shm``). One that cannot be made leaves the job
    the host's, and its log says why: the job still runs."""
    if "shm" not in request:
        return
    size = request["shm"]
    why = shim_shm.make_private(size if isinstance(size, int) else None)
    if why is not None:
        os.write(2, f"ddpq: {why}; /dev/shm is the host's\n".encode())


def become(request: dict[str, object]) -> None:
    """Take the job's account, with every group it has (``"groups"``: the account's
    supplementary groups, as a login gets them); nothing changes without a uid and gid."""
    uid, gid, groups = request.get("uid"), request.get("gid"), request.get("groups", [])
    if not (isinstance(uid, int) and isinstance(gid, int)):
        return
    if not isinstance(groups, list) or not all(isinstance(g, int) for g in groups):
        raise ValueError("groups is a list of group ids")
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)


def serve(server: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, reap)
    # A signal meant for the daemon's terminal must not end the parent of every shim.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fds = array.array("i")
    while True:
        try:
            data, ancdata, _flags, _addr = server.recvmsg(
                MAX_REQUEST, socket.CMSG_SPACE(3 * fds.itemsize)
            )
        except InterruptedError:
            continue
        if not data:
            return  # the worker has gone
        received = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        answer: dict[str, object]
        try:
            request = json.loads(data)
            if len(received) == 3 and request == {"request_fd": True}:
                request = json.loads(read_request_file(received.pop()))
            if len(received) != 2 or not isinstance(request, dict):
                raise ValueError("a request is a JSON object and two descriptors")
            if "shm" in request and shim_shm.refused_here() is not None:
                del request["shm"]  # this host refuses it: said once, not in every job's log
            pid, born_in = fork_for(request)
            if pid == 0:
                child(request, received[0], received[1], server, born_in)
            answer = {"pid": pid}
        except (OSError, ValueError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in received:
                os.close(fd)
        server.sendall(json.dumps(answer).encode())


def fork_for(request: dict[str, object]) -> tuple[int, bool]:
    """Fork the request's child: born in its v2 cgroup where the kernel can, else forked
    here to join it by writing. The PID (0 in the child), and whether it was born there."""
    cgroup = request.get("cgroup")
    pid = clone_into.fork_into(cgroup) if isinstance(cgroup, str) else None
    if pid is not None:
        return pid, True
    return os.fork(), False


def read_request_file(fd: int) -> bytes:
    """The request in a memory file (closed here, before any fork: no shim inherits it)."""
    try:
        chunks: list[bytes] = []
        size = 0
        while chunk := os.pread(fd, 1 << 20, size):
            size += len(chunk)
            if size > MAX_REQUEST_FILE:
                raise ValueError(f"a request is at most {MAX_REQUEST_FILE} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    # --room: ignored; its length is the room a forked shim has to show its job folder.
    if len(argv) not in (2, 4) or argv[0] != "--socket-fd" or argv[2:3] not in ([], ["--room"]):
        sys.stderr.write("usage: forkserver.py --socket-fd N [--room TEXT]\n")
        return 2
    server = socket.socket(fileno=int(argv[1]))
    # What every shim loads later, loaded once here so children find it loaded.
    shim.shim_libc.preload()
    serve(server)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
