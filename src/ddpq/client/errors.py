"""The client's errors: each one line for the CLI to print, with the CLI's exit status."""

from __future__ import annotations

import json

from ddpq.client.format import sanitize


class DdpqError(Exception):
    """An error the CLI prints as one line; ``exit_code`` is the CLI's exit status. For a
    refusal, ``status`` is the HTTP status and ``detail`` what the daemon said (made safe)."""

    def __init__(
        self, message: str, exit_code: int = 1, status: int | None = None, detail: str = ""
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status
        self.detail = detail or message


class Unreachable(DdpqError):
    pass


EXIT_BY_STATUS = {401: 5, 403: 5, 404: 4}


def protocol_error(url: str, what: str) -> DdpqError:
    """An answer that is HTTP but not what a ddpq daemon answers (not JSON, not the shape
    this client reads): one line, which may quote what answered, made safe."""
    return DdpqError(
        f"the answer from {sanitize(url)} is not one a ddpq daemon gives ({sanitize(what)}); "
        "is that a ddpq daemon, of this version?"
    )


def api_error(status: int, reason: str, body: bytes) -> DdpqError:
    """The error for an answer of ``status`` >= 400: its ``detail``, or the start of the page
    that answered (something else may listen on that port)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        data = None
    detail = data.get("detail") if isinstance(data, dict) else None
    text = body[:200].decode(errors="replace")
    # The CLI prints this as one line, and the detail may quote a job's name or whatever
    # answered on that port: no control characters, no newlines.
    message = sanitize(detail if isinstance(detail, str) else text or reason)
    return DdpqError(
        f"{message} (HTTP {status})",
        exit_code=EXIT_BY_STATUS.get(status, 1),
        status=status,
        detail=message,
    )


def unreadable_answer(exc: Exception) -> str:
    """What the CLI says when a command meets JSON of another shape than the daemon's (a
    missing key, a list for an object, a string for a number), wherever it reads it."""
    said = sanitize(str(exc))[:80]
    return (
        f"the daemon's answer is not one this client can read ({type(exc).__name__}"
        f"{': ' + said if said else ''}); is that a ddpq daemon, of this version? "
        "(--debug shows where)"
    )
