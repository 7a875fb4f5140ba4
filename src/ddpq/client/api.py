"""The REST API from Python, in two layers.

``JsonApi`` speaks HTTP with the standard library (``client.transport``) and returns the
JSON it is answered (dicts and lists): the CLI's commands use it, so that `ddpq submit` and
`ddpq ls` import neither httpx nor pydantic (~200 ms between them, on every command).
``DdpqClient`` is the same API with the shared wire schemas' pydantic models, for programs
and tests; the models are imported by the methods that return them.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterable, Iterator, Mapping

from ddpq.client.credentials import DEFAULT_URL as DEFAULT_URL
from ddpq.client.credentials import check_token as check_token
from ddpq.client.credentials import choose_url as choose_url
from ddpq.client.credentials import find_socket as find_socket
from ddpq.client.credentials import token_file as token_file
from ddpq.client.credentials import uses_socket as uses_socket
from ddpq.client.errors import DdpqError as DdpqError
from ddpq.client.errors import Unreachable as Unreachable
from ddpq.client.errors import protocol_error
from ddpq.client.transport import Response, Transport
from ddpq.core.names import NAME_RE

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ddpq.schemas import (
        CancelResult,
        DeviceList,
        JobDetail,
        JobEnvOut,
        JobList,
        JobOut,
        JobSubmit,
        UsageReport,
    )

Data = dict[str, "Any"]


def local_user() -> str:
    """``getpass.getuser()``, as it reads it ($LOGNAME, $USER, $LNAME, $USERNAME, else the
    password entry), without importing getpass (its termios, contextlib and warnings:
    ~1 ms of every `ddpq submit` and `ddpq ls`)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    import pwd

    return pwd.getpwuid(os.getuid())[0]


class JsonApi:
    """The daemon's REST API as plain JSON data. Errors are ``DdpqError``s: 4 for no such
    job, 5 for a missing token or someone else's job, 3 when the daemon cannot be reached,
    1 for any other refusal (``status`` is the HTTP status)."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = choose_url(url)
        if token and url is None and not os.environ.get("DDPQ_URL") and not uses_socket(self.url):
            # DEFAULT_URL, where ddpq looks when it finds no socket: anyone's to listen on.
            raise DdpqError(
                f"a token is sent only to the daemon you name, not to {self.url}", exit_code=2
            )
        self.headers: dict[str, str] = {}
        # On the Unix socket the daemon knows who calls: no name, no token to send.
        if not uses_socket(self.url):
            # Without --auth the daemon takes this name on trust (and refuses one that is
            # not a valid ddpq name); a local account such as `_svc` then submits as
            # "anonymous".
            if NAME_RE.match(me := local_user()):
                self.headers["X-Ddpq-User"] = me
            if token:
                self.headers["Authorization"] = f"Bearer {check_token(token)}"
        self._http = Transport(self.url, self.headers, timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JsonApi:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        """The answer's JSON object (every route's answer is one)."""
        data = self._http.request(method, path, **kw).json()
        if not isinstance(data, dict):
            raise protocol_error(self.url, f"JSON {type(data).__name__} where an object belongs")
        return data

    def submit(self, job: Mapping[str, Any]) -> Data:
        """Queue a job (``JobSubmit``'s fields); the daemon validates it (422: ``detail``
        names each field that is wrong)."""
        return self._created(self._json("POST", "/v1/jobs", body=dict(job)))

    def list(
        self,
        states: builtins.list[str] | None = None,
        user: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> Data:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if states:
            params["state"] = states
        if user:
            params["user"] = user
        data: Data = self._json("GET", "/v1/jobs", params=params)
        return data

    def queue(
        self,
        states: builtins.list[str] | None = None,
        user: str | None = None,
        mine: bool = False,
        limit: int = 100,
        expand: bool = False,
    ) -> Data:
        """One screen of the queue in one request (``QueueView``): at most ``limit`` jobs
        and sweeps, sweeps folded unless ``expand``, the rest counted by owner and state."""
        params: dict[str, Any] = {"limit": limit}
        if states:
            params["state"] = states
        if user:
            params["user"] = user
        if mine:
            params["mine"] = "true"
        if expand:
            params["expand"] = "true"
        data: Data = self._json("GET", "/v1/queue", params=params)
        return data

    def list_all(
        self, states: builtins.list[str] | None = None, user: str | None = None
    ) -> builtins.list[Data]:
        """Every matching job, oldest first, however many pages that takes."""
        items: builtins.list[Data] = []
        while True:
            page = self.list(states=states, user=user, limit=1000, offset=len(items))
            items += page["items"]
            if not page["items"] or len(items) >= page["total"]:
                return items

    def show(self, job_id: int) -> Data:
        data: Data = self._json("GET", f"/v1/jobs/{job_id}")
        return data

    def env(self, job_id: int) -> Data:
        """The variables the job was submitted with (its owner's and admins' to read)."""
        data: Data = self._json("GET", f"/v1/jobs/{job_id}/env")
        return data

    def port_use(self, job_id: int) -> Data:
        """Who listens on the job's leased port: the job, someone else, or nobody yet."""
        data: Data = self._json("GET", f"/v1/jobs/{job_id}/port")
        return data

    def cancel(self, job_id: int) -> Data:
        data: Data = self._json("POST", f"/v1/jobs/{job_id}/cancel")
        return data

    def hold(self, job_id: int, hold: bool = True) -> Data:
        verb = "hold" if hold else "release"
        data: Data = self._json("POST", f"/v1/jobs/{job_id}/{verb}")
        return data

    def preempt(self, job_id: int) -> Data:
        data: Data = self._json("POST", f"/v1/jobs/{job_id}/preempt")
        return data

    def update(self, job_id: int, changes: Mapping[str, Any]) -> Data:
        """Change a job (``JobChanges``' fields); the job as it is now."""
        data: Data = self._json("PATCH", f"/v1/jobs/{job_id}", body=dict(changes))
        return data

    def restart(self, job_id: int, changes: Mapping[str, Any]) -> Data:
        """Queue a new job with ``job_id``'s spec and ``changes``; the new job."""
        return self._created(self._json("POST", f"/v1/jobs/{job_id}/restart", body=dict(changes)))

    def submit_sweep(self, sweep: Mapping[str, Any]) -> Data:
        """Queue a sweep (``SweepSubmit``'s fields: a template and params or an array)."""
        return self._created(self._json("POST", "/v1/sweeps", body=dict(sweep)))

    def _created(self, data: Data) -> Data:
        """What a submission answered, with the new id that scripts read from `ddpq submit`."""
        if type(data.get("id")) is not int:
            raise protocol_error(self.url, "no id of what was submitted")
        return data

    def sweeps(self, ids: Iterable[int]) -> builtins.list[Data]:
        """These sweeps, each with its members' counts by state."""
        wanted = sorted(set(ids))
        items: builtins.list[Data] = []
        for start in range(0, len(wanted), 1000):
            chunk = wanted[start : start + 1000]
            page = self._json("GET", "/v1/sweeps", params={"id": chunk, "limit": 1000})
            items += page["items"]
        return items

    def sweep(self, sweep_id: int, sort: str | None = None) -> Data:
        params = {"sort": sort} if sort else {}
        data: Data = self._json("GET", f"/v1/sweeps/{sweep_id}", params=params)
        return data

    def sweep_action(self, sweep_id: int, verb: str) -> Data:
        """``cancel``, ``hold`` or ``release`` every member of a sweep."""
        data: Data = self._json("POST", f"/v1/sweeps/{sweep_id}/{verb}")
        return data

    def devices(self) -> Data:
        data: Data = self._json("GET", "/v1/devices")
        return data

    def whoami(self) -> Data:
        data: Data = self._json("GET", "/v1/whoami")
        return data

    def usage(self, since: str = "30d", by: str = "user") -> Data:
        """GPU-hours, ended jobs and waits per user, day or month (``UsageReport``)."""
        data: Data = self._json("GET", "/v1/usage", params={"since": since, "by": by})
        return data

    def reservations(self, ended: bool = False) -> Data:
        """GPU reservations in force or to come (``ended``: past ones too)."""
        params = {"ended": "true"} if ended else {}
        data: Data = self._json("GET", "/v1/reservations", params=params)
        return data

    def health(self) -> Data:
        data: Data = self._json("GET", "/healthz")
        return data

    def create_token(self, expires_s: float, note: str | None = None) -> Data:
        """A token for yourself (through the daemon's Unix socket only); its secret is in
        ``token``, this once."""
        body: Data = {"expires_s": expires_s}
        if note is not None:
            body["note"] = note
        data: Data = self._json("POST", "/v1/tokens", body=body)
        return data

    def tokens(self, everyone: bool = False) -> builtins.list[Data]:
        params = {"all": "true"} if everyone else None
        items: builtins.list[Data] = self._json("GET", "/v1/tokens", params=params)["items"]
        return items

    def revoke_token(self, token_id: int) -> Data:
        data: Data = self._json("POST", f"/v1/tokens/{token_id}/revoke")
        return data

    def log(self, job_id: int, offset: int = 0, limit: int = 1024 * 1024) -> tuple[bytes, int]:
        r = self._http.request(
            "GET", f"/v1/jobs/{job_id}/log", params={"offset": offset, "limit": limit}
        )
        next_offset = _header_count(r, "x-ddpq-next-offset")
        return r.body, offset + len(r.body) if next_offset is None else next_offset

    def log_tail(self, job_id: int, nbytes: int = 8192) -> bytes:
        """The last ``nbytes`` of a job's log (b"" if you may not read it)."""
        try:
            r = self._http.request(
                "GET", f"/v1/jobs/{job_id}/log", params={"offset": 0, "limit": 1}
            )
        except DdpqError as exc:
            if exc.status == 403:
                return b""
            raise
        size = _header_count(r, "x-ddpq-log-size") or 0
        data, _ = self.log(job_id, max(0, size - nbytes), nbytes)
        return data

    def follow_log(self, job_id: int, offset: int = 0) -> Iterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        params: dict[str, str | int] = {"offset": offset, "follow": "true"}
        yield from self._http.stream(f"/v1/jobs/{job_id}/log", params)

    def history(self, query: Mapping[str, Any]) -> Data:
        """A page of finished jobs, newest end first (``HistoryPage``): ``query`` holds
        ``GET /v1/history``'s parameters (since, until, user, mine, state, name, limit,
        after); its ``next`` is the ``after`` of the page that follows."""
        params = {k: v for k, v in query.items() if v is not None}
        data: Data = self._json("GET", "/v1/history", params=params)
        return data


def _header_count(r: Response, name: str) -> int | None:
    """A header that holds a count (None if absent)."""
    value = r.headers.get(name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise protocol_error(r.url, f"{name}: {value[:40]!r} is not a count")
    return int(value)


class DdpqClient:
    """The REST API with the wire schemas' models (``JobSubmit`` in, ``JobOut`` out, ...).

    ``json`` is the same API as plain data (``JsonApi``), on the same connection."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0
    ) -> None:
        self.json = JsonApi(url, token, timeout)

    @property
    def url(self) -> str:
        return self.json.url

    def close(self) -> None:
        self.json.close()

    def __enter__(self) -> DdpqClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(self, job: JobSubmit) -> JobOut:
        from ddpq.schemas import JobOut

        return JobOut.model_validate(self.json.submit(job.model_dump(exclude_defaults=True)))

    def list(
        self,
        states: builtins.list[str] | None = None,
        user: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> JobList:
        from ddpq.schemas import JobList

        return JobList.model_validate(self.json.list(states, user, limit, offset))

    def list_all(
        self, states: builtins.list[str] | None = None, user: str | None = None
    ) -> builtins.list[JobOut]:
        """Every matching job, oldest first, however many pages that takes."""
        from ddpq.schemas import JobOut

        return [JobOut.model_validate(j) for j in self.json.list_all(states, user)]

    def show(self, job_id: int) -> JobDetail:
        from ddpq.schemas import JobDetail

        return JobDetail.model_validate(self.json.show(job_id))

    def env(self, job_id: int) -> JobEnvOut:
        from ddpq.schemas import JobEnvOut

        return JobEnvOut.model_validate(self.json.env(job_id))

    def cancel(self, job_id: int) -> CancelResult:
        from ddpq.schemas import CancelResult

        return CancelResult.model_validate(self.json.cancel(job_id))

    def hold(self, job_id: int, hold: bool = True) -> JobOut:
        from ddpq.schemas import JobOut

        return JobOut.model_validate(self.json.hold(job_id, hold))

    def devices(self) -> DeviceList:
        from ddpq.schemas import DeviceList

        return DeviceList.model_validate(self.json.devices())

    def whoami(self) -> dict[str, Any]:
        return self.json.whoami()

    def usage(self, since: str = "30d", by: str = "user") -> UsageReport:
        from ddpq.schemas import UsageReport

        return UsageReport.model_validate(self.json.usage(since, by))

    def health(self) -> dict[str, Any]:
        return self.json.health()

    def log(self, job_id: int, offset: int = 0, limit: int = 1024 * 1024) -> tuple[bytes, int]:
        return self.json.log(job_id, offset, limit)

    def log_tail(self, job_id: int, nbytes: int = 8192) -> bytes:
        """The last ``nbytes`` of a job's log (b"" if you may not read it)."""
        return self.json.log_tail(job_id, nbytes)

    def follow_log(self, job_id: int, offset: int = 0) -> Iterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        return self.json.follow_log(job_id, offset)
