"""The REST API: ``create_app(settings)``. Routes call the store and the core, never SQL."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from ddpq import __version__, wake
from ddpq.config import Settings
from ddpq.core.states import TERMINAL, JobState
from ddpq.schemas import (
    NAME_PATTERN,
    NAME_RE,
    NAME_RULE,
    USER_PRIORITY_MAX,
    CancelResult,
    DeviceList,
    DeviceOut,
    ErrorOut,
    GpuProcessOut,
    JobDetail,
    JobList,
    JobOut,
    JobSubmit,
    derive_name,
)
from ddpq.server import paths, views
from ddpq.server.faults import StorageFaults
from ddpq.server.guard import RequestGuard, allowed_names, extra_names_from_env
from ddpq.store import devices as device_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import users as user_store
from ddpq.store.db import Database, migrate
from ddpq.workloads.registry import BadWorkload, resolve

STATIC = Path(__file__).with_name("static")
LOG_CHUNK = 64 * 1024
# SQLite integers are 64-bit: a larger id or offset is refused (422) before it reaches SQL.
INT64_MAX = 2**63 - 1


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


@dataclass(frozen=True)
class Caller:
    name: str
    admin: bool


def _error(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    # servable: a detail may quote what a client sent, which must not make the answer fail.
    body = ErrorOut(detail=views.servable(detail), code=code).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body",))
        msg = str(err.get("msg", "invalid"))
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg)
    return "; ".join(parts) or "invalid request"


ERRORS: dict[int | str, dict[str, Any]] = {
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
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    415: {"model": ErrorOut, "description": "a write whose body is not JSON"},
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "the job is not waiting, so it cannot be held"},
}


def get_caller(
    request: Request,
    x_ddpq_user: Annotated[
        str | None,
        Header(
            description="who is asking, without --auth (ignored with it); a user name",
            json_schema_extra={"pattern": NAME_PATTERN},
        ),
    ] = None,
) -> Caller:
    """Who is asking: the token's user with --auth, else whoever the client says it is.

    Without --auth every caller is an admin: the daemon cannot tell users apart, so it
    enforces nothing between them (no owner checks, no priority cap).
    """
    settings: Settings = request.app.state.settings
    if not settings.auth:
        if x_ddpq_user is None:
            return Caller(name="anonymous", admin=True)
        # Checked like any user name: it becomes the owner of what this caller submits.
        if not NAME_RE.match(x_ddpq_user):
            raise ApiError(422, "invalid", f"X-Ddpq-User: {NAME_RULE}")
        return Caller(name=x_ddpq_user, admin=True)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "this daemon needs a token: set DDPQ_TOKEN")
    db: Database = request.app.state.db
    with db.read() as s:
        user = user_store.by_token(s, token.strip())
        if user is None:
            raise ApiError(401, "unauthorized", "unknown token")
        return Caller(name=user.name, admin=user.is_admin)


Auth = Annotated[Caller, Depends(get_caller)]
JobId = Annotated[int, PathParam(ge=1, le=INT64_MAX)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]


def create_app(settings: Settings) -> FastAPI:
    db_holder: dict[str, Database] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        migrate(settings.db_path)
        db_holder["db"] = app.state.db = Database(settings.db_path)
        yield
        db_holder.pop("db").dispose()

    app = FastAPI(
        title="ddpq",
        version=__version__,
        description="GPU job queue for a shared training server: leases disjoint GPUs and a "
        "rendezvous port to each PyTorch DDP job.",
        lifespan=lifespan,
        docs_url="/docs",
        responses=ERRORS,
    )
    app.state.settings = settings

    def db() -> Database:
        return db_holder["db"]

    @app.exception_handler(ApiError)
    async def _api_error(_r: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.detail)

    @app.exception_handler(job_store.UnknownJob)
    async def _unknown(_r: Request, exc: job_store.UnknownJob) -> JSONResponse:
        return _error(404, "not_found", f"no job {exc.job_id}")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route of the path in Allow; FastAPI has one
            # route per method, so gather them all (GET and POST /v1/jobs).
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return _error(exc.status_code, code, str(exc.detail), headers=headers)

    def may_touch(who: Caller, owner: str, job_id: int) -> None:
        if settings.auth and not who.admin and who.name != owner:
            raise ApiError(403, "forbidden", f"job {job_id} belongs to {owner}, not {who.name}")

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, Any]:
        with db().read() as s:
            counts = job_store.count_by_state(s)
        return {"ok": True, "version": __version__, "jobs": counts}

    @app.get("/v1/whoami", tags=["meta"])
    def whoami(who: Auth) -> dict[str, Any]:
        return {"name": who.name, "admin": who.admin, "auth": settings.auth}

    def check_cwd(cwd: str, owner: str) -> None:
        """Refuse a working directory the job could not enter, without revealing more.

        A root daemon with --auth runs the job as its owner's mapped account, so it judges
        the path as that account would (missing and out of reach read the same); without a
        mapping the launch refuses the job anyway. Otherwise jobs run as the daemon's own
        account (without --auth every caller is trusted with it), which the kernel asks.
        """
        if settings.auth and os.geteuid() == 0:
            with db().read() as s:
                mapped = user_store.unix_accounts(s, {owner}).get(owner)
            account = paths.account(mapped) if mapped else None
            if account is None:
                return
            ok = paths.can_enter(cwd, account)
        else:
            ok = paths.daemon_can_enter(cwd)
        if not ok:
            raise ApiError(422, "invalid", f"cwd: {cwd} is not a directory the job can enter")

    @app.post(
        "/v1/jobs", status_code=201, response_model=JobOut, tags=["jobs"], responses=WRITE_ERRORS
    )
    def submit(body: JobSubmit, who: Auth) -> JobOut:
        owner = who.name if settings.auth else (body.owner or who.name)
        if body.priority > USER_PRIORITY_MAX and not who.admin:
            raise ApiError(
                403,
                "forbidden",
                f"priority: at most {USER_PRIORITY_MAX} for users; above that needs an admin",
            )
        launcher = "torchrun" if body.torchrun else "plain"
        command = body.command
        if body.workload is not None:
            try:
                command = resolve(body.workload, body.args)
            except BadWorkload as exc:
                raise ApiError(422, "invalid", f"args: {exc}") from None
            launcher = "torchrun"
        if body.cwd is not None:
            check_cwd(body.cwd, owner)
        cwd = body.cwd or str(settings.home)
        name = body.name or derive_name(body.workload or command[0])
        spec = job_store.NewJob(
            name=name,
            owner=owner,
            command=command,
            cwd=cwd,
            gpus=body.gpus,
            launcher=launcher,
            env=body.env,
            priority=body.priority,
            time_limit_s=body.time_limit_s,
            max_retries=body.retries,
            after=tuple(body.after),
            hold=body.hold,
        )
        with db().write() as s:
            total = len(device_store.all_devices(s))
            if body.gpus > total:
                raise ApiError(
                    422,
                    "invalid",
                    f"gpus: asked for {body.gpus} GPUs but this server has {total}",
                )
            job = job_store.create_job(s, spec, time.time())
            out = views.jobs_out(s, [job])[0]
        wake.nudge(settings.wake_socket)
        return out

    @app.get("/v1/jobs", response_model=JobList, tags=["jobs"])
    def list_jobs(
        _who: Auth,
        state: Annotated[list[JobState] | None, Query()] = None,
        user: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Offset = 0,
    ) -> JobList:
        with db().read() as s:
            rows, total = job_store.list_jobs(
                s, states=state or [], owner=user, limit=limit, offset=offset
            )
            return JobList(items=views.jobs_out(s, rows), total=total, offset=offset, limit=limit)

    @app.get("/v1/jobs/{job_id}", response_model=JobDetail, tags=["jobs"])
    def show(job_id: JobId, _who: Auth) -> JobDetail:
        with db().read() as s:
            return views.job_detail(s, job_store.get_job(s, job_id))

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        response_model=CancelResult,
        tags=["jobs"],
        responses=WRITE_ERRORS,
    )
    def cancel(job_id: JobId, who: Auth) -> CancelResult:
        """Cancel a job. One that has already ended stays as it is: 200 with its state and
        a reason that says so (cancelling is idempotent)."""
        with db().write() as s:
            job = job_store.get_job(s, job_id)
            may_touch(who, job.owner, job_id)
            if job.state in TERMINAL:
                # Checked first: an ended job may still carry the stop request that ended
                # it (a time limit, an earlier cancel), which is no news now.
                why = f"already {job.state}" + (f": {job.reason}" if job.reason else "")
                return CancelResult(
                    id=job.id,
                    state=job.state,
                    reason=views.servable(why),
                )
            job_store.cancel(s, job, time.time())
            result = CancelResult(
                id=job.id,
                state=job.state,
                reason="stopping (SIGTERM sent, SIGKILL after the grace period)"
                if job.stop_request
                else views.servable(job.reason),
            )
        wake.nudge(settings.wake_socket)
        return result

    def _hold(job_id: int, who: Caller, hold: bool) -> JobOut:
        with db().write() as s:
            job = job_store.get_job(s, job_id)
            may_touch(who, job.owner, job_id)
            try:
                job_store.set_hold(s, job, hold, time.time())
            except ValueError as exc:
                raise ApiError(409, "conflict", str(exc)) from None
            out = views.jobs_out(s, [job])[0]
        wake.nudge(settings.wake_socket)
        return out

    @app.post(
        "/v1/jobs/{job_id}/hold",
        response_model=JobOut,
        tags=["jobs"],
        responses={**CONFLICT, **WRITE_ERRORS},
    )
    def hold(job_id: JobId, who: Auth) -> JobOut:
        return _hold(job_id, who, True)

    @app.post(
        "/v1/jobs/{job_id}/release",
        response_model=JobOut,
        tags=["jobs"],
        responses={**CONFLICT, **WRITE_ERRORS},
    )
    def release(job_id: JobId, who: Auth) -> JobOut:
        return _hold(job_id, who, False)

    def _log_target(job_id: int, who: Caller) -> tuple[Path | None, str]:
        with db().read() as s:
            job = job_store.get_job(s, job_id)
            may_touch(who, job.owner, job_id)
            return (Path(job.job_dir) / "output.log" if job.job_dir else None), job.state

    def _job_state(job_id: int) -> str:
        with db().read() as s:
            return job_store.get_job(s, job_id).state

    @app.get(
        "/v1/jobs/{job_id}/log",
        tags=["jobs"],
        responses={200: {"content": {"text/plain": {}}, "description": "log bytes"}},
    )
    def read_log(
        job_id: JobId,
        who: Auth,
        offset: Offset = 0,
        limit: Annotated[int, Query(ge=1, le=16 * 1024 * 1024)] = 1024 * 1024,
        follow: bool = False,
    ) -> Response:
        """Log bytes from ``offset``; ``follow=true``: a chunked stream until the job ends."""
        path, state = _log_target(job_id, who)
        if follow:
            return StreamingResponse(_follow(job_id, path, offset), media_type="text/plain")
        data, size = _read(path, offset, limit)
        return Response(
            data,
            media_type="text/plain; charset=utf-8",
            headers={
                "X-Ddpq-Log-Size": str(size),
                "X-Ddpq-Next-Offset": str(offset + len(data)),
                "X-Ddpq-Job-State": state,
            },
        )

    async def _follow(job_id: int, path: Path | None, offset: int) -> AsyncIterator[bytes]:
        # Async, so a quiet follower holds no worker thread while it waits (a blocking
        # generator would, and 40 of them would starve the whole API); Starlette cancels
        # it when the client goes away.
        while True:
            state = await run_in_threadpool(_job_state, job_id)
            if path is None:
                path, _ = await run_in_threadpool(_log_target, job_id, Caller("ddpq", True))
            data, size = await run_in_threadpool(_read, path, offset, LOG_CHUNK)
            if size < offset:  # the shim compacted the log past its cap
                yield b"\n[ddpq: log compacted; some output skipped]\n"
                offset = max(0, size - LOG_CHUNK)
                continue
            if data:
                offset += len(data)
                yield data
                continue
            if JobState(state) in TERMINAL:
                return
            await asyncio.sleep(0.2)

    @app.get("/v1/devices", response_model=DeviceList, tags=["devices"])
    def devices(_who: Auth) -> DeviceList:
        with db().read() as s:
            snapshot = device_store.all_devices(s)
            live = lease_store.live(s)
            owners = {
                j.id: j.owner for j in job_store.jobs_in(s, [JobState.STARTING, JobState.RUNNING])
            }
        gpu_holder = {x.resource: x for x in live if x.kind == lease_store.GPU}
        ports = {x.resource: x.job_id for x in live if x.kind == lease_store.PORT}
        items = []
        for d in snapshot:
            lease = gpu_holder.get(d.index)
            status = "leased" if lease else ("external" if d.external else "free")
            items.append(
                DeviceOut(
                    index=d.index,
                    uuid=views.servable(d.uuid),
                    name=views.servable(d.name),
                    fake=d.fake,
                    memory_total_mb=d.memory_total_mb,
                    memory_used_mb=d.memory_used_mb,
                    status=status,  # type: ignore[arg-type]
                    job_id=lease.job_id if lease else None,
                    owner=owners.get(lease.job_id) if lease else None,
                    since=views.ts(lease.acquired_at) if lease else None,
                    external_processes=[GpuProcessOut(**p) for p in d.external_processes],
                )
            )
        return DeviceList(items=items, ports_leased=ports)

    # Public, no token, like most exporters: a Prometheus scraper has no ddpq account, and the
    # counts here name no user, job or command.
    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        from ddpq.server.metrics import render

        with db().read() as s:
            body, content_type = render(s, time.time())
        return Response(body, media_type=content_type)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    # The page's script and style sheet. No token needed: they hold no data, the API calls
    # they make send the user's token.
    from fastapi.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # The last added runs first: the guard refuses foreign requests before anything else.
    app.add_middleware(StorageFaults)
    app.add_middleware(RequestGuard, names=allowed_names(settings.host, extra_names_from_env()))
    return app


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


def _read(path: Path | None, offset: int, limit: int) -> tuple[bytes, int]:
    """Bytes of a job's log, which must be a regular file in its folder.

    O_NOFOLLOW and the type check: the job owns its folder, and a link in place of its
    log must not make the API (maybe root) serve some other file.
    """
    if path is None:
        return b"", 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b"", 0
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or offset >= info.st_size:
            return b"", info.st_size if stat.S_ISREG(info.st_mode) else 0
        f.seek(offset)
        return f.read(limit), info.st_size
