"""What becomes of a job when one of its attempts ends: requeue, retry or finish (pure).

The worker gathers how an attempt ended (the executor's exit record) and what the store
knows of the job; this decides the rest. One place, so the local executor, a Slurm
executor and the in-process tests all get the same answer for the same facts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddpq.core.rules import (
    ExitRecord,
    StopRequest,
    describe_exit,
    outcome_of,
    retry_backoff_s,
    should_retry,
)
from ddpq.core.states import TERMINAL, JobState
from ddpq.core.units import size_for_people

INTERRUPTED = "launch interrupted before the job started"
# The exit status of a job that saved its state when asked to (EX_TEMPFAIL): "requeue me".
REQUEUE_EXIT = 75
# Interrupted launches requeued for free, at most: the shim's "nothing ran" record is written
# into a folder the job owns, so a job could forge one after running; this bounds the reruns.
MAX_RELAUNCHES = 3
# A launch the host had no room for (the job folders' disk was full): nothing ran and
# nothing of the job is to blame, so it waits this long and tries again, as often as it
# takes; so does every other launch (``worker.unlaunched``). A full disk is not the job's
# to fail for: another user's files may be what filled it.
PUT_OFF_S = 30.0
# A sharing job that runs out of GPU memory is requeued on whole GPUs this often, at most
# (its log says so; a job could print those words itself: this bounds what that gains it).
MAX_OOM_REQUEUES = 1


@dataclass(frozen=True)
class JobFacts:
    """What the decision needs to know of the job whose attempt ended."""

    attempt: int
    max_retries: int
    port_retries: int  # requeues so far because its rendezvous port was taken
    stop: StopRequest | None  # why ddpq asked it to stop, if it did
    relaunches: int = 0  # requeues so far because a launch was cut short
    stop_sent_at: float | None = None  # when the stop (or preemption) was sent
    stop_reason: str | None = None  # who or what asked for it ("preempted by alice")
    # Sharing: what the attempt reserved on each GPU (None: it had its GPUs whole), and
    # how often the job was requeued on whole GPUs after running out of memory (once).
    shared_mem_bytes: int | None = None
    oom_requeues: int = 0
    retries_used: int = 0  # failures retried so far (free requeues are not)


@dataclass(frozen=True)
class Disposition:
    attempt_state: JobState  # how this attempt ended (the attempts row)
    attempt_reason: str
    job_state: JobState  # QUEUED to run again, else the job's final state
    job_reason: str
    not_before: float | None = None  # a retry waits out its back-off until then
    port_requeue: bool = False  # requeued on another port: counts against max_port_retries
    relaunch: bool = False  # requeued after an interrupted launch: counts against MAX_RELAUNCHES
    preempted: bool = False  # requeued after a preemption: no retry used, counted apart
    oom_requeue: bool = False  # requeued on whole GPUs after running out of memory sharing
    retry: bool = False  # requeued after a failure: uses one of max_retries

    @property
    def finished(self) -> bool:
        return self.job_state in TERMINAL


def after_exit(
    record: ExitRecord,
    job: JobFacts,
    *,
    grace_s: float,
    max_port_retries: int,
    now: float,
    port_clash: Callable[[], bool] = lambda: False,
    preempt_grace_s: float = 0.0,
    checkpointed: bool = False,
    out_of_memory: Callable[[], bool] = lambda: False,
) -> Disposition:
    """Decide what follows an attempt that ended as ``record`` says.

    ``port_clash`` tells whether the attempt failed because its leased port was taken;
    ``out_of_memory``, whether it failed because CUDA ran out of memory. Each is asked
    only where its answer matters (a plain failure with a requeue of that kind left), since
    answering means reading the job's log.
    """
    if not record.launched:
        return after_interrupted_launch(job.stop, job.relaunches)
    if job.stop is StopRequest.PREEMPT and record.error is None:
        preempted = after_preemption(record, job, preempt_grace_s, checkpointed)
        if preempted is not None:
            return preempted
    outcome = outcome_of(record, job.stop, grace_s, job.stop_reason)
    if job.stop is StopRequest.QUOTA:
        # No retry nor requeue: the next attempt would find the same folder over its limit.
        return Disposition(outcome.state, outcome.reason, outcome.state, outcome.reason)
    failed = outcome.state is JobState.FAILED
    if failed and job.port_retries < max_port_retries and port_clash():
        tries = job.port_retries + 1
        return Disposition(
            outcome.state,
            outcome.reason,
            JobState.QUEUED,
            f"rendezvous port was taken (EADDRINUSE); requeued on another port "
            f"(try {tries} of {max_port_retries})",
            port_requeue=True,
        )
    if (
        failed
        and job.shared_mem_bytes is not None
        and job.oom_requeues < MAX_OOM_REQUEUES
        and out_of_memory()
    ):
        return Disposition(
            outcome.state,
            f"{outcome.reason}; CUDA ran out of memory on a shared GPU",
            JobState.QUEUED,
            f"ran out of GPU memory (CUDA out of memory) sharing a GPU with "
            f"{size_for_people(job.shared_mem_bytes)} reserved; requeued once on a whole GPU",
            oom_requeue=True,
        )
    if should_retry(outcome.state, job.retries_used, job.max_retries):
        retry = job.retries_used + 1
        delay = retry_backoff_s(retry)
        return Disposition(
            outcome.state,
            outcome.reason,
            JobState.QUEUED,
            f"attempt {job.attempt} failed ({outcome.reason}); retry "
            f"{retry} of {job.max_retries} in {delay:g}s",
            not_before=now + delay,
            retry=True,
        )
    return Disposition(outcome.state, outcome.reason, outcome.state, outcome.reason)


def after_preemption(
    record: ExitRecord, job: JobFacts, preempt_grace_s: float, checkpointed: bool = False
) -> Disposition | None:
    """A job asked to checkpoint and go: back to the queue, keeping its place (its
    submission time), no retry used; None if it finished meanwhile (exit 0: a success).

    ``checkpointed``: the job's last progress record says it saved (``"preempted": true``).
    Under torchrun that is the only sign: torchrun exits 1 when its ranks exit 75."""
    if record.signal is None and record.exit_code == 0:
        return None
    why = job.stop_reason or "preempted"
    late = job.stop_sent_at is not None and record.ended_at - job.stop_sent_at > preempt_grace_s
    if (record.signal is None and record.exit_code == REQUEUE_EXIT) or checkpointed:
        how = "checkpointed"
    elif late:
        how = f"did not exit within its {preempt_grace_s:g}s to checkpoint, so it was stopped"
    else:
        how = f"ended without saying it checkpointed ({describe_exit(record)})"
    return Disposition(
        JobState.PREEMPTED,
        f"{why}: {how}",
        JobState.QUEUED,
        f"{why}: {how}; back in the queue",
        preempted=True,
    )


def after_interrupted_launch(stop: StopRequest | None, relaunches: int) -> Disposition:
    """A launch cut short before the job ran (the worker went away): not a failure and no
    retry used, a launch to do again; unless the job was cancelled meanwhile (a restart
    never undoes a cancel), or this happened MAX_RELAUNCHES times already."""
    if stop is StopRequest.CANCEL:
        why = "cancelled before it started"
        return Disposition(JobState.CANCELLED, why, JobState.CANCELLED, why)
    if relaunches >= MAX_RELAUNCHES:
        why = f"{INTERRUPTED}, {relaunches + 1} times"
        return Disposition(JobState.FAILED, why, JobState.FAILED, why)
    return Disposition(JobState.QUEUED, INTERRUPTED, JobState.QUEUED, INTERRUPTED, relaunch=True)


def after_put_off_launch(stop: StopRequest | None, reason: str, now: float) -> Disposition:
    """A launch the host had no room for: back in the queue for PUT_OFF_S, no retry nor
    relaunch used; unless the job was cancelled meanwhile."""
    if stop is StopRequest.CANCEL:
        return after_interrupted_launch(stop, 0)
    why = f"{reason}; tried again in {PUT_OFF_S:g}s"
    return Disposition(JobState.QUEUED, why, JobState.QUEUED, why, not_before=now + PUT_OFF_S)


# The first line ddpq writes into a job's log at each attempt. The port it names is how
# ``rendezvous_port_clash`` tells this attempt's output from earlier ones'.
ATTEMPT_HEADER = "[ddpq] attempt started "
PORT_CLASH_WORDS = ("eaddrinuse", "address already in use")
_HEADER_PORT = re.compile(r"port (\d+)$")


def lease_text(gpus: Sequence[int], port: int | None) -> str:
    """'GPUs [0, 1], port 29601': the words of the log header and of the lease event."""
    text = f"GPUs {list(gpus)}"
    return text if port is None else f"{text}, port {port}"


def attempt_header(when: str, gpus: Sequence[int], port: int | None) -> str:
    return f"{ATTEMPT_HEADER}{when}: {lease_text(gpus, port)}\n"


def rendezvous_port_clash(log_tail: str) -> bool:
    """Did this attempt fail because its leased port was taken (EADDRINUSE)?

    Only the output of the latest attempt counts (after its "[ddpq] attempt started
    ... port N" line), and only a line that names that port: an unrelated "address
    already in use" (a TensorBoard, say) is a plain failure, not a reason to requeue.
    """
    start = log_tail.rfind(ATTEMPT_HEADER)
    if start < 0:
        return False
    header, _, output = log_tail[start:].partition("\n")
    match = _HEADER_PORT.search(header.strip())
    if match is None:
        return False
    port = match.group(1)
    return any(
        port in line and any(word in line.lower() for word in PORT_CLASH_WORDS)
        for line in output.splitlines()
    )


# What CUDA (and the frameworks above it) print when a GPU has no memory left to give.
OUT_OF_MEMORY_WORDS = (
    "cuda out of memory",  # PyTorch: torch.OutOfMemoryError
    "cuda error: out of memory",  # PyTorch, the runtime's cudaErrorMemoryAllocation
    "cuda_error_out_of_memory",  # the driver API (JAX, CuPy, Numba)
    "cublas_status_alloc_failed",
)


def cuda_out_of_memory(log_tail: str) -> bool:
    """Did this attempt die of CUDA out-of-memory? Only the latest attempt's output counts
    (after its "[ddpq] attempt started" line)."""
    start = log_tail.rfind(ATTEMPT_HEADER)
    if start < 0:
        return False
    output = log_tail[start:].lower()
    return any(word in output for word in OUT_OF_MEMORY_WORDS)
