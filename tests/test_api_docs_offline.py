"""`/docs` and `/redoc` work without internet (issue 26, item 12): every script, style sheet
and icon they load is the daemon's own, served without a token, and is what it says."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from ddpq.server import apidocs
from tests.inprocess import make_client


@pytest.fixture
def api(tmp_path: Path) -> TestClient:
    return make_client(tmp_path, auth=True)  # no token anywhere below


def loaded(html: str) -> list[str]:
    """Every URL a page loads by itself: scripts, style sheets, icons, fonts."""
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(
        r"""url\s*:\s*["']([^"']+)["']""", html
    )


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_a_page_loads_only_the_daemons_own_assets_and_each_is_served(
    api: TestClient, page: str
) -> None:
    r = api.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = loaded(r.text)
    assert urls, r.text
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{page} loads {url} from elsewhere"
        assert url.startswith("/"), url
    for url in urls:
        asset = api.get(url)
        assert asset.status_code == 200, (url, asset.status_code)
        assert asset.content, url
    assert "cdn" not in r.text.lower() and "googleapis" not in r.text


@pytest.mark.parametrize(
    ("name", "kind", "marker"),
    [
        (apidocs.SWAGGER_JS, "javascript", b"SwaggerUIBundle"),
        (apidocs.SWAGGER_CSS, "text/css", b".swagger-ui"),
        (apidocs.REDOC_JS, "javascript", b"Redoc"),
    ],
)
def test_the_assets_are_what_the_pages_expect(
    api: TestClient, name: str, kind: str, marker: bytes
) -> None:
    r = api.get(f"{apidocs.ASSETS_URL}/{name}")
    assert r.status_code == 200 and kind in r.headers["content-type"]
    assert marker in r.content


def test_swagger_ui_reads_the_openapi_version_fastapi_writes(api: TestClient) -> None:
    """Swagger UI 4 shows nothing for OpenAPI 3.1 ("no valid version field"): the bundle
    served must be Swagger UI 5 when the schema is 3.1."""
    version = api.get("/openapi.json").json()["openapi"]
    bundle = api.get(f"{apidocs.ASSETS_URL}/{apidocs.SWAGGER_JS}").content
    if version.startswith("3.1"):
        assert re.search(rb'"5\.\d+\.\d+"', bundle)


@pytest.mark.parametrize(
    "path", ["../app.py", "..%2F..%2Fconfig.py", "%2e%2e/etc/passwd", "nope.js"]
)
def test_nothing_but_the_assets_is_served_from_there(api: TestClient, path: str) -> None:
    r = api.get(f"{apidocs.ASSETS_URL}/{path}")
    assert r.status_code == 404


def test_without_the_package_the_pages_still_work_from_the_cdn_and_the_daemon_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(apidocs, "assets_folder", lambda: None)
    with caplog.at_level("WARNING", logger="ddpq.server"):
        api = make_client(tmp_path)
    assert "fastapi-offline package is missing" in caplog.text
    for page in ("/docs", "/redoc"):
        r = api.get(page)
        assert r.status_code == 200 and "https://" in r.text
    assert api.get(f"{apidocs.ASSETS_URL}/{apidocs.SWAGGER_JS}").status_code == 404
