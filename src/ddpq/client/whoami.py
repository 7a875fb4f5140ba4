"""What `ddpq whoami` says: who the daemon takes you for, how it knows, and which path
(the Unix socket or a URL) this client took to ask it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ddpq.client.format import sanitize, text
from ddpq.client.transport import unix_path


def describe(me: Mapping[str, Any], url: str) -> list[str]:
    """Lines for people: the name first (as before: scripts read the first word)."""
    name = sanitize(text(me.get("name")))
    account = sanitize(text(me.get("account")))
    socket = unix_path(url)
    path = f"the socket {sanitize(socket)}" if socket else sanitize(url)
    via = me.get("via")
    lines = [f"{name}{' (admin)' if me.get('admin') else ''}"]
    if via == "socket":
        lines.append(
            f"Unix account {account} (uid {text(me.get('uid'))}), known from {path}: no token"
        )
    elif via == "account_token":
        token = me.get("token") or {}
        until = token.get("expires_at")
        works = time.strftime(" until %Y-%m-%d %H:%M", time.localtime(until)) if until else ""
        lines.append(
            f"Unix account {account}, by your token {text(token.get('id'))} (works{works}), "
            f"over {path}"
        )
    elif via == "user_token":
        lines.append(f"ddpq user {name}, by the token the admin gave you, over {path}")
    elif via == "header":
        lines.append(
            f"the name this client sent, over {path}: the daemon runs without --auth and "
            "believes it"
        )
    else:
        lines.append(f"no name sent, over {path} (the daemon runs without --auth)")
    runs_as = me.get("runs_as")
    if me.get("runs_no_job"):
        lines.append(f"jobs would not run: {sanitize(text(me.get('runs_no_job')))}")
    elif runs_as:
        lines.append(f"jobs run as {sanitize(text(runs_as))}")
    elif via == "account_token":
        lines.append(
            "jobs are submitted on the server itself (this daemon runs none for a token "
            "over TCP); this token watches, reads and cancels"
        )
    else:
        lines.append("jobs would not run: no Unix account for them (`ddpq admin user map`)")
    return lines
