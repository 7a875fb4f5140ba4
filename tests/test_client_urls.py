"""``client.urls`` reads the daemon's URL and writes a query as ``urllib.parse`` does, for
the URLs it reads itself and for those it leaves to urllib.parse (issue 26 item 15)."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

import pytest

from ddpq.client import urls
from ddpq.client.urls import Params

URLS = [
    "http://127.0.0.1:8765",
    "http://127.0.0.1:8765/",
    "https://GPU-Box.lab.example:443/ddpq/api/",
    "http://localhost",
    "http://host:08765/a/b",
    "http://host:0",
    "http://host:65535",
    "http://host:65536",  # out of range: ValueError
    "http://host:99999999999999999999",
    "http://host:",  # no port
    "http://host:x",  # ValueError
    "http://host:８０",  # not ASCII digits: ValueError
    "http://[::1]:8765/x",
    "http://[::1",  # ValueError
    "http://user:pw@host:1/",
    "HTTP://Host:1",
    " http://host:1",
    "http://host:1 ",
    "http://ho\tst:1",
    "http://host:1/a b",
    "http://host:1/a?b=c#d",
    "http://host:1/%41",
    "http:///path",
    "http://",
    "ftp://host:1",
    "host:8765",
    "//host:1",
    "",
]


def expected(url: str) -> tuple[str, str | None, int | None, str] | type[ValueError]:
    try:
        parts = urlsplit(url)
        return parts.scheme, parts.hostname, parts.port, parts.path
    except ValueError:
        return ValueError


@pytest.mark.parametrize("url", URLS)
def test_a_url_is_read_as_urlsplit_reads_it(url: str) -> None:
    want = expected(url)
    if want is ValueError:
        with pytest.raises(ValueError):
            urls.split(url)
    else:
        assert urls.split(url) == want


QUERIES: list[Params] = [
    {"limit": 100, "state": ["queued", "held", "running"]},
    {"limit": 1000, "offset": 0, "user": "alice"},
    {"mine": "true", "expand": "true"},
    {"state": []},
    {"user": ""},
    {"user": "a b"},
    {"user": "ünï"},
    {"user": "a&b=c"},
    {"ids": ["1", "2/3"]},
    {"tail": -1},
    {"": "x"},
]


@pytest.mark.parametrize("params", QUERIES)
def test_a_query_is_written_as_urlencode_writes_it(params: Params) -> None:
    assert urls.query(params) == urlencode(params, doseq=True)
