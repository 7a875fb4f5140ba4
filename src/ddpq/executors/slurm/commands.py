"""Slurm's commands as the Slurm executor calls them: one process per call, with a deadline.

Every call that concerns many jobs takes them all at once (``squeue --jobs=1,2,3``,
``scontrol release 1,2,3``, ``scancel 1 2 3``), so a pass of the worker costs one
``squeue`` whatever the number of jobs. The commands honour ``SLURM_CONF`` and the rest of
Slurm's environment, as they do for users. ``Slurm`` is what the executor needs of them, so
tests can put a double in their place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from ddpq.executors.accounts import Account
from ddpq.executors.slurm import states
from ddpq.executors.slurm.states import SlurmJob

# What one command may take: slurmctld answers in milliseconds, but a busy controller
# (thousands of jobs, a backfill pass) can keep a client waiting for seconds.
TIMEOUT_S = 30.0
# A signal to a running job's batch step: the worker waits for it, and scancel retries
# for a minute what Slurm cannot do "now", so it is given less (a cancel follows).
SIGNAL_TIMEOUT_S = 5.0
# Job ids per squeue/sacct call: a command line stays short, even with thousands of jobs.
CHUNK = 500
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
_NO_SUCH_JOB = "Invalid job id specified"


class SlurmError(Exception):
    """A Slurm command failed; the message is one line, in Slurm's words where it gave any."""


class SlurmUnavailable(SlurmError):
    """Slurm cannot be used from this host (a command is missing, the controller does not
    answer): the daemon does not start."""


class Slurm(Protocol):
    """What the Slurm executor asks of Slurm."""

    def submit_held(self, script: str, env: Mapping[str, str], account: Account | None) -> str:
        """Submit ``script`` held, as ``account`` (None: as this process); its job id."""
        ...

    def release(self, job_ids: Sequence[str]) -> None: ...

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None) -> None:
        """Cancel the jobs, or with ``signal`` only send that to each one's batch step."""
        ...

    def queue(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        """squeue's view of the jobs it still knows (ended ones included); raises
        SlurmError when it cannot tell (the controller is down)."""
        ...

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SlurmJob] | None:
        """sacct's view of the jobs; None where the cluster keeps no accounting."""
        ...

    def find(self, name: str, comment: str) -> list[str]:
        """The ids of the jobs Slurm holds with this name and comment."""
        ...


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class SlurmCommands:
    """The real commands, found on PATH once, at start."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        found = {name: shutil.which(name) for name in (*COMMANDS, "sacct")}
        missing = [name for name in COMMANDS if found[name] is None]
        if missing:
            raise SlurmUnavailable(
                f"--executor slurm needs Slurm's commands on PATH, and {', '.join(missing)} "
                "cannot be found; run ddpq on a host that can sbatch (a login node)"
            )
        self.paths = {name: path for name, path in found.items() if path is not None}

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        account: Account | None = None,
        timeout_s: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command (``argv[0]`` by name), as ``account`` if given."""
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        path = self.paths.get(argv[0])
        if path is None:
            raise SlurmError(f"{argv[0]} is not installed here")
        switch = account is not None and account.uid != os.geteuid()
        try:
            return subprocess.run(
                [path, *argv[1:]],
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                errors="replace",
                env=dict(env) if env is not None else None,
                cwd="/",
                timeout=timeout,
                user=account.uid if switch and account else None,
                group=account.gid if switch and account else None,
                extra_groups=os.getgrouplist(account.name, account.gid)
                if switch and account
                else None,
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer within {timeout:g}s") from None
        except OSError as exc:
            raise SlurmError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None

    def _checked(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        account: Account | None = None,
        timeout_s: float | None = None,
    ) -> str:
        done = self.run(argv, stdin=stdin, env=env, account=account, timeout_s=timeout_s)
        if done.returncode != 0:
            why = _last_line(done.stderr) or _last_line(done.stdout) or f"exit {done.returncode}"
            raise SlurmError(why if why.startswith(argv[0]) else f"{argv[0]}: {why}")
        return done.stdout

    def submit_held(self, script: str, env: Mapping[str, str], account: Account | None) -> str:
        # The script on standard input: what Slurm runs is what ddpq rendered, whatever
        # becomes of the copy in the job's folder meanwhile.
        argv = ["sbatch", "--hold", "--parsable"]
        out = self._checked(argv, stdin=script, env=env, account=account)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def release(self, job_ids: Sequence[str]) -> None:
        for chunk in _chunks(job_ids):
            self._checked(["scontrol", "release", ",".join(chunk)])

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None) -> None:
        flags = ["--batch", f"--signal={signal}"] if signal else []
        timeout = SIGNAL_TIMEOUT_S if signal else None
        for chunk in _chunks(job_ids):
            self._checked(["scancel", *flags, *chunk], timeout_s=timeout)

    def queue(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        jobs: dict[str, SlurmJob] = {}
        for chunk in _chunks(job_ids):
            argv = ["squeue", "--noheader", "--states=all", f"--format={states.QUEUE_FORMAT}"]
            done = self.run([*argv, f"--jobs={','.join(chunk)}"])
            if done.returncode != 0:
                # squeue refuses a list none of which it knows (one id, long purged) with
                # this error: none of them is in the queue, which is an answer.
                if _NO_SUCH_JOB in done.stderr:
                    continue
                raise SlurmError(f"squeue: {_last_line(done.stderr) or done.returncode}")
            jobs.update(states.parse_queue(done.stdout))
        return jobs

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SlurmJob] | None:
        if "sacct" not in self.paths:
            return None
        jobs: dict[str, SlurmJob] = {}
        for chunk in _chunks(job_ids):
            argv = ["sacct", "--noheader", "--parsable2", "--allocations"]
            argv += [f"--format={states.ACCOUNTING_FORMAT}", f"--jobs={','.join(chunk)}"]
            done = self.run(argv)
            if done.returncode != 0:
                why = _last_line(done.stderr) + _last_line(done.stdout)
                if "accounting storage is disabled" in why.lower():
                    return None
                raise SlurmError(f"sacct: {why or done.returncode}")
            jobs.update(states.parse_accounting(done.stdout))
        return jobs

    def find(self, name: str, comment: str) -> list[str]:
        argv = ["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i|%k"]
        done = self.run(argv)
        if done.returncode != 0:
            raise SlurmError(f"squeue: {_last_line(done.stderr) or done.returncode}")
        found = []
        for line in done.stdout.splitlines():
            job_id, _, theirs = line.strip().partition("|")
            if job_id.isdigit() and theirs == comment:
                found.append(job_id)
        return found

    def partition_gpus(self, partition: str | None) -> int:
        """Every GPU of the partition's nodes (the default partition's without one)."""
        try:
            out = self._checked(["sinfo", "--Node", "--noheader", "--format=%N|%P|%G"])
        except SlurmError as exc:
            raise SlurmUnavailable(f"cannot count Slurm's GPUs ({exc})") from None
        return states.partition_gpus(out, partition)

    def test_only(self, script: str, env: Mapping[str, str] | None = None) -> str:
        """``sbatch --test-only``: Slurm's word on whether (and where) it would run the script."""
        done = self.run(["sbatch", "--test-only"], stdin=script, env=env)
        if done.returncode != 0:
            raise SlurmError(_last_line(done.stderr) or f"sbatch --test-only: {done.returncode}")
        return _last_line(done.stderr) or _last_line(done.stdout)
