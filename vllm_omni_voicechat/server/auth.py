"""API keys, with vLLM's rule: every HTTP request and WebSocket upgrade under ``/v1`` carries
``Authorization: Bearer <key>`` matching one of the keys (compared in constant time); ``/health``, the page and
``/metrics`` stay open. Browsers cannot set headers on a WebSocket upgrade, so the key may also ride in a
``Sec-WebSocket-Protocol`` value, as OpenAI's browser clients send it (``realtime,
openai-insecure-api-key.<key>``); the server echoes only a safe protocol (``realtime``), never the credential.

A refused upgrade is answered 401 before the application sees it: no session state, no slot. Inside
``vllm-omni serve`` vLLM's own ``--api-key`` middleware guards our routes; :class:`SubprotocolCredential` lets a
browser's subprotocol key reach it as the header it checks.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

CREDENTIAL_PREFIX = "openai-insecure-api-key."
SAFE_SUBPROTOCOLS = ("realtime",)
GUARDED_PREFIXES = ("/v1",)
ENV_VAR = "VOICECHAT_API_KEY"


def subprotocol_key(offered: Sequence[str]) -> str | None:
    """The API key a client put in its offered subprotocols, if any."""
    for value in offered:
        if value.startswith(CREDENTIAL_PREFIX):
            return value[len(CREDENTIAL_PREFIX):]
    return None


def safe_subprotocol(offered: Sequence[str]) -> str | None:
    """The subprotocol to echo: the first safe one the client offered (a browser that offered any fails the
    connection when none is echoed), never a credential."""
    for value in offered:
        if value in SAFE_SUBPROTOCOLS:
            return value
    return None


def bearer(headers: Headers) -> str | None:
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def guarded(scope: Scope) -> bool:
    if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
        return False
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    return path.startswith(GUARDED_PREFIXES)


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys if k]
        if not self._digests:
            raise ValueError("at least one non-empty API key")

    def __len__(self) -> int:
        return len(self._digests)

    def matches(self, key: str | None) -> bool:
        """Constant time in the key and over every configured key (no early exit)."""
        if key is None:
            return False
        digest = hashlib.sha256(key.encode()).digest()
        found = False
        for known in self._digests:
            found |= secrets.compare_digest(digest, known)
        return found

    def authorized(self, scope: Scope) -> bool:
        headers = Headers(scope=scope)
        if self.matches(bearer(headers)):
            return True
        return scope["type"] == "websocket" and self.matches(subprotocol_key(scope.get("subprotocols") or ()))


class RequireApiKey:
    """ASGI middleware of the standalone server: 401 ``{"error": "Unauthorized"}`` (vLLM's answer) for a guarded
    request without a valid key, before the app runs."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if guarded(scope) and not self.keys.authorized(scope):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class SubprotocolCredential:
    """Inside ``vllm-omni serve``: a WebSocket upgrade that carries its key only as a subprotocol gets it as the
    ``Authorization`` header too, so vLLM's own middleware (and its keys) decide. Nothing else changes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and bearer(Headers(scope=scope)) is None:
            key = subprotocol_key(scope.get("subprotocols") or ())
            if key is not None:
                scope = {**scope, "headers": [*scope.get("headers", []), (b"authorization", f"Bearer {key}".encode())]}
        await self.app(scope, receive, send)
