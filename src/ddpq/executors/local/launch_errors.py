"""Why a local launch failed, in words for the job's reason, and which failures put the
launch off rather than fail the job."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from ddpq.executors.accounts import NoAccount


class FolderFull(OSError):
    """The job's folder, its log or its exit record's room found its disk full (ENOSPC):
    the host's state, not the job's fault, so the launch is put off. Only these writes:
    ENOSPC from elsewhere (a v1 cpuset without memory nodes says it too) fails the job,
    and a full quota (EDQUOT) is the account's own."""


@contextlib.contextmanager
def folder_writes() -> Iterator[None]:
    """Writes into the job's folder: ENOSPC from them is ``FolderFull``."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC or isinstance(exc, FolderFull):
            raise
        raise FolderFull(exc.errno, exc.strerror, exc.filename) from exc


def launch_error(exc: BaseException) -> str:
    """Why a launch failed, in words for the job's reason."""
    if isinstance(exc, NoAccount):
        return str(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot start the job: {exc.filename} does not exist"
    if isinstance(exc, PermissionError):
        return f"cannot start the job: permission denied ({exc.filename or exc})"
    if isinstance(exc, FolderFull):
        return f"cannot start the job: no room on the disk of its folder ({exc.strerror})"
    return f"cannot start the job: {exc}"
