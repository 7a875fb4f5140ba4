"""The parent of one job: ``python -S shim.py --job-dir D [--grace S] [--log-cap B] -- CMD...``

Standard library only, started by file path with ``python -S`` because it sits
on every job's start path (about 10 ms instead of a second of imports). The
worker starts it as the leader of a new session; it then

* becomes a child subreaper, so anything the job forks and orphans is
  re-parented here rather than to init and can still be found and killed;
* runs CMD as the leader of its own process group (so the whole job can be
  signalled without signalling the shim), its stdout and stderr piped through
  the shim into ``output.log`` with a size cap (head and newest part kept);
* on SIGTERM/SIGINT sends SIGTERM to the job's group, then SIGKILL to every
  process of the job once the grace period is over;
* when CMD exits, kills whatever of the job is left, waits until it is all
  gone, and only then writes ``exit.json`` atomically (temp file and
  rename). The record does not depend on the worker being alive or being the
  parent, so a restarted worker can finalise jobs that ended while it was down.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
EXIT_RECORD = "exit.json"
LOG = "output.log"


def parse_args(argv: list[str]) -> tuple[str, float, int, list[str]]:
    job_dir, grace, cap = "", 10.0, 64 * 1024 * 1024
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag = argv[i]
        value = argv[i + 1]
        if flag == "--job-dir":
            job_dir = value
        elif flag == "--grace":
            grace = float(value)
        elif flag == "--log-cap":
            cap = int(value)
        else:
            raise SystemExit(f"shim: unknown option {flag}")
        i += 2
    cmd = argv[i + 1 :]
    if not job_dir or not cmd:
        raise SystemExit("shim: usage: shim.py --job-dir D [--grace S] [--log-cap B] -- CMD...")
    return job_dir, grace, cap, cmd


class CappedLog:
    """Append-only log that keeps its first quarter and newest part under ``cap`` bytes.

    When the file grows past ``cap`` plus some slack, it is rewritten (temp file
    + rename) as head + a line saying how much was dropped + the newest bytes.
    The slack makes rewrites rare: at most one per ``cap/2`` bytes of output.
    """

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self.cap = max(cap, 4096)
        self.head = self.cap // 4
        self.dropped = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n
        if self.size > self.cap + self.cap // 2:
            self.compact()

    def compact(self) -> None:
        if self.size <= self.cap:
            return
        with open(self.path, "rb") as f:
            head = f.read(self.head)
            tail_len = self.cap - self.head
            f.seek(self.size - tail_len)
            tail = f.read()
        self.dropped += self.size - len(head) - len(tail)
        marker = (
            f"\n[ddpq: log over its cap of {self.cap} bytes; "
            f"{self.dropped} bytes dropped here in all, newest output follows]\n"
        ).encode()
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(head + marker + tail)
        os.replace(tmp, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        self.compact()
        os.close(self.fd)


def ancestors() -> set[int]:
    """Our parent, its parent, ... : never part of the job, whatever their environment."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            break
        pid = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return found


ANCESTORS: set[int] = set()


def session_members(sid: int, marker: bytes = b"", since_ticks: int = 0) -> list[int]:
    """The job's processes: in session ``sid``, re-parented to this shim, or (started
    after the shim) carrying ``marker`` (``DDPQ_JOB_DIR=...``) in their environment,
    which every process of the job inherits even after leaving the session."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me or int(name) in ANCESTORS:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parens).
        fields = stat[stat.rfind(b")") + 2 :].split()
        state, ppid, session = fields[0], int(fields[1]), int(fields[3])
        if state == b"Z" and ppid != me:
            continue  # a zombie of someone else: already dead
        ours = session == sid or ppid == me
        escaped = bool(marker) and int(fields[19]) >= since_ticks and _has_marker(name, marker)
        if ours or escaped:
            found.append(int(name))
    return found


def _has_marker(pid: str, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\x00")
    except OSError:
        return False  # gone, or another user's: not ours either way


def own_start_ticks() -> int:
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


# The job's wait status, kept here because reaping stragglers with waitpid(-1)
# may reap the job itself.
MAIN: dict[str, int] = {}


def reap_children() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == MAIN.get("pid"):
            MAIN["status"] = status


def kill_everything(sid: int, marker: bytes, since: int, timeout: float = 30.0) -> None:
    """SIGKILL every process of the job until none is left (ESRCH means already gone)."""
    deadline = time.monotonic() + timeout
    while True:
        reap_children()
        members = session_members(sid, marker, since)
        if not members or time.monotonic() > deadline:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def write_record(job_dir: str, record: dict[str, object]) -> None:
    """Write the record atomically: a reader sees the whole record or none.

    No fsync: the record must survive the worker's crash, not a power cut (after
    which nothing of the job runs anyway, and a missing record reads as "lost").
    """
    import json

    # Which attempt this record is about, so a stale record is never taken for a new one.
    record = {**record, "attempt": os.environ.get("DDPQ_ATTEMPT")}
    tmp = os.path.join(job_dir, EXIT_RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(job_dir, EXIT_RECORD))


def become_subreaper() -> None:
    """Orphans of the job come to us, not to init, so they can still be found and killed."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # then double-forked daemons escape to init; the worker still finds them


def main(argv: list[str]) -> int:
    job_dir, grace, cap, cmd = parse_args(argv)
    if os.getsid(0) != os.getpid():
        # Not started as a session leader: become one, or killing "the job's
        # session" would kill whoever started us.
        try:
            os.setsid()
        except OSError:
            sys.stderr.write("ddpq shim: must be started as a session leader (setsid)\n")
            return 2
    sid = os.getsid(0)
    marker = f"DDPQ_JOB_DIR={os.environ.get('DDPQ_JOB_DIR', '')}".encode()
    if not os.environ.get("DDPQ_JOB_DIR"):
        marker = b""  # started by hand, outside ddpq: only the session and our orphans
    since = own_start_ticks()
    ANCESTORS.update(ancestors())

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stop_requested = {"at": 0.0}

    def on_stop(signum: int, _frame: object) -> None:
        if not stop_requested["at"]:
            stop_requested["at"] = time.monotonic()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below

    started_at = time.time()
    error: str | None = None
    try:
        log = CappedLog(os.path.join(job_dir, LOG), cap)
    except OSError as exc:
        write_record(
            job_dir,
            {
                "exit_code": None,
                "signal": None,
                "started_at": started_at,
                "ended_at": time.time(),
                "error": f"cannot open the job's log: {exc}",
            },
        )
        return 0

    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job
        try:
            os.setpgid(0, 0)
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(s, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            os.write(2, f"ddpq: cannot run {cmd[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)
    MAIN["pid"] = pid
    # Only now, off the job's start path (ctypes costs milliseconds to import). An
    # orphan made in the job's first instant still stays in our session unless it
    # also left it; the worker's DDPQ_JOB_DIR sweep covers that corner.
    become_subreaper()
    try:
        os.setpgid(pid, pid)  # also from here, so no signal can race the child's own call
    except OSError:
        pass
    os.close(out_w)
    os.set_blocking(out_r, False)

    status: int | None = None
    termed = False
    killed = False
    pipe_open = True
    while status is None or pipe_open:
        if stop_requested["at"] and not termed:
            termed = True
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if termed and not killed and time.monotonic() - stop_requested["at"] >= grace:
            killed = True
            kill_everything(sid, marker, since)
        if status is not None and pipe_open:
            # The job is gone; whatever still holds the pipe is a straggler.
            kill_everything(sid, marker, since)
        timeout = 0.5
        if termed and not killed:
            timeout = max(0.0, min(timeout, stop_requested["at"] + grace - time.monotonic()))
        fds = [wake_r] + ([out_r] if pipe_open else [])
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        if pipe_open and out_r in ready:
            while True:
                try:
                    chunk = os.read(out_r, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    pipe_open = False
                    break
                if error is None:
                    try:
                        log.write(chunk)
                    except OSError as exc:
                        error = f"cannot write the job's log: {exc}"
                        stop_requested["at"] = stop_requested["at"] or time.monotonic()
                        grace = 0.0
        if status is None:
            reap_children()
            status = MAIN.get("status")
    kill_everything(sid, marker, since)
    assert status is not None
    ended_at = time.time()
    try:
        log.close()
    except OSError as exc:
        error = error or f"cannot write the job's log: {exc}"
    record: dict[str, object] = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "started_at": started_at,
        "ended_at": ended_at,
        "error": error,
        "log_dropped_bytes": log.dropped,
    }
    try:
        write_record(job_dir, record)
    except OSError as exc:
        sys.stderr.write(f"ddpq shim: cannot write the exit record: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            sys.stderr.write("ddpq shim: disk full\n")
        raise
