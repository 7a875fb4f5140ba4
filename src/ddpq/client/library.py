"""ddpq from Python, for notebooks and scripts: ``from ddpq import Client``.

The same API and the same transport as the ``ddpq`` command line (``JsonApi`` over
``client.transport``), and the same daemon: ``url`` and ``token`` as given, else
``$DDPQ_URL``/``$DDPQ_TOKEN``, else the daemon's Unix socket on this machine (where the
daemon knows you by your account), else a saved ``ddpq login``. Answers are the API's wire
schemas (pydantic models: ``job.state``, ``job.exit_code``); every refusal is a
``DdpqError`` whose ``status`` is the HTTP status (None when the daemon cannot be
reached: ``Unreachable``) and ``detail`` the daemon's reason.

    from ddpq import Client

    with Client() as q:
        job = q.submit(["python", "train.py", "--lr", "0.1"], gpus=2, name="lr-0.1")
        done = q.wait(job.id)
        for line in q.logs(job.id):
            print(line)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddpq.client.api import DdpqError, JsonApi
from ddpq.client.history_query import Bound

if TYPE_CHECKING:
    from ddpq.schemas import CancelResult, HistoryRow, JobDetail, JobOut, SweepOut

# How long ``wait`` pauses between questions: FIRST_POLL_S, then half as long again each
# time, up to LAST_POLL_S (a long run is asked about every 5 s, a quick one soon).
FIRST_POLL_S = 0.2
LAST_POLL_S = 5.0


class Client:
    """A connection to a ddpq daemon. Close it (or use ``with``) when done."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0
    ) -> None:
        from ddpq.client.credentials import connection

        chosen, chosen_token = connection(url, token)
        self._api = JsonApi(chosen, chosen_token, timeout)

    @property
    def url(self) -> str:
        """The daemon this client speaks to (``unix:/path`` for its socket)."""
        return self._api.url

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(
        self,
        command: Sequence[str] | None = None,
        *,
        gpus: int = 0,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        export: str = "ALL",
        time_limit: float | str | None = None,
        **fields: Any,
    ) -> JobOut:
        """Queue a job, as `ddpq submit` does: ``command`` (a list: no shell) run in
        ``cwd`` (default: this process's working directory) with this process's
        environment (``export``: ALL, NONE or NAME,...) and ``env`` over it.
        ``time_limit``: seconds, or a duration ("2h"). Any other field of the API's
        submission by its name (``workload``, ``args``, ``priority``, ``retries``,
        ``after``, ``hold``, ``torchrun``, ``gpu_mem``, ``cpus``, ``mem``, ...)."""
        from ddpq.schemas import JobOut

        body = self._job_body(command, gpus, name, cwd, env, export, time_limit, fields)
        return JobOut.model_validate(self._api.submit(body))

    def sweep(
        self,
        command: Sequence[str] | None = None,
        *,
        params: Mapping[str, Sequence[str]] | None = None,
        array: str | None = None,
        max_running: int | None = None,
        gpus: int = 0,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        export: str = "ALL",
        time_limit: float | str | None = None,
        **fields: Any,
    ) -> SweepOut:
        """Queue a sweep, as `ddpq submit --sweep`/``--array`` does: one job for each
        combination of ``params`` (``{"lr": ["0.1", "0.05"]}``: each ``{lr}`` in the
        command becomes the value; a built-in ``workload`` gets ``--lr VALUE``), or each
        index of ``array`` ("0-9", "1,3,5", "0-99%10"; ``{index}`` in the command). The
        template takes what ``submit`` takes."""
        from ddpq.schemas import SweepOut

        template = self._job_body(command, gpus, name, cwd, env, export, time_limit, fields)
        body: dict[str, Any] = {"template": template}
        if params is not None:
            body["params"] = {key: list(values) for key, values in params.items()}
        if array is not None:
            body["array"] = array
        if max_running is not None:
            body["max_running"] = max_running
        return SweepOut.model_validate(self._api.submit_sweep(body))

    def show(self, job_id: int) -> JobDetail:
        """Everything about one job: state and reason, attempts, events, leases."""
        from ddpq.schemas import JobDetail

        return JobDetail.model_validate(self._api.show(job_id))

    def wait(self, job_id: int, timeout: float | None = None) -> JobDetail:
        """The job once it has finished (succeeded, failed, cancelled or timed out),
        asking after 0.2 s at first, each pause half as long again as the last (at most 5 s).
        ``TimeoutError`` if it has not finished within ``timeout`` seconds."""
        from ddpq.core.states import TERMINAL

        deadline = None if timeout is None else time.monotonic() + timeout
        pause = FIRST_POLL_S
        while True:
            job = self.show(job_id)
            if job.state in TERMINAL:
                return job
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} is still {job.state.value}")
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 1.5, LAST_POLL_S)

    def logs(self, job_id: int, follow: bool = False) -> Iterator[str]:
        """The job's output (stdout and stderr together), line by line, without the line
        ends; ``follow``: as it is written, until the job ends. Bytes that are not UTF-8
        are shown as U+FFFD."""
        pieces = self._api.follow_log(job_id) if follow else self._log_pieces(job_id)
        partial = b""
        for piece in pieces:
            lines = (partial + piece).split(b"\n")
            partial = lines.pop()
            for line in lines:
                yield line.decode(errors="replace")
        if partial:
            yield partial.decode(errors="replace")

    def _log_pieces(self, job_id: int) -> Iterator[bytes]:
        offset = 0
        while True:
            data, offset = self._api.log(job_id, offset)
            if not data:
                return
            yield data

    def cancel(self, job_id: int) -> CancelResult:
        """Cancel a job: a queued one ends at once, a running one gets SIGTERM, then
        SIGKILL after the daemon's grace."""
        from ddpq.schemas import CancelResult

        return CancelResult.model_validate(self._api.cancel(job_id))

    def history(
        self,
        *,
        since: Bound | None = None,
        until: Bound | None = None,
        user: str | None = None,
        everyone: bool = False,
        states: Sequence[str] = (),
        name: str | None = None,
        limit: int = 100,
    ) -> list[HistoryRow]:
        """Finished jobs, oldest first: the newest ``limit`` (0: every one) that ended in
        [since, until), yours unless ``user`` or ``everyone``. A bound is a datetime, UNIX
        seconds, a duration back from now ("2d") or a date ("2026-12-01"); ``name`` may
        be a glob ("lr-*"). ``elapsed_s`` is the time it ran, its attempts summed.
        ``ValueError`` for a bound or a state that cannot be."""
        from ddpq.client import history_query as hq
        from ddpq.schemas import HistoryRow

        if limit < 0:
            raise ValueError(f"limit: {limit} is not 0 or more")
        wanted = hq.finished_states(list(states), "states")
        params = hq.query(
            since, until, user, everyone, wanted, name, time.time(), ("since", "until")
        )
        rows, _ = hq.newest(self._api, params, limit)
        return [HistoryRow.model_validate(row) for row in reversed(rows)]

    def _job_body(
        self,
        command: Sequence[str] | None,
        gpus: int,
        name: str | None,
        cwd: str | os.PathLike[str] | None,
        env: Mapping[str, str] | None,
        export: str,
        time_limit: float | str | None,
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        """A submission's body, as `ddpq submit` makes it."""
        from ddpq.client import submission

        if isinstance(command, str):
            raise TypeError("command: a list of words, not a string (ddpq runs no shell)")
        try:
            exported, _ = submission.exported_env(export, os.environ)
        except submission.BadOption as exc:
            raise ValueError(str(exc)) from None
        body: dict[str, Any] = {
            "gpus": gpus,
            "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
            "exported_env": exported,
            **fields,
        }
        if command is not None:
            body["command"] = list(command)
        if name is not None:
            body["name"] = name
        if env:
            body["env"] = dict(env)
        if time_limit is not None:
            body["time_limit_s"] = _seconds(time_limit)
        return body


def _seconds(value: float | str) -> float:
    from ddpq.core.units import parse_duration

    if isinstance(value, str):
        return parse_duration(value)
    return float(value)


__all__ = ["Client", "DdpqError"]
