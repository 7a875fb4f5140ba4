"""The parent of one job: ``python -S shim.py --job-dir D --log L --record R --cwd W --grace S
--log-cap B -- CMD``

Standard library only, started by file path with ``python -S`` because it sits
on every job's start path (about 10 ms instead of a second of imports). The
worker starts it as the leader of a new session; it then

* with ``--wait-fd N --cgroup DIR``, waits for the worker's word on pipe N before
  anything else: the worker first moves it into the job's cgroup (and fences the
  job's GPUs), so the whole job is that cgroup's members (see ``job_members``);
* becomes a child subreaper, so anything the job forks and orphans is
  re-parented here rather than to init and can still be found and killed;
* runs CMD as the leader of its own process group (so the whole job can be
  signalled without signalling the shim), its stdout and stderr piped through
  the shim into the log file L with a size cap (head and newest part kept);
* on SIGTERM/SIGINT sends SIGTERM to the job's group, then SIGKILL to every
  process of the job once the grace period is over;
* when CMD exits, kills whatever of the job is left, waits until it is all
  gone, and only then writes the exit record R atomically (temp file and
  rename). The record does not depend on the worker being alive or being the
  parent, so a restarted worker can finalise jobs that ended while it was down;
* with ``--tmp T`` (the job's ``TMPDIR``), makes T an empty folder before the job
  starts and removes it after the record is written (``shim_tmp``).

With ``--pty 1 --socket S --notice N`` it runs an interactive session instead: CMD on
a pseudo-terminal whose output is the log, relayed to its owner over the Unix socket S
(``shim_pty``); SIGUSR2 says the worker left a line in N for the terminal.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

# Its helpers lie beside it: run by its path with ``python -S`` (the worker does) this
# folder is first on sys.path; imported as ddpq's module (tests do), they are ddpq's too.
if __package__:
    from ddpq.executors.local import (
        shim_batch,
        shim_libc,
        shim_log,
        shim_procs,
        shim_record,
        shim_signals,
        shim_tmp,
    )
else:
    import shim_batch  # type: ignore[import-not-found,no-redef]
    import shim_libc  # type: ignore[import-not-found,no-redef]
    import shim_log  # type: ignore[import-not-found,no-redef]
    import shim_procs  # type: ignore[import-not-found,no-redef]
    import shim_record  # type: ignore[import-not-found,no-redef]
    import shim_signals  # type: ignore[import-not-found,no-redef]
    import shim_tmp  # type: ignore[import-not-found,no-redef]
# A session's terminal (shim_pty) is imported by the sessions alone: its modules (socket,
# termios, json) would cost every batch job's start milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ddpq.executors.local import shim_pty

PR_SET_CHILD_SUBREAPER = 36


class Options:
    """The shim's flags. Every one is required: the worker's settings are the one
    place their values come from."""

    def __init__(self) -> None:
        self.job_dir = ""  # the job's folder: how a restarted worker finds this shim
        self.log = ""
        self.record = ""
        self.cwd = ""
        self.grace = -1.0
        self.cap = -1
        # The attempt's own temporary folder (the job's TMPDIR), made empty for the job
        # and removed after it; "": the job chose its own TMPDIR (shim_tmp).
        self.tmp = ""
        self.cmd: list[str] = []
        # A preemptible job: the signal it is told to checkpoint with, and how long it has.
        self.preempt_signal = ""
        self.preempt_grace = 0.0
        # The job's first process is a launcher (torchrun): it must not act on the signal,
        # only the ranks it starts, which install their own handlers.
        self.preempt_shield = False
        # An interactive session: the job on a terminal, served on this socket; the file
        # where the worker leaves a line for that terminal.
        self.pty = False
        self.socket = ""
        self.notice = ""


def parse_args(argv: list[str]) -> Options:
    opts = Options()
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if flag == "--job-dir":
            opts.job_dir = value
        elif flag == "--log":
            opts.log = value
        elif flag == "--record":
            opts.record = value
        elif flag == "--cwd":
            opts.cwd = value
        elif flag == "--grace":
            opts.grace = float(value)
        elif flag == "--log-cap":
            opts.cap = int(value)
        elif flag == "--tmp":
            opts.tmp = value
        elif flag == "--preempt-signal":
            opts.preempt_signal = value
        elif flag == "--preempt-grace":
            opts.preempt_grace = float(value)
        elif flag == "--preempt-shield":
            opts.preempt_shield = value == "1"
        elif flag == "--pty":
            opts.pty = value == "1"
        elif flag == "--socket":
            opts.socket = value
        elif flag == "--notice":
            opts.notice = value
        else:
            raise SystemExit(f"shim: unknown option {flag}")
        i += 2
    opts.cmd = argv[i + 1 :]
    given = opts.job_dir and opts.log and opts.record and opts.cwd and opts.cmd
    if opts.pty and not (opts.socket and opts.notice):
        raise SystemExit("shim: --pty 1 needs --socket S and --notice N")
    if not given or opts.grace < 0 or opts.cap < 0:
        raise SystemExit(
            "shim: usage: shim.py --job-dir D --log L --record R --cwd W --grace S --log-cap B "
            "-- CMD..."
        )
    return opts


def take_gate(argv: list[str]) -> tuple[int, str, list[str]]:
    """Take the worker's handshake flags out of ``argv``: ``--wait-fd N`` (a pipe to wait
    on before starting the job) and ``--cgroup DIR`` (where the worker puts us)."""
    gate, cgroup, rest = -1, "", []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--wait-fd" and i + 1 < len(argv):
            gate = int(argv[i + 1])
        elif argv[i] == "--cgroup" and i + 1 < len(argv):
            cgroup = argv[i + 1]
        else:
            rest += argv[i : i + 2]
        i += 2
    return gate, cgroup, rest + argv[i:]


def wait_for_worker(gate: int, cgroup: str) -> bool:
    """Block until the worker says the job may start: b"c" once it has moved us into
    ``cgroup`` (so everything the job forks starts there), b"f" when it has also fenced
    that cgroup to the job's real GPUs, b"s" to track by session. False when the pipe
    closes with no word: the worker died first, and the job never ran."""
    try:
        word = os.read(gate, 1)
    except OSError:
        word = b""
    os.close(gate)
    if word in (b"c", b"f") and cgroup:
        shim_procs.JOB_CGROUP["dir"] = cgroup
    if word == b"f":
        renumber_gpus()
    return word in (b"c", b"f", b"s")


def renumber_gpus() -> None:
    """Fenced, CUDA sees only the leased GPUs, numbered from 0 in PCI bus order (as under
    Slurm's ConstrainDevices): ``CUDA_VISIBLE_DEVICES=1,3`` becomes ``0,1``, ``3,1``
    becomes ``1,0``. NVML indexes are in PCI bus order too, so sorting them gives that."""
    try:
        leased = [int(g) for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    except ValueError:
        return
    order = sorted(leased)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(order.index(g)) for g in leased)


def become_subreaper() -> None:
    """Orphans of the job come to us, not to init, so they can still be found and killed."""
    try:
        shim_libc.libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # then double-forked daemons escape to init; the worker still finds them


def main(argv: list[str]) -> int:
    gate, cgroup, argv = take_gate(argv)
    opts = parse_args(argv)
    # A stop or a preemption may come as soon as the worker has let us go: handled from
    # the start (a signal without a handler would end the shim, and the job would be lost).
    stop_requested = handle_signals(opts)
    if gate >= 0 and not wait_for_worker(gate, cgroup):
        return shim_record.not_launched(opts.record)
    if not lead_session():
        return 2
    job = job_identity()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the relay (wake_r)

    started_at = time.time()
    shim_record.reserve_record(opts.record)
    try:
        log = shim_log.CappedLog(opts.log, opts.cap)
    except OSError as exc:
        return shim_record.failed_to_start(
            opts.record, started_at, shim_record.disk_error("opening its log", exc)
        )
    term: shim_pty.Terminal | None = None
    if opts.pty:
        opened = open_terminal(opts, log, stop_requested, wake_r)
        if isinstance(opened, str):
            return shim_record.failed_to_start(opts.record, started_at, opened)
        term = opened
    refused = prepare(opts)
    if refused is not None:
        if term is not None:
            term.abandon()
        return shim_record.failed_to_start(opts.record, started_at, refused)
    if term is not None:
        code = run_session(opts, term, job, started_at)
    else:
        code = run_batch(opts, stop_requested, wake_r, log, job, started_at)
    if opts.tmp:
        # After the record: a shim stopped while it removes has already said how the job
        # ended, and what it had no time for goes with the next attempt or the folder.
        shim_tmp.remove(opts.tmp)
    return code


def prepare(opts: Options) -> str | None:
    """Enter the job's working directory and make its temporary folder; why not, if not.

    Here, not in the worker: the shim already runs as the job's account, so a folder that
    account may not enter stays closed to it (a root worker's chdir would have let the
    job in), and the temporary folder is the account's own."""
    try:
        os.chdir(opts.cwd)
    except OSError as exc:
        return f"cannot enter its working directory {opts.cwd}: {exc.strerror}"
    return shim_tmp.fresh(opts.tmp) if opts.tmp else None


def handle_signals(opts: Options) -> dict[str, float]:
    """Install the shim's handlers; what they record: ``at`` a stop (SIGTERM, SIGINT,
    SIGHUP), ``preempt_at`` a preemption (SIGUSR1: a stop if the job is not preemptible),
    ``notice`` a line the worker left for a session's terminal (SIGUSR2)."""
    stop_requested = {"at": 0.0, "preempt_at": 0.0}

    def on_stop(signum: int, _frame: object) -> None:
        if not stop_requested["at"]:
            stop_requested["at"] = time.monotonic()

    def on_preempt(signum: int, _frame: object) -> None:
        if not opts.preempt_signal:
            on_stop(signum, _frame)  # not preemptible: a preemption is a stop
        elif not stop_requested["preempt_at"]:
            stop_requested["preempt_at"] = time.monotonic()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    signal.signal(signal.SIGUSR1, on_preempt)
    # The worker left a line for a session's terminal; a batch job has none to show.
    signal.signal(signal.SIGUSR2, lambda *_: stop_requested.__setitem__("notice", 1.0))
    # After the handlers: a stop that comes meanwhile is never fatal.
    shim_signals.reset_inherited()
    return stop_requested


def lead_session() -> bool:
    """Be the leader of a session of our own; False (said on stderr) if we cannot be."""
    if os.getsid(0) != os.getpid():
        # Not started as a session leader: become one, or killing "the job's
        # session" would kill whoever started us.
        try:
            os.setsid()
        except OSError:
            sys.stderr.write("ddpq shim: must be started as a session leader (setsid)\n")
            return False
    return True


def job_identity() -> tuple[int, bytes, int]:
    """How the job's processes are found (``shim_procs.job_members``): our session, the
    job's DDPQ_JOB_DIR in their environment, and our start time (nothing older is the
    job's)."""
    sid = os.getsid(0)
    marker = f"DDPQ_JOB_DIR={os.environ.get('DDPQ_JOB_DIR', '')}".encode()
    if not os.environ.get("DDPQ_JOB_DIR"):
        marker = b""  # started by hand, outside ddpq: only the session and our orphans
    since = shim_procs.own_start_ticks()
    return sid, marker, since


def open_terminal(
    opts: Options, log: shim_log.CappedLog, stop: dict[str, float], wake: int
) -> shim_pty.Terminal | str:
    """A session's terminal, served on ``opts.socket``; why not, if it cannot be."""
    if __package__:
        from ddpq.executors.local import shim_pty
    else:
        import shim_pty  # type: ignore[import-not-found,no-redef]
    try:
        listener = shim_pty.listen(opts.socket)
    except OSError as exc:
        return f"cannot serve its terminal on {opts.socket}: {exc}"
    return shim_pty.Terminal(opts.socket, listener, log, opts.notice, stop, wake)


def run_batch(
    opts: Options,
    stop: dict[str, float],
    wake: int,
    log: shim_log.CappedLog,
    job: tuple[int, bytes, int],
    started_at: float,
) -> int:
    """A batch job: its output through a pipe into the log (``shim_batch``)."""
    preempt_with = (
        getattr(signal, f"SIG{opts.preempt_signal}", None) if opts.preempt_signal else None
    )
    out_r, out_w = os.pipe()
    pid, cannot_run = shim_batch.fork_job(opts.cmd, out_w, preempt_with, opts.preempt_shield)
    shim_procs.MAIN["pid"] = pid
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
    relay = shim_batch.Relay(
        pid, out_r, wake, log, stop, opts.grace, (preempt_with, opts.preempt_grace), job
    )
    status = relay.run()
    shim_procs.kill_everything(*job)
    # A command that could not be run: the record says why, as the log does, so that the
    # job's reason names it rather than a bare "exit code 127".
    not_run = os.WIFEXITED(status) and os.WEXITSTATUS(status) == shim_batch.NOT_RUN_EXIT
    error = relay.error or (cannot_run if not_run else None)
    return shim_record.finish(opts.record, log, status, started_at, error)


# What a session's job gets back to their defaults: a batch job's, and SIGUSR2 (the
# worker's notice for the terminal), which the shim handles too.
JOB_SIGNALS = [*shim_batch.RESET_IN_JOB, signal.SIGUSR2]


def run_session(
    opts: Options, term: shim_pty.Terminal, job: tuple[int, bytes, int], started_at: float
) -> int:
    """An interactive session (``--pty 1``): the job on a terminal relayed over the socket."""
    try:
        pid = term.start(opts.cmd, JOB_SIGNALS)
    except OSError as exc:
        term.abandon()
        return shim_record.failed_to_start(
            opts.record, started_at, f"cannot open its terminal: {exc.strerror or exc}"
        )
    shim_procs.MAIN["pid"] = pid
    become_subreaper()
    status = term.run(*job, opts.grace)
    shim_procs.kill_everything(*job)
    term.close(status)
    return shim_record.finish(opts.record, term.log, status, started_at, term.error)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            sys.stderr.write("ddpq shim: disk full\n")
        raise
