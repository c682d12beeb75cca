"""The reviewer console (ADR-0026): static files shipped in the package
(`api/console_assets/`, package data), served by every `fanout serve` under `/console/`.

The page asks for an admin token and calls only the public admin API with it, so it holds
no privilege of its own: these routes need no token and serve the same bytes to anyone. A
strict Content-Security-Policy keeps to the page's own files (no inline script or style, no
other origin), and the token stays in the tab's sessionStorage, never in a URL."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from api.endpoint import endpoint
from domain.errors import NotFound

ASSETS = Path(__file__).resolve().parent / "console_assets"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _file(name: str) -> web.Response:
    path = ASSETS / name
    # Only the files of the folder itself: no sub-paths, no dot files, known types.
    if "/" in name or name.startswith(".") or path.suffix not in TYPES or not path.is_file():
        raise NotFound(f"no console asset {name}", asset=name)
    return web.Response(body=path.read_bytes(), headers={**HEADERS, "Content-Type": TYPES[path.suffix]})


@endpoint("The reviewer console: /console redirects to /console/", roles=None, ok=302)
async def console_redirect(request: web.Request, who: None, data: None) -> web.Response:
    raise web.HTTPFound("/console/")


@endpoint(
    "The reviewer console (HTML): asks for an admin token and uses the admin API below",
    roles=None,
    description="A static page; Content-Security-Policy: " + CSP,
)
async def console_page(request: web.Request, who: None, data: None) -> web.Response:
    return _file("index.html")


@endpoint("A static file of the reviewer console (its script and style sheet)", roles=None)
async def console_asset(request: web.Request, who: None, data: None) -> web.Response:
    return _file(request.match_info["asset"])
