"""Which daemon the CLI asks, and which token (if any) it sends there.

A token is a password for one daemon: it goes only to the daemon it was made for, never to
whatever listens where ddpq looks when it finds no socket (``DEFAULT_URL``, a port any
local user may bind while the service is stopped). So `ddpq login` keeps the daemon's URL
with the token and a saved token goes only there; a token in $DDPQ_TOKEN or ``--token``
goes only to a daemon named with ``--url`` or $DDPQ_URL. On this machine the daemon's Unix
socket needs no token: none is sent on it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Mapping

from ddpq.client.errors import DdpqError
from ddpq.client.transport import UNIX_SCHEME, unix_path
from ddpq.core.names import DEFAULT_API_ADDRESS, SOCKET_FILE, SYSTEM_SOCKET, state_folder

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import neither ``typing`` nor
# ``pathlib`` (~3 ms; ``client.quick``): every command reads its paths with ``os.path``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_URL = "http://{}:{}".format(*DEFAULT_API_ADDRESS)
SOCKET_ENV = "DDPQ_SOCKET"
# A token travels in an HTTP header: visible ASCII only (what `ddpq admin user add` prints
# is "ddpq_" + URL-safe base64). Anything else is a paste gone wrong, and would fail deep
# inside a request instead of saying so. Compiled (re's cache) when a token is read: a
# command that sends none compiles nothing.
TOKEN = r"[\x21-\x7e]{1,1024}"
MAX_LOGIN_FILE = 8192


def check_token(token: str) -> str:
    """``token`` without surrounding whitespace, or ``DdpqError`` (exit 2) if it cannot be one."""
    token = token.strip()
    if not token:
        raise DdpqError("the token is empty", exit_code=2)
    if not re.fullmatch(TOKEN, token):
        raise DdpqError(
            "that is not a token (a token is one word of visible ASCII characters, "
            "as `ddpq token create` or `ddpq admin user add` printed it)",
            exit_code=2,
        )
    return token


def token_file() -> Path:
    from pathlib import Path

    return Path(_token_path())


def _token_path() -> str:
    """The token file's path as a string (``token_file`` names the same file, as pathlib
    writes it)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(user_home(), ".config")
    return os.path.join(base, "ddpq", "token")


def user_home() -> str:
    """``Path.home()`` without pathlib: ~ expanded, or RuntimeError as Path.home() raises."""
    home = os.path.expanduser("~")
    if home.startswith("~"):
        raise RuntimeError("Could not determine home directory.")
    return home


# A plain class: a dataclass imports ``inspect`` (~5 ms), a NamedTuple compiles each
# (string) annotation; `ddpq submit` and `ddpq ls` are typed in shell loops.
class Login:
    """A saved token and the daemon it is for (None: saved by an older ddpq, naming none)."""

    __slots__ = ("token", "url")

    def __init__(self, url: str | None, token: str) -> None:
        self.url = url
        self.token = token


def saved_login() -> Login | None:
    """What `ddpq login` saved (only if no one else can read it); None if nothing."""
    where = _token_path()
    try:
        mode = os.stat(where).st_mode
    except OSError:
        return None
    if mode & 0o077:
        path = token_file()  # as the messages name it
        raise DdpqError(f"{path} is readable by others; run: chmod 600 {path}", exit_code=2)
    with open(where, "rb") as f:
        data = f.read(MAX_LOGIN_FILE + 1)
    if data.lstrip().startswith(b"{"):
        try:
            saved = json.loads(data)
        except (ValueError, RecursionError):
            saved = None
        url, token = (saved.get("url"), saved.get("token")) if isinstance(saved, dict) else ("", "")
        if isinstance(url, str) and isinstance(token, str) and re.fullmatch(TOKEN, token):
            return Login(normal_url(url), token)
    elif len(data) <= MAX_LOGIN_FILE and re.fullmatch(
        TOKEN, text := data.decode("latin-1").strip()
    ):
        return Login(None, text)  # one line: an older ddpq's
    raise DdpqError(
        f"{token_file()} is not a token `ddpq login` saved; run `ddpq --url URL login` again",
        exit_code=2,
    )


def login_url(url: str | None) -> str:
    """The daemon `ddpq login` saves a token for: ``url`` (--url) or $DDPQ_URL, over HTTP."""
    named = url or os.environ.get("DDPQ_URL")
    if not named or unix_path(named) is not None:
        raise DdpqError(
            "name the daemon the token is for, which alone it will be sent to: "
            "`ddpq --url http://HOST:8765 login` (or $DDPQ_URL); on the server itself the "
            "Unix socket needs no token",
            exit_code=2,
        )
    return normal_url(named)


def save_login(url: str, token: str) -> Path:
    path = token_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"url": url, "token": token}) + "\n")
    os.chmod(path, 0o600)
    return path


def find_socket(environ: Mapping[str, str] = os.environ) -> str | None:
    """The daemon's Unix socket on this machine: $DDPQ_SOCKET if set, else the first that
    exists of the one in the state folder a daemon of yours would use ($DDPQ_HOME, ...) and
    the system's (``SYSTEM_SOCKET``, the systemd unit's)."""
    if environ.get(SOCKET_ENV):
        return environ[SOCKET_ENV]
    candidates = []
    try:
        home = os.path.expanduser(state_folder(environ, user_home()))
        candidates.append(os.path.join(home, SOCKET_FILE))
    except RuntimeError:  # no home folder to be found (no $HOME, no password entry)
        pass
    candidates.append(SYSTEM_SOCKET)
    for path in candidates:
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def normal_url(url: str) -> str:
    """A daemon's URL as given, without a trailing slash (a socket's as it is)."""
    return url.rstrip("/") if unix_path(url) is None else url


def choose_url(url: str | None = None) -> str:
    """Where to reach the daemon: ``url`` (--url), else $DDPQ_URL, else its Unix socket on
    this machine if there is one (``unix:/path``: the daemon knows you from it, no token),
    else ``DEFAULT_URL``."""
    chosen = url or os.environ.get("DDPQ_URL")
    if chosen:
        return normal_url(chosen)
    path = find_socket()
    return UNIX_SCHEME + path if path else DEFAULT_URL


def uses_socket(url: str) -> bool:
    return unix_path(url) is not None


def connection(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The daemon the CLI asks and the token it sends there: ``url`` (--url) or $DDPQ_URL
    with ``token`` (--token), $DDPQ_TOKEN or the token saved for that URL; else the Unix
    socket on this machine, with none; else the daemon of the saved token, with it; else
    ``DEFAULT_URL``, with none."""
    named = url or os.environ.get("DDPQ_URL")
    given = token or os.environ.get("DDPQ_TOKEN")
    if named:
        chosen = normal_url(named)
        if uses_socket(chosen) or given:
            return chosen, None if uses_socket(chosen) else given
        login = _usable(saved_login())
        return chosen, login.token if login and login.url == chosen else None
    path = find_socket()
    if path:
        return UNIX_SCHEME + path, None
    if given:
        raise DdpqError(
            "a token is sent only to the daemon you name: set --url or $DDPQ_URL too "
            f"(no daemon's socket here, and {DEFAULT_URL} may be anyone's)",
            exit_code=2,
        )
    login = _usable(saved_login())
    return (login.url, login.token) if login and login.url else (DEFAULT_URL, None)


def _usable(login: Login | None) -> Login | None:
    """A saved login that names its daemon; an older one is not sent, and says so."""
    if login is not None and login.url is None:
        sys.stderr.write(
            f"ddpq: warning: the token in {token_file()} names no daemon (an older ddpq "
            "saved it), so it is not sent: `ddpq --url URL login` saves it with its daemon\n"
        )
        return None
    return login
