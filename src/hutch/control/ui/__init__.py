"""The management web UI: a single-page application served by the management HTTP listener.

RabbitMQ's management plugin serves its UI on the same port as its HTTP API; so does hutch.
This module only serves files: `GET /` and `GET /index.html` answer the page, and
`GET /ui/...` the style sheet and the JavaScript modules shipped in `static/` beside this
file. Everything the page shows or changes it asks of the `/api/...` routes with the user's
own basic credentials, so the UI can never do more than the API lets that user do.

It must never read or change the broker itself, never serve a file from outside `static/`,
and never answer a path under `/api/` (unknown API paths stay JSON 404s).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent / "static"
ASSET_PREFIX = "/ui"
# The page runs only its own files: no inline or foreign scripts, no framing by other sites.
# (Inline style attributes are allowed: the charts and gauges size their bars with them.)
_PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)


def register(app: web.Application) -> None:
    """Add the UI's routes to the management application."""
    app.router.add_get("/", index)
    app.router.add_get("/index.html", index)
    # aiohttp's static resource refuses paths that leave the directory and answers 404 for
    # missing files (the API middleware turns that into the usual JSON 404).
    app.router.add_static(ASSET_PREFIX + "/", STATIC_DIR, follow_symlinks=False, append_version=False)
