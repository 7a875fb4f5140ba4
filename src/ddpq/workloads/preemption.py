"""The workload's side of preemption: what the job's environment says, and the signal flags.

Standard library only, so that ``resnet18`` can catch the preemption signal before it spends
~3 s importing torch (a rank under torchrun inherits the signal *ignored*, so one sent in those
seconds would otherwise be lost). The contract (docs/preemption.md):

* ``DDPQ_PREEMPT_SIGNAL``: the signal ddpq preempts with, by name (``USR1``, ``USR2``,
  ``INT``, ``HUP``, ``TERM``; a ``SIG`` prefix and any case are accepted). Unset or empty:
  the job is not preemptible and no handler is installed.
* ``DDPQ_PREEMPT_GRACE``: seconds between that signal and SIGTERM (a number); bounds how
  often the ranks meet, so that a checkpoint is agreed on well inside it.
* ``DDPQ_REQUEUE_EXIT``: the exit status meaning "checkpointed, requeue me" (default 75,
  EX_TEMPFAIL).
* ``DDPQ_ATTEMPT``: which attempt this is (1, 2, ...), recorded in checkpoints and metrics.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

REQUEUE_EXIT = 75  # EX_TEMPFAIL from sysexits.h: "temporary failure, try again"
SIGNALS = {
    "USR1": signal.SIGUSR1,
    "USR2": signal.SIGUSR2,
    "INT": signal.SIGINT,
    "HUP": signal.SIGHUP,
    "TERM": signal.SIGTERM,
}


class PreemptEnvError(ValueError):
    """A DDPQ_PREEMPT_* / DDPQ_REQUEUE_EXIT value that cannot be used (one line)."""


@dataclass(frozen=True)
class PreemptConfig:
    signal: signal.Signals | None  # None: not preemptible
    grace_s: float | None
    requeue_exit: int
    attempt: int | None

    @property
    def name(self) -> str:
        return self.signal.name if self.signal is not None else "none"


def parse_signal(text: str) -> signal.Signals:
    name = text.strip().upper()
    name = name.removeprefix("SIG")
    if name not in SIGNALS:
        known = ", ".join(SIGNALS)
        raise PreemptEnvError(f"DDPQ_PREEMPT_SIGNAL={text!r}: not one of {known}")
    return SIGNALS[name]


def from_environ(env: Mapping[str, str] = os.environ) -> PreemptConfig:
    """The preemption settings in ``env``; PreemptEnvError for a value that makes no sense
    (better a job that fails at once, saying why, than one that cannot be preempted)."""
    raw_signal = env.get("DDPQ_PREEMPT_SIGNAL", "").strip()
    sig = parse_signal(raw_signal) if raw_signal else None
    grace: float | None = None
    raw_grace = env.get("DDPQ_PREEMPT_GRACE", "").strip()
    if raw_grace:
        try:
            grace = float(raw_grace)
        except ValueError:
            grace = -1.0
        if not grace >= 0.0 or grace == float("inf"):
            raise PreemptEnvError(f"DDPQ_PREEMPT_GRACE={raw_grace!r}: not a number of seconds")
    raw_exit = env.get("DDPQ_REQUEUE_EXIT", "").strip()
    requeue = REQUEUE_EXIT
    if raw_exit:
        if not raw_exit.isdigit() or not 1 <= int(raw_exit) <= 255:
            raise PreemptEnvError(f"DDPQ_REQUEUE_EXIT={raw_exit!r}: not an exit status 1..255")
        requeue = int(raw_exit)
    raw_attempt = env.get("DDPQ_ATTEMPT", "").strip()
    attempt = int(raw_attempt) if raw_attempt.isdigit() else None
    return PreemptConfig(sig, grace, requeue, attempt)


# --------------------------------------------------------------------------- before torch

_early: list[int] = []  # preemption signals that came before the workload's own handler


def _note_early(signum: int, frame: FrameType | None) -> None:
    _early.append(signum)


def catch_early(env: Mapping[str, str] = os.environ) -> None:
    """Remember a preemption signal from now on, until the workload installs its handler. A
    bad value is left for the workload to report (it prints one line and exits 2)."""
    try:
        sig = from_environ(env).signal
    except PreemptEnvError:
        return
    if sig is not None:
        signal.signal(sig, _note_early)


def came_early() -> bool:
    return bool(_early)
