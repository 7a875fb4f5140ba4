"""Supervision with real processes and signals: cancel, time limits, retries, re-adoption."""

from __future__ import annotations

import os
import pwd
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpq.executors.local import procs
from ddpq.schemas import JobSubmit
from tests.helpers import (
    FREEZES_ITS_SHIM,
    Daemon,
    alive,
    lose_shim_while_down,
    shim_of,
    stopped,
    wait_done,
    wait_for,
    wait_state,
)

JOBS = Path(__file__).parent / "jobs"


def job_pids(job_dir: str) -> list[int]:
    path = Path(job_dir) / "pids"
    text = wait_for(lambda: path.read_text() if path.exists() else None, what="the pid file")
    return [int(x) for x in text.split()]


def test_cancel_kills_a_sigterm_ignoring_job_and_all_its_children(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=[sys.executable, str(JOBS / "stubborn.py")], gpus=1))
    running = wait_state(c, job.id, "running")
    assert running.job_dir is not None
    pids = job_pids(running.job_dir)
    assert len(pids) == 4 and all(alive(p) for p in pids)
    c.cancel(job.id)
    done = wait_done(c, job.id)
    assert done.state == "cancelled"
    assert done.exit_signal == signal.SIGKILL  # it ignored SIGTERM: killed after the grace
    assert "SIGKILL after 1s" in done.reason
    assert [p for p in pids if alive(p)] == []
    assert done.leases.gpus == [] and done.leases.port is None


# What a batch job's first process starts with, however the shim starts it (spawned, or
# forked for a shielded launcher): its own process group, stdin from /dev/null, no signal
# ignored or blocked (Python ignores SIGPIPE and SIGXFSZ for itself: `yes | head` would
# never end), stdout and stderr both into the log.
START_STATE = (
    'read pid _ _ _ pgrp _ < /proc/self/stat; echo "leads $((pid == pgrp))"; '
    "echo stdin $(readlink /proc/self/fd/0); grep -E '^Sig(Ign|Blk)' /proc/self/status; "
    "echo to-stderr >&2"
)


def test_a_batch_job_starts_leading_its_group_with_no_signal_ignored(
    shared_daemon: Daemon,
) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["bash", "-c", START_STATE]))
    assert wait_done(c, job.id).state == "succeeded"
    lines = c.log_tail(job.id).decode().splitlines()
    assert "leads 1" in lines and "stdin /dev/null" in lines, lines
    assert "SigIgn:\t0000000000000000" in lines and "SigBlk:\t0000000000000000" in lines, lines
    assert "to-stderr" in lines


SHIM_SIGNALS = """
import signal, sys
for signum in (signal.SIGQUIT, signal.SIGHUP, signal.SIGINT, signal.SIGTTOU, signal.SIGRTMIN + 3):
    signal.signal(signum, signal.SIG_IGN)  # as nohup, a script's `cmd &`, and more
# As a parent that blocked them: the shim would never hear the worker's stop.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1, signal.SIGRTMAX})
import os
from ddpq.executors.local import shim, shim_signals
if os.uname().machine in shim_signals.RT_SIGACTION:  # where ddpq can reach them at all
    for signum in shim_signals.GLIBC_RESERVED:  # as a parent started by glibc's posix_spawn
        assert shim_signals.set_reserved(signum, shim_signals.SIG_IGN)
    assert shim_signals.ignored_mask() >> 31 & 3 == 3
shim.handle_signals(shim.Options())
status = open("/proc/self/status").read()
print(*(int(status.split(f)[1].split()[0], 16) for f in ("SigIgn:", "SigBlk:")))
"""


def test_the_shim_gives_back_every_signal_its_daemon_was_started_ignoring_or_blocking() -> None:
    # A daemon started under nohup, or by a script's `ddpq serve &` (a non-interactive
    # shell ignores SIGINT and SIGQUIT in its background jobs), or by a parent that
    # glibc's posix_spawn started (CI's runner leaves signal 32 ignored), passes that on
    # through fork and exec, to the shim and so to every job; a blocked signal too. Only
    # Python's own two stay ignored in the shim (each job gets them back).
    run = subprocess.run(
        [sys.executable, "-c", SHIM_SIGNALS], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    ignored_mask, blocked_mask = (int(word) for word in run.stdout.split())
    ignored = {n + 1 for n in range(64) if ignored_mask >> n & 1}
    assert ignored == {signal.SIGPIPE, signal.SIGXFSZ}, ignored
    assert blocked_mask == 0, hex(blocked_mask)


def test_a_daemon_started_with_signals_blocked_still_stops_its_jobs_and_itself(
    make_daemon: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A blocked signal stays blocked across fork and exec: a daemon started by a parent
    # that blocked SIGTERM had shims that never heard a cancel (the job ran on), and
    # could itself not be stopped but by SIGKILL.
    monkeypatch.setenv("DDPQ_TESTS_FRESH_PROCESSES", "1")  # exec'd: the mask comes along
    blocked = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        d = make_daemon("--fake-gpus", "1", "--grace", "30s")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    c = d.client()
    job = c.submit(JobSubmit(command=["sleep", "300"]))
    wait_state(c, job.id, "running")
    c.cancel(job.id)
    done = wait_done(c, job.id, timeout=20)  # well within the 30 s grace: SIGTERM was heard
    assert done.state == "cancelled" and done.exit_signal == signal.SIGTERM, done.reason
    assert d.stop(signal.SIGTERM, timeout=30) == 0


def stop_sent(d: Daemon, job_id: int) -> bool:
    """The worker has sent the job its stop (not only been asked to)."""
    with sqlite3.connect(d.home / "ddpq.db") as db:
        (at,) = db.execute("SELECT stop_sent_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return at is not None


@pytest.mark.parametrize("stop", ["cancel", "time limit", "cancel, then a restart"])
def test_a_job_that_stops_its_shim_is_still_stopped(
    make_daemon: Callable[..., Daemon], stop: str
) -> None:
    # The shim runs as the job's account: the job may SIGSTOP it, and then neither a
    # cancel nor its time limit reached it (the job ran on, holding its GPU). The executor
    # kills the shim and the job once the stop's grace is past by KILL_SLACK_S; a daemon
    # restarted meanwhile sends the stop again, and so keeps that deadline.
    d = make_daemon("--fake-gpus", "1", "--grace", "1s")
    c = d.client()
    # Long enough for the job to stop its shim first on a loaded machine.
    limit = 4 if stop == "time limit" else None
    job = c.submit(JobSubmit(command=["bash", "-c", FREEZES_ITS_SHIM], gpus=1, time_limit_s=limit))
    running = wait_state(c, job.id, "running")
    assert running.job_dir is not None
    shim = shim_of(running)
    wait_for(lambda: stopped(shim.pid), 30, "the shim stopped by its job")
    if stop != "time limit":
        c.cancel(job.id)
    if stop == "cancel, then a restart":
        wait_for(lambda: stop_sent(d, job.id), 30, "the cancel sent")
        d.kill9()
        d.start()
        c = d.client()
    done = wait_done(c, job.id, timeout=60)
    assert done.state == ("timed_out" if stop == "time limit" else "cancelled"), done.reason
    assert "killed by ddpq, its shim included" in done.reason
    assert [p for p in job_pids(running.job_dir) if alive(p)] == []
    assert done.leases.gpus == []


def test_stragglers_are_killed_when_the_main_process_exits(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=[sys.executable, str(JOBS / "stubborn.py"), "exit"]))
    done = wait_done(c, job.id)
    assert done.state == "succeeded"
    assert done.job_dir is not None
    assert [p for p in job_pids(done.job_dir) if alive(p)] == []


def test_time_limit_stops_the_job_as_timed_out(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["sleep", "60"], time_limit_s=1))
    done = wait_done(c, job.id, timeout=30)
    assert done.state == "timed_out"
    assert "time limit" in done.reason
    assert done.started_at and done.ended_at
    assert 1 <= (done.ended_at - done.started_at).total_seconds() < 10


def test_retry_then_success_records_every_attempt(shared_daemon: Daemon) -> None:
    script = 'test "$DDPQ_ATTEMPT" -ge 2 || { echo "attempt $DDPQ_ATTEMPT fails"; exit 3; }'
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["sh", "-c", script], retries=2, gpus=1))
    done = wait_done(c, job.id, timeout=60)
    assert done.state == "succeeded"
    assert [(a.number, a.exit_code, a.state) for a in done.attempts] == [
        (1, 3, "failed"),
        (2, 0, "succeeded"),
    ]
    requeued = [e for e in done.events if e.from_state == "running" and e.to_state == "queued"]
    assert len(requeued) == 1 and "retry 1 of 2" in requeued[0].reason
    # The back-off: the second attempt started at least ~2 s after the first ended.
    first_end = done.attempts[0].ended_at
    assert first_end is not None
    assert (done.attempts[1].started_at - first_end).total_seconds() >= 1.9


def test_retries_run_out(shared_daemon: Daemon) -> None:
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=["false"], retries=1))
    done = wait_done(c, job.id, timeout=60)
    assert done.state == "failed" and len(done.attempts) == 2


def _sleep_then(code: int, seconds: float) -> list[str]:
    return ["sh", "-c", f"sleep {seconds}; exit {code}"]


def _until_exists(path: Path) -> list[str]:
    return ["sh", "-c", f"while [ ! -e '{path}' ]; do sleep 0.05; done"]


def test_kill9_restart_readopts_running_and_finalises_ended_jobs(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "3", "--grace", "1s")
    c = d.client()
    ends_ok = c.submit(JobSubmit(command=_sleep_then(0, 1), gpus=1))
    ends_bad = c.submit(JobSubmit(command=_sleep_then(3, 1), gpus=1))
    # Runs until the test lets it end (a file appears), however slow the restart is.
    release = d.home / "let-it-end"
    outlives = c.submit(JobSubmit(command=_until_exists(release), gpus=1))
    queued = [c.submit(JobSubmit(command=["true"], gpus=1)) for _ in range(2)]
    for job in (ends_ok, ends_bad, outlives):
        wait_state(c, job.id, "running")
    assert [c.show(j.id).state for j in queued] == ["queued", "queued"]
    d.kill9()
    # While the daemon is down the first two end; their shims write exit records.
    for job in (ends_ok, ends_bad):
        record = d.home / "jobs" / str(job.id) / "exit.json"
        wait_for(record.exists, timeout=30, what=f"job {job.id}'s exit record")
    d.start()
    c = d.client()
    assert c.show(outlives.id).state == "running"  # re-adopted, not restarted
    assert c.show(ends_ok.id).state == "succeeded"
    bad = c.show(ends_bad.id)
    assert (bad.state, bad.exit_code) == ("failed", 3)
    release.touch()
    done = wait_done(c, outlives.id, timeout=60)
    assert (done.state, done.exit_code, len(done.attempts)) == ("succeeded", 0, 1)
    for job in queued:
        assert wait_done(c, job.id).state == "succeeded"
    assert all(g.status == "free" for g in c.devices().items)
    assert c.devices().ports_leased == {}


def test_a_job_whose_shim_vanished_is_lost_and_its_processes_killed(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "2")
    c = d.client()
    job = c.submit(JobSubmit(command=[sys.executable, str(JOBS / "stubborn.py")], gpus=1))
    running = wait_state(c, job.id, "running")
    assert running.job_dir is not None
    pids = job_pids(running.job_dir)
    c = lose_shim_while_down(d, running)
    done = wait_done(c, job.id)
    assert done.state == "failed" and "lost" in done.reason
    # All of the job's processes, even the one that escaped its session, are killed
    # before the GPU is freed (found by the DDPQ_JOB_DIR every job process inherits).
    assert [p for p in pids if alive(p)] == []
    assert all(g.status == "free" for g in c.devices().items)


def test_a_reused_pid_is_not_mistaken_for_the_job(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1")
    c = d.client()
    job = c.submit(JobSubmit(command=["sleep", "30"], gpus=1))
    running = wait_state(c, job.id, "running")
    d.kill9()
    shim = shim_of(running).pid
    os.killpg(shim, signal.SIGKILL)
    # Pretend the job's PID was reused by an unrelated process: point the record at one.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        wait_for(lambda: not alive(shim), what="the shim to die")
        with sqlite3.connect(d.home / "ddpq.db") as db:
            (ticks,) = db.execute(
                "SELECT substr(handle, instr(handle, ':') + 1) FROM attempts WHERE job_id = ?",
                (job.id,),
            ).fetchone()
            db.execute(
                "UPDATE attempts SET handle = ? WHERE job_id = ?",
                (f"{stranger.pid}:{ticks}", job.id),
            )
        d.start()
        c = d.client()
        done = wait_done(c, job.id)
        assert done.state == "failed" and "lost" in done.reason
        assert stranger.poll() is None  # the stranger was neither adopted nor killed
    finally:
        stranger.kill()
        stranger.wait()


def test_identity_includes_the_start_time() -> None:
    me = procs.identity(os.getpid())
    assert me is not None and procs.is_alive(me)
    assert not procs.is_alive(procs.Identity(me.pid, me.start_ticks + 1))


def test_log_is_capped_keeping_head_and_tail(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("--fake-gpus", "1", "--log-cap", "8192")
    c = d.client()
    script = "for i in $(seq 1 20000); do echo line-$i; done"
    job = c.submit(JobSubmit(command=["sh", "-c", script]))
    done = wait_done(c, job.id)
    assert done.state == "succeeded" and done.job_dir is not None
    text = (Path(done.job_dir) / "output.log").read_text()
    assert len(text) <= 8192 + 200
    assert "line-1\n" in text and text.rstrip().endswith("line-20000")
    assert "[ddpq: log over its cap of 8192 bytes" in text


def test_an_unwritable_job_folder_fails_that_job_and_the_daemon_serves_on(daemon: Daemon) -> None:
    c = daemon.client()
    (daemon.home / "jobs").mkdir(exist_ok=True)
    (daemon.home / "jobs" / "1").write_text("a file where the job's folder should be")
    # ...and no room to move it aside (jobdir.make_folder): the job gets no folder of its own.
    (daemon.home / "jobs" / ".stale").write_text("a file where stale folders go")
    job = c.submit(JobSubmit(command=["true"]))
    assert job.id == 1
    done = wait_done(c, job.id)
    assert done.state == "failed" and "cannot start the job" in done.reason
    assert all(g.status == "free" for g in c.devices().items)
    after = c.submit(JobSubmit(command=["true"]))
    assert wait_done(c, after.id).state == "succeeded"


def test_sigterm_leaves_jobs_running_and_stop_jobs_stops_them(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("--fake-gpus", "1")
    c = d.client()
    job = c.submit(JobSubmit(command=["sleep", "30"]))
    running = wait_state(c, job.id, "running")
    assert d.stop() == 0
    assert procs.is_alive(shim_of(running))
    d.args += ["--stop-jobs"]
    d.start()
    assert d.client().show(job.id).state == "running"
    assert d.stop() == 0
    assert not procs.is_alive(shim_of(running))
    with sqlite3.connect(d.home / "ddpq.db") as db:
        (state,) = db.execute("SELECT state FROM jobs WHERE id = ?", (job.id,)).fetchone()
    assert state == "cancelled"


def test_malformed_or_linked_exit_records_count_as_none(tmp_path: Path) -> None:
    from ddpq.jobdir import read_exit_record

    valid = '{"attempt": "1", "exit_code": 0, "signal": null, "started_at": 1, "ended_at": 2}'
    record = tmp_path / "exit.json"
    for content in [
        "[1]",
        "not json",
        '{"attempt": "1", "exit_code": [1], "started_at": 1, "ended_at": 2}',
        '{"attempt": "1", "exit_code": 0, "started_at": "x", "ended_at": 2}',
        valid.replace('"1"', '"2"'),  # another attempt's
        # numbers that are no finite float: JSON's integers have no bound
        *(valid.replace('"started_at": 1', f'"started_at": {n}') for n in BAD_TIMES),
        *(valid.replace('"ended_at": 2', f'"ended_at": {n}') for n in BAD_TIMES),
        valid.replace('"exit_code": 0', '"exit_code": 1' + "0" * 400),
        valid.replace('"exit_code": 0', '"exit_code": true'),
    ]:
        record.write_text(content)
        assert read_exit_record(tmp_path, 1) is None, content
    record.write_text(valid)
    good = read_exit_record(tmp_path, 1)
    assert good is not None and good.exit_code == 0
    record.unlink()
    (tmp_path / "elsewhere.json").write_text(valid)
    record.symlink_to(tmp_path / "elsewhere.json")
    assert read_exit_record(tmp_path, 1) is None  # a link is never followed


# Seconds no float holds, or not finite: each must read as no record, never raise.
BAD_TIMES = ["1" + "0" * 400, "-1" + "0" * 400, "1e400", "NaN", "-Infinity", "true", '"1"']


@pytest.mark.parametrize(
    "forged",
    [
        "[1]",
        '{"attempt": "1", "exit_code": 0, "started_at": 1%s, "ended_at": 2}' % ("0" * 400),
    ],
)
def test_a_job_forging_its_exit_record_cannot_stall_the_queue(
    shared_daemon: Daemon, forged: str
) -> None:
    forger = (
        "import os, signal, sys, time\n"
        "d = os.environ['DDPQ_JOB_DIR']\n"
        "open(os.path.join(d, 'exit.json'), 'w').write(sys.argv[1])\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    c = shared_daemon.client()
    bad = c.submit(JobSubmit(command=[sys.executable, "-c", forger, forged], gpus=4))
    done = wait_done(c, bad.id)
    assert done.state == "failed" and "lost" in done.reason
    after = c.submit(JobSubmit(command=["true"], gpus=4))
    assert wait_done(c, after.id).state == "succeeded"


def test_a_jobs_marker_is_looked_for_in_a_bounded_part_of_each_environment(
    tmp_path: Path,
) -> None:
    """A job may start processes with megabytes of environment; the search reads at most
    MARKER_SEARCH_BYTES of each (one that hides its marker past them is as one run with
    `env -i`: the session fallback's known limit)."""
    name, value = "DDPQ_JOB_DIR", str(tmp_path / "job")
    # Each variable at most 128 KiB (the kernel's bound on one string), 3 times the bound.
    padding = {
        f"PAD{i}": "x" * (100 * 1024) for i in range(3 * procs.MARKER_SEARCH_BYTES // 102400)
    }
    path = {"PATH": "/usr/bin:/bin"}
    near = subprocess.Popen(["sleep", "300"], env={name: value, **path, **padding})
    far = subprocess.Popen(["sleep", "300"], env={**padding, **path, name: value})
    try:
        found = procs.marked_with(f"{name}={value}".encode(), 0)
        assert near.pid in found and far.pid not in found
    finally:
        for p in (near, far):
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another account")
def test_a_shim_is_found_by_its_command_line_only_as_its_folders_account(tmp_path: Path) -> None:
    """After a worker died before storing a shim's handle, the shim is found by its
    command line, which anyone can write: another account's process naming this job's
    folder is never taken for its shim."""
    folder = tmp_path / "jobs" / "7"
    folder.mkdir(parents=True)
    # bash, not this Python: nobody may not reach a venv under root's home. bash stays
    # (two commands) with the shim's words as its arguments.
    fake = ["/bin/bash", "-c", "sleep 60; exit", "shim.py", "--job-dir", str(folder), "--"]
    stranger = subprocess.Popen(fake, user="nobody", cwd="/", start_new_session=True)
    try:
        wait_for(lambda: b"shim.py" in Path(f"/proc/{stranger.pid}/cmdline").read_bytes())
        assert procs.find_shim(str(folder)) is None
        os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)  # now its own folder's
        assert procs.find_shim(str(folder)) == stranger.pid
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()
