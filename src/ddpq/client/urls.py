"""The daemon's URL read, and a request's query written, as ``urllib.parse`` does, without
importing it for what every command has: importing it costs ~2 ms of a `ddpq ls` (it
brings ``ipaddress``), as much as this whole module's work.

What is read here is the common case, ``http(s)://HOST[:PORT][/PATH]`` and a query of ids,
numbers and state names, all in letters, digits and ``_.-~`` (which need no quoting);
anything else (an IPv6 address, a user in the URL, a space, a value to quote, ...) goes to
``urllib.parse`` itself. ``tests/test_client_urls.py`` reads both ways.
"""

from __future__ import annotations

from collections.abc import Mapping

# What urllib.parse.quote_plus leaves as it is (its always-safe characters).
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_PATH = _PLAIN | {"/"}
MAX_PORT = 65535

Params = Mapping[str, str | int | list[str]]


def split(url: str) -> tuple[str, str | None, int | None, str]:
    """``url``'s scheme, host name (in lower case), port and path, as ``urlsplit(url)``'s
    ``scheme``, ``hostname``, ``port`` and ``path``; ValueError for a port that is not one,
    as ``.port`` raises it."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, colon, port = netloc.partition(":")
    if (
        sep
        and scheme in ("http", "https")
        and host
        and _PLAIN.issuperset(host)
        and (not colon or (port.isascii() and port.isdigit() and int(port) <= MAX_PORT))
        and _PATH.issuperset(path)
    ):
        return scheme, host.lower(), int(port) if colon else None, slash + path
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port, parts.path


def query(params: Params) -> str:
    """``urlencode(params, doseq=True)``: a list is one ``key=value`` for each of its items."""
    pairs = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            text = str(item) if isinstance(item, int) else item
            if not (isinstance(text, str) and _PLAIN.issuperset(key) and _PLAIN.issuperset(text)):
                from urllib.parse import urlencode

                return urlencode(params, doseq=True)
            pairs.append(f"{key}={text}")
    return "&".join(pairs)
