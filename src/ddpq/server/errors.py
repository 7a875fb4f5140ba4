"""How the API answers a refusal: one ``{detail, code}`` body (``ErrorOut``) for every error.

The exception handlers here turn what routes raise (``ApiError``, ``UnknownJob``), what
FastAPI raises for a request that fails its schema, and Starlette's own 404/405 into that
body; ``ERRORS`` and its companions document the answers in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from ddpq.schemas import ErrorOut
from ddpq.server import views
from ddpq.store.jobs import UnknownJob


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


Responses = dict[int | str, dict[str, Any]]

ERRORS: Responses = {
    401: {"model": ErrorOut, "description": "missing or wrong token"},
    403: {
        "model": ErrorOut,
        "description": "not your job, a priority above the users' cap, or a request from a "
        "web page of another origin or for a Host that is not this daemon",
    },
    404: {"model": ErrorOut, "description": "no such job"},
    422: {"model": ErrorOut, "description": "invalid request; `detail` names the field"},
    503: {
        "model": ErrorOut,
        "description": "storage fault (the disk is full, the database is read-only or "
        "locked); `detail` names it",
    },
}
# Writes take JSON only, so an HTML form on another site cannot make a browser post one.
WRITE_ERRORS: Responses = {
    415: {"model": ErrorOut, "description": "a write whose body is not JSON"},
}
# Submissions: refused while the state disk is short (store.headroom).
NO_ROOM: Responses = {
    507: {
        "model": ErrorOut,
        "description": "the disk holding ddpq's state is short of the room kept for cancels "
        "and jobs' ends: new jobs are refused (cancel, hold and release are not); `detail` "
        "says how much is free",
    },
}
# Submissions: refused past the owner's cap on queued and held jobs (server.queue_caps).
QUEUE_CAP: Responses = {
    429: {
        "model": ErrorOut,
        "description": "the owner's queued and held jobs, with these, would pass "
        "max_queued_per_user; `detail` names the cap",
    },
}
CONFLICT: Responses = {
    409: {"model": ErrorOut, "description": "the job is not waiting, so it cannot be held"},
}


def error_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    # servable: a detail may quote what a client sent, which must not make the answer fail.
    body = ErrorOut(detail=views.servable(detail), code=code).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


def validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # FastAPI's: where json.loads stopped
            why = (err.get("ctx") or {}).get("error", "JSON decode error")
            at = f"character {err.get('loc', ('body', '?'))[-1]}"
            # json names a place in some of its reasons ("Unterminated string starting at")
            where = f"{why} {at}" if why.endswith(" at") else f"{why} (at {at})"
            parts.append(f"the body is not valid JSON: {where}")
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body",))
        msg = str(err.get("msg", "invalid"))
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg)
    return "; ".join(parts) or "invalid request"


async def _api_error(_r: Request, exc: ApiError) -> Response:
    return error_response(exc.status, exc.code, exc.detail)


async def _unknown_job(_r: Request, exc: UnknownJob) -> Response:
    return error_response(404, "not_found", f"no job {exc.job_id}")


async def _invalid(_r: Request, exc: RequestValidationError) -> Response:
    return error_response(422, "invalid", validation_message(exc))


async def _http(request: Request, exc: StarletteHTTPException) -> Response:
    bad = exc.__cause__
    if exc.status_code == 400 and isinstance(bad, UnicodeDecodeError):
        # FastAPI's "error parsing the body", from json.loads: the same refusal as any
        # other body that is not JSON, and where it went wrong.
        byte = bad.object[bad.start : bad.start + 1].hex()
        detail = f"the body is not valid JSON: not UTF-8 (byte 0x{byte} at {bad.start})"
        return error_response(422, "invalid", detail)
    if exc.status_code == 400 and isinstance(bad, RecursionError | ValueError):
        # json.loads' own limits: an integer of over 4300 digits, or nesting deeper than
        # the interpreter's recursion allows.
        why = "nested too deeply" if isinstance(bad, RecursionError) else "a number too long"
        return error_response(422, "invalid", f"the body is not valid JSON here: {why}")
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names only the first route of the path in Allow; FastAPI has one
        # route per method, so gather them all (GET and POST /v1/jobs) from the flat list
        # create_app keeps.
        headers["Allow"] = ", ".join(allowed_methods(request.app.state.routes, request.scope))
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> list[str]:
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


# For FastAPI(exception_handlers=...): they replace FastAPI's own for the same classes.
HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    ApiError: _api_error,
    UnknownJob: _unknown_job,
    RequestValidationError: _invalid,
    StarletteHTTPException: _http,
}
