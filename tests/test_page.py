"""The built-in page's routes (server/page.py), without a browser: ``GET /`` and the bundle under ``/ui/``, their
types and headers, and what is not served. tests/test_browser_page.py drives the page in Chromium."""

from __future__ import annotations

import urllib.error
import urllib.request
from email.message import Message
from importlib import resources

import pytest

from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import running_app

BUNDLE = {"app.js": "text/javascript", "app.css": "text/css", "capture-worklet.js": "text/javascript"}


@pytest.fixture(scope="module")
def base():
    with running_app(ServerConfig.simulator()) as (url, _):
        yield url.replace("ws://", "http://")


def get(url: str) -> tuple[int, Message, bytes]:
    """(status, headers (case-insensitive), body)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_the_page_is_served_at_the_root_with_a_same_origin_policy(base):
    status, headers, body = get(base + "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    host = base.removeprefix("http://")
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and f"connect-src 'self' ws://{host} wss://{host};" in csp
    html = body.decode()
    assert '<script type="module" src="/ui/app.js"></script>' in html
    assert '<link rel="stylesheet" href="/ui/app.css">' in html
    assert "https://" not in html and "http://" not in html  # no CDN: everything comes from this server


@pytest.mark.parametrize("name", sorted(BUNDLE))
def test_every_asset_is_served_with_its_type_and_matches_the_package_data(base, name):
    status, headers, body = get(base + "/ui/" + name)
    assert status == 200
    assert headers["Content-Type"] == f"{BUNDLE[name]}; charset=utf-8"
    assert "Content-Security-Policy" not in headers
    assert body == resources.files("vllm_omni_voicechat.server").joinpath("static", name).read_bytes()


@pytest.mark.parametrize("path", ["/ui/index.html", "/ui/missing.js", "/ui/", "/ui/../page.py", "/index.html"])
def test_nothing_else_is_served(base, path):
    assert get(base + path)[0] == 404


def test_the_websocket_and_health_routes_are_unchanged(base):
    status, _, body = get(base + "/health")
    assert status == 200 and b'"model_kind":"simulator"' in body


def test_the_bundle_loads_nothing_from_elsewhere():
    static = resources.files("vllm_omni_voicechat.server").joinpath("static")
    names = sorted(f.name for f in static.iterdir())
    assert names == ["app.css", "app.js", "capture-worklet.js", "index.html"]
    for name in names:
        text = static.joinpath(name).read_text()
        assert "http://" not in text and "https://" not in text and "import " not in text.replace("import(", ""), name
