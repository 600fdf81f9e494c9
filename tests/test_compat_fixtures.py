"""Smoke tests of tests/compat.py: each skips cleanly where its optional package is absent."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import pytest

from .compat import (
    ga_event_types,
    is_ga_event_type,
    load_duplex_client_module,
    validate_openai_server_event,
    vllm_omni_is_stubbed,
)

# --------------------------------------------------------------------------- DuplexClient


def test_duplex_client_is_importable_with_the_api_the_tests_use():
    duplex = load_duplex_client_module()
    client = duplex.DuplexClient
    for name in ("responses", "ack_playback", "cancel_response", "send", "append_audio", "stream_pcm", "commit"):
        assert callable(getattr(client, name, None)), name
    assert {"SessionConfig", "ReconnectPolicy", "EventCollector", "ResponseHandle"} <= set(dir(duplex))
    if importlib.util.find_spec("vllm") is None:
        # vllm_omni/__init__.py never ran: no version attribute, no torch
        assert vllm_omni_is_stubbed()
        assert not hasattr(sys.modules["vllm_omni"], "__version__")
        assert "torch" not in sys.modules


def test_duplex_client_handshake_and_close_over_installed_websockets():
    """The default transport (``websockets.connect``) against a minimal fake server, with our websockets."""
    duplex = load_duplex_client_module()
    from websockets.asyncio.server import serve

    received: list[dict] = []
    paths: list[str] = []

    async def handler(ws):
        paths.append(ws.request.path)
        async for raw in ws:
            event = json.loads(raw)
            received.append(event)
            if event["type"] == "session.update":
                await ws.send(json.dumps({"type": "session.created", "session": {"id": "sess_1"}, "resume_token": "t"}))
            elif event["type"] == "session.close":
                await ws.send(json.dumps({"type": "session.closed", "reason": "client"}))

    async def main():
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = duplex.DuplexClient(
                f"ws://127.0.0.1:{port}", model="sim", reconnect=None, heartbeat_interval_s=None, handshake_timeout_s=5
            )
            async with client:
                assert client.session_id == "sess_1"
                assert client.resume_token == "t"
                await client.ack_playback(120, response_id="r1")

    asyncio.run(asyncio.wait_for(main(), 10))
    assert paths and paths[0].startswith("/v1/realtime?") and "duplex=1" in paths[0] and "autostart=0" in paths[0]
    assert [e["type"] for e in received] == ["session.update", "playback.ack", "session.close"]
    assert received[0]["session"]["model"] == "sim"
    assert received[1]["played_ms"] == 120 and received[1]["committed_ms"] == 120


# --------------------------------------------------------------------------- openai GA types


def test_known_ga_event_validates():
    model = validate_openai_server_event({"type": "rate_limits.updated", "event_id": "e", "rate_limits": []})
    assert model.type == "rate_limits.updated"


def test_invalid_ga_event_raises_assertion_with_pydantic_message():
    with pytest.raises(AssertionError, match="response.output_audio.delta"):
        validate_openai_server_event({"type": "response.output_audio.delta", "event_id": "e"})  # no delta/ids
    with pytest.raises(AssertionError, match="not an OpenAI GA"):
        validate_openai_server_event({"type": "response.speak", "event_id": "e"})


def test_ga_type_set_is_derived_from_the_union():
    types = ga_event_types()
    assert len(types) >= 40
    for ga in ("session.created", "response.output_audio.delta", "response.done", "error", "rate_limits.updated"):
        assert is_ga_event_type(ga), ga
    # Tier-3 (vLLM-Omni duplex) and beta spellings are not GA
    tier3_and_beta = (
        "response.speak",
        "response.listen",
        "session.resumed",
        "playback.acknowledged",
        "response.audio.delta",
    )
    for other in tier3_and_beta:
        assert not is_ga_event_type(other), other
