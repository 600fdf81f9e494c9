"""The built-in web page: ``GET /`` and its assets under ``/ui/``, one static bundle shipped as package data.

Plain Starlette ``Route`` objects (no ``Mount``), so the same list works in our app and in front of vLLM-Omni's
API router, whose ``include_router`` copies routes but drops mounts. The files are read once, at import.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

ASSET_PREFIX = "/ui/"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_FILES = {f.name: f.read_bytes() for f in resources.files(__package__).joinpath("static").iterdir()
          if f.is_file() and f.name.endswith(tuple(_TYPES))}


def _headers(request: Request, name: str) -> dict[str, str]:
    headers = {"Content-Type": _TYPES[name[name.rindex("."):]], "Cache-Control": "no-cache",
               "X-Content-Type-Options": "nosniff"}
    if name.endswith(".html"):
        # Same-origin only. The WebSocket origins are spelled out: older engines do not let 'self' cover ws(s).
        host = request.headers.get("host", "")
        headers["Content-Security-Policy"] = (
            f"default-src 'self'; connect-src 'self' ws://{host} wss://{host}; img-src 'self' data:; "
            "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
    return headers


async def index(request: Request) -> Response:
    return Response(_FILES["index.html"], headers=_headers(request, "index.html"))


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name == "index.html" or name not in _FILES:
        return PlainTextResponse("not found", status_code=404)
    return Response(_FILES[name], headers=_headers(request, name))


def page_routes() -> list[Route]:
    """``GET /`` (the page) and ``GET /ui/{name}`` (its scripts and stylesheet)."""
    return [Route("/", index, methods=["GET"]), Route(ASSET_PREFIX + "{name}", asset, methods=["GET"])]
