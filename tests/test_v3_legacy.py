"""The contract's diagnostic RNNT-owned v3 mode (§0, §3.1, §4; docs/v3-dialect.md "Legacy turns") over a real
WebSocket: its capabilities, ``turn_start`` / ``commit`` answered with the recoverable ``unsupported_event``, a
spoken turn opened by the onset gate with its pre-roll and ended by the model's own fence, and the position guard
mid pre-roll drain. Selected by ``serve --v3-turns legacy`` and the deploy YAML's ``voicechat.v3_turns``."""

from __future__ import annotations

import base64

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.cli import build_parser
from vllm_omni_voicechat.omni.settings import VoicechatSettingsError, parse_block
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import RawClient, running_app

UPDATE = {"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3}}
LOUD = bytes([0x00, 0x40] * (INPUT_FRAME_BYTES // 2))  # far above the -40 dBFS gate
QUIET = bytes(INPUT_FRAME_BYTES)


def append(pcm: bytes, event_id: str) -> dict:
    return {"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16", "sample_rate": 16000,
            "channels": 1, "audio": base64.b64encode(pcm).decode()}


def frames(pcm: bytes) -> list[bytes]:
    pcm += bytes(-len(pcm) % INPUT_FRAME_BYTES)
    return [pcm[i:i + INPUT_FRAME_BYTES] for i in range(0, len(pcm), INPUT_FRAME_BYTES)]


def legacy_config(**kw) -> ServerConfig:
    return ServerConfig.simulator(settlement_blank_frames=3, v3_turns="legacy", **kw)


def connect(url: str) -> tuple[RawClient, dict]:
    c = RawClient(url + "/v1/realtime")
    created = c.recv()
    assert created["type"] == "session.created"
    return c, created


def test_legacy_capabilities_and_turn_barriers_unsupported():
    with running_app(legacy_config()) as (url, _):
        c, created = connect(url)
        caps = created["capabilities"]
        assert (caps["server_turn_detection"], caps["input_turn_detection"]) == ("rnnt", "server_rnnt")
        c.send(UPDATE)
        updated = c.recv_type("session.updated")
        caps = updated["capabilities"]
        assert (caps["server_turn_detection"], caps["input_turn_detection"]) == ("rnnt", "server_rnnt")
        for kind, eid in (("turn_start", "s1"), ("commit", "c1")):
            c.send({"type": f"input_audio_buffer.{kind}", "event_id": eid, "client_turn_id": 1})
            err = c.recv()
            assert err["type"] == "error"
            assert err["error"] == {"code": "unsupported_event", "fatal": False, "client_event_id": eid,
                                    "message": f"Unsupported event: input_audio_buffer.{kind}"}
        c.send({"type": "session.stop", "event_id": "stop"})
        assert c.recv_type("session.closed")["reason"] == "client_stop"
        assert (c.close_code(), c.close_reason) == (1000, "client_stop")


def test_production_capabilities_by_default():
    with running_app(ServerConfig.simulator(settlement_blank_frames=3)) as (url, _):
        c, created = connect(url)
        caps = created["capabilities"]
        assert (caps["server_turn_detection"], caps["input_turn_detection"]) == (None, "client_smart_turn_v1")
        c.close()


def test_a_spoken_turn_opened_by_the_gate_with_its_preroll_and_ended_by_the_model_fence():
    with running_app(legacy_config()) as (url, _):
        c, created = connect(url)
        sid = created["session_id"]
        c.send(UPDATE)
        c.recv_type("session.updated")
        # 5 quiet frames (the gate holds them: idle metrics), then speech and trailing silence
        audio = [QUIET] * 5 + frames(render_speech("hello there")) + [QUIET] * 6
        for i, pcm in enumerate(audio):
            c.send(append(pcm, f"a{i}"))
        events = c.recv_until(lambda e: e["type"] == "response.done", skip_metrics=False)
        metrics = [e for e in events if e["type"] == "voicechat.metrics"]
        assert [m["frame"] for m in metrics[:5]] == [None] * 5  # held by the gate: no model position
        positions = [m for m in metrics if m["frame"] is not None]
        # the pre-roll replays the onset suffix: from the first loud frame (transport 5) minus 2 context frames,
        # keeping the transport numbers
        assert [m["transport_frame"] for m in positions[:4]] == [3, 4, 5, 6]
        assert [m["frame"] for m in positions[:4]] == [0, 1, 2, 3]
        rest = [e for e in events if e["type"] not in ("voicechat.metrics", "response.output_audio.delta")]
        turn = f"turn_{sid}_1"
        response = f"response_{sid}_1"
        assert [e["type"] for e in rest] == [
            "input_audio_buffer.speech_started",
            "conversation.item.input_audio_transcription.delta",
            "conversation.item.input_audio_transcription.delta",
            "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            *["response.output_text.delta"] * 7,
            "response.output_text.done", "response.output_audio.done", "response.done",
        ]
        started = rest[0]
        assert {k: started[k] for k in ("turn_id", "source", "job_id", "correlation")} == {
            "turn_id": turn, "source": "microphone", "job_id": None, "correlation": None}
        assert "input_audio_buffer.turn_started" not in [e["type"] for e in events]
        assert "input_audio_buffer.committed" not in [e["type"] for e in events]
        completed = rest[4]
        assert (completed["turn_id"], completed["transcript"], completed["empty"]) == (turn, "hello there", False)
        assert (rest[5]["turn_id"], rest[5]["response_id"]) == (turn, response)
        assert rest[-3]["text"] == "You said: hello there."
        assert (rest[-1]["status"], rest[-1]["reason"]) == ("completed", "post_eos_audio_silence")
        # the model's fence ended the turn: settlement ran without a client commit
        c.send({"type": "session.stop", "event_id": "stop"})
        closed = c.recv_type("session.closed")
        assert (closed["status"], closed["reason"]) == ("completed", "client_stop")
        assert (c.close_code(), c.close_reason) == (1000, "client_stop")


def test_the_position_guard_applies_mid_preroll_drain():
    with running_app(legacy_config(max_session_model_frames=3)) as (url, _):
        c, created = connect(url)
        sid = created["session_id"]
        c.send(UPDATE)
        c.recv_type("session.updated")
        for i, pcm in enumerate([QUIET] * 5 + [LOUD] * 4):
            c.send(append(pcm, f"a{i}"))
        events = c.recv_until(lambda e: e["type"] == "session.closed", skip_metrics=False)
        positions = [e for e in events if e["type"] == "voicechat.metrics" and e["frame"] is not None]
        # the gate opened on the third loud frame and released transport frames 3..7; the guard stops the drain
        assert [(m["frame"], m["transport_frame"]) for m in positions] == [(0, 3), (1, 4), (2, 5)]
        rest = [e for e in events if e["type"] not in ("voicechat.metrics", "response.output_audio.delta")]
        turn = f"turn_{sid}_1"
        assert [e["type"] for e in rest] == [
            "input_audio_buffer.speech_started", "error", "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed", "session.closed",
        ]
        assert rest[0]["turn_id"] == turn
        err = rest[1]["error"]
        assert err == {"code": "session_position_limit", "message": err["message"], "fatal": True,
                       "model_frames": 3, "max_model_frames": 3}
        assert (rest[-1]["status"], rest[-1]["reason"]) == ("failed", "session_position_limit")
        assert (c.close_code(), c.close_reason) == (1000, "session_position_limit")


def test_selected_by_the_cli_and_the_deploy_yaml():
    assert build_parser().parse_args(["serve"]).v3_turns == "client"
    assert build_parser().parse_args(["serve", "--v3-turns", "legacy"]).v3_turns == "legacy"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--v3-turns", "rnnt"])
    assert parse_block({"v3_turns": "legacy"}) == {"v3_turns": "legacy"}
    assert ServerConfig(**parse_block({"v3_turns": "legacy"})).v3_turns == "legacy"  # what omni/mount.py builds
    with pytest.raises(VoicechatSettingsError, match="v3_turns must be one of client, legacy"):
        parse_block({"v3_turns": "server"})
    assert ServerConfig().v3_turns == "client"
