"""``DdpqClient``: the REST API from Python (httpx), speaking the shared wire schemas."""

from __future__ import annotations

import builtins
import getpass
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ddpq.client.format import sanitize
from ddpq.schemas import (
    DEFAULT_API_ADDRESS,
    NAME_RE,
    CancelResult,
    DeviceList,
    JobDetail,
    JobList,
    JobOut,
    JobSubmit,
)

DEFAULT_URL = "http://{}:{}".format(*DEFAULT_API_ADDRESS)


class DdpqError(Exception):
    """An error the CLI prints as one line; ``exit_code`` is the CLI's exit status."""

    def __init__(self, message: str, exit_code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


class Unreachable(DdpqError):
    pass


EXIT_BY_STATUS = {401: 5, 403: 5, 404: 4}
# A token travels in an HTTP header: visible ASCII only (what `ddpq admin user add` prints
# is "ddpq_" + URL-safe base64). Anything else is a paste gone wrong, and httpx would raise
# on it deep inside a request instead of saying so.
TOKEN_RE = re.compile(r"[\x21-\x7e]{1,1024}")


def check_token(token: str) -> str:
    """``token`` without surrounding whitespace, or ``DdpqError`` (exit 2) if it cannot be one."""
    token = token.strip()
    if not token:
        raise DdpqError("the token is empty", exit_code=2)
    if not TOKEN_RE.fullmatch(token):
        raise DdpqError(
            "that is not a token (a token is one word of visible ASCII characters, "
            "as `ddpq admin user add` printed it)",
            exit_code=2,
        )
    return token


def token_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ddpq" / "token"


def find_token() -> str | None:
    """$DDPQ_TOKEN, else the user's token file (only if no one else can read it)."""
    if os.environ.get("DDPQ_TOKEN"):
        return os.environ["DDPQ_TOKEN"]
    path = token_file()
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if mode & 0o077:
        raise DdpqError(f"{path} is readable by others; run: chmod 600 {path}", exit_code=2)
    return path.read_text().strip() or None


def save_token(token: str) -> Path:
    path = token_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return path


class DdpqClient:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = (url or os.environ.get("DDPQ_URL") or DEFAULT_URL).rstrip("/")
        headers: dict[str, str] = {}
        # Without --auth the daemon takes this name on trust (and refuses one that is not a
        # valid ddpq name); a local account such as `_svc` then submits as "anonymous".
        if NAME_RE.match(me := getpass.getuser()):
            headers["X-Ddpq-User"] = me
        if token:
            headers["Authorization"] = f"Bearer {check_token(token)}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DdpqClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach the ddpq daemon at {self.url} ({type(exc).__name__}); "
                "is `ddpq serve` running? (set --url or DDPQ_URL)",
                exit_code=3,
            ) from None
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def submit(self, job: JobSubmit) -> JobOut:
        body = job.model_dump(exclude_defaults=True)
        return JobOut.model_validate(self._request("POST", "/v1/jobs", json=body).json())

    def list(
        self,
        states: list[str] | None = None,
        user: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> JobList:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if states:
            params["state"] = states
        if user:
            params["user"] = user
        return JobList.model_validate(self._request("GET", "/v1/jobs", params=params).json())

    def list_all(
        self, states: builtins.list[str] | None = None, user: str | None = None
    ) -> builtins.list[JobOut]:
        """Every matching job, oldest first, however many pages that takes."""
        items: builtins.list[JobOut] = []
        while True:
            page = self.list(states=states, user=user, limit=1000, offset=len(items))
            items += page.items
            if not page.items or len(items) >= page.total:
                return items

    def show(self, job_id: int) -> JobDetail:
        return JobDetail.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def cancel(self, job_id: int) -> CancelResult:
        data = self._request("POST", f"/v1/jobs/{job_id}/cancel").json()
        return CancelResult.model_validate(data)

    def hold(self, job_id: int, hold: bool = True) -> JobOut:
        verb = "hold" if hold else "release"
        return JobOut.model_validate(self._request("POST", f"/v1/jobs/{job_id}/{verb}").json())

    def devices(self) -> DeviceList:
        return DeviceList.model_validate(self._request("GET", "/v1/devices").json())

    def whoami(self) -> dict[str, Any]:
        data: dict[str, Any] = self._request("GET", "/v1/whoami").json()
        return data

    def health(self) -> dict[str, Any]:
        data: dict[str, Any] = self._request("GET", "/healthz").json()
        return data

    def log(self, job_id: int, offset: int = 0, limit: int = 1024 * 1024) -> tuple[bytes, int]:
        r = self._request(
            "GET", f"/v1/jobs/{job_id}/log", params={"offset": offset, "limit": limit}
        )
        return r.content, int(r.headers.get("X-Ddpq-Next-Offset", offset + len(r.content)))

    def log_tail(self, job_id: int, nbytes: int = 8192) -> bytes:
        """The last ``nbytes`` of a job's log (b"" if you may not read it)."""
        try:
            r = self._request("GET", f"/v1/jobs/{job_id}/log", params={"offset": 0, "limit": 1})
        except DdpqError as exc:
            if exc.status == 403:
                return b""
            raise
        size = int(r.headers.get("X-Ddpq-Log-Size", 0))
        data, _ = self.log(job_id, max(0, size - nbytes), nbytes)
        return data

    def follow_log(self, job_id: int, offset: int = 0) -> Iterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        params: dict[str, str | int] = {"offset": offset, "follow": "true"}
        try:
            with self._http.stream(
                "GET", f"/v1/jobs/{job_id}/log", params=params, timeout=None
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _api_error(r)
                yield from r.iter_bytes()
        except httpx.TransportError as exc:
            raise Unreachable(
                f"lost the ddpq daemon at {self.url} ({type(exc).__name__})", exit_code=3
            ) from None


def _api_error(response: httpx.Response) -> DdpqError:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    message = detail if isinstance(detail, str) else response.text[:200] or response.reason_phrase
    return DdpqError(
        # The CLI prints this as one line, and the detail may quote a job's name or whatever
        # answered on that port: no control characters, no newlines.
        f"{sanitize(message)} (HTTP {response.status_code})",
        exit_code=EXIT_BY_STATUS.get(response.status_code, 1),
        status=response.status_code,
    )
