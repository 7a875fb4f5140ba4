"""The API's interactive pages, `/docs` (Swagger UI) and `/redoc`, with their scripts and
style sheets served by the daemon itself: FastAPI's own pages fetch them from a CDN, and a
GPU server is often without internet (the page was blank there).

The assets come from the ``fastapi-offline`` package (Swagger UI 5, which reads the OpenAPI
3.1 FastAPI writes, and ReDoc), read from its folder; nothing of it runs. Like the web
page's ``/static``, they hold no data and need no token.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger("ddpq.server")

ASSETS_URL = "/docs-assets"
# The files each page loads, as the package names them.
SWAGGER_JS, SWAGGER_CSS, REDOC_JS, FAVICON = (
    "swagger-ui-bundle.js",
    "swagger-ui.css",
    "redoc.standalone.js",
    "favicon.png",
)


def assets_folder() -> Path | None:
    """Where fastapi-offline keeps the assets (found, not imported: its module builds
    apps); None without the package (an install that skipped it)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if (folder / SWAGGER_JS).is_file() else None


def add_docs(app: FastAPI) -> None:
    """`/docs`, its OAuth2 redirect page and `/redoc` on ``app`` (made with ``docs_url``
    and ``redoc_url`` None), every asset from ``ASSETS_URL``. Without fastapi-offline (a
    dependency, but an install may lack it) the pages load FastAPI's CDN copies, as
    before, and the daemon says so once."""
    folder = assets_folder()
    if folder is None:
        log.warning(
            "the fastapi-offline package is missing: /docs and /redoc load Swagger UI and "
            "ReDoc from a CDN (blank without internet); pip install fastapi-offline"
        )
        base = None
    else:
        app.mount(ASSETS_URL, StaticFiles(directory=folder), name="docs-assets")
        base = ASSETS_URL
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        title = f"{app.title} API"
        if base is None:
            return get_swagger_ui_html(
                openapi_url=openapi_url, title=title, oauth2_redirect_url=redirect_url
            )
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{base}/{SWAGGER_JS}",
            swagger_css_url=f"{base}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{base}/{FAVICON}",
        )

    @app.get(redirect_url, include_in_schema=False)
    def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        if base is None:
            return get_redoc_html(openapi_url=openapi_url, title=f"{app.title} API")
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{base}/{REDOC_JS}",
            redoc_favicon_url=f"{base}/{FAVICON}",
            with_google_fonts=False,
        )
