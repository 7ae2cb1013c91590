"""The read-only browser page of `flink-memory serve`: a static page (HTML, CSS and JS shipped in this package,
flink_memory/service/ui/; no build step, nothing from a CDN) that calls the same /v1 API as any client.

The page and its files need no key; what it shows comes from the API, so the key decides it as for any
caller. The page keeps a key in the tab only (sessionStorage, never in a URL or localStorage) and sends it in
the Authorization header. Every answer here carries a strict Content-Security-Policy: the page's own files
only, no inline script or style, no frames, forms posting nowhere.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

PAGE_PATH = "/ui/"
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
           "x-frame-options": "DENY", "cache-control": "no-cache"}


def is_page(path: str) -> bool:
    """A path of the page (served without a key: it holds no memory)."""
    return path == "/" or path.startswith(PAGE_PATH)


def asset(name: str) -> bytes:
    return resources.files("flink_memory.service").joinpath("ui", name).read_bytes()


def add_page(app: FastAPI) -> None:
    """The page at /ui/ (and / redirecting to it)."""
    files = {name: asset(name) for name in ASSETS}

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        return RedirectResponse(PAGE_PATH, headers=HEADERS)

    @app.get(PAGE_PATH + "{name:path}", include_in_schema=False)
    def page(name: str) -> Response:
        name = name or "index.html"
        if name not in files:
            return Response(b'{"detail": "not found"}', status_code=404, media_type="application/json",
                            headers=HEADERS)
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)
