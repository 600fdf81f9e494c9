"""The deploy YAML's ``voicechat:`` block (read with vLLM-Omni's own YAML resolution where installed)."""

from __future__ import annotations

import importlib.util

import pytest

from vllm_omni_voicechat.omni.register import PACKAGED_DEPLOY_CONFIG
from vllm_omni_voicechat.omni.settings import VoicechatSettingsError, parse_block, read_settings


def test_the_block_is_validated_and_typed():
    assert parse_block({"warmup_positions": 2, "function_call_timeout_s": 30, "realtime_default": "tiered"}) == {
        "warmup_positions": 2, "function_call_timeout_s": 30.0, "realtime_default": "tiered"}
    assert parse_block(None) == {}
    assert parse_block({"audio_lag_positions": 2, "settlement_blank_frames": 3}) == {
        "audio_lag_positions": 2, "settlement_blank_frames": 3}
    assert parse_block({"admission_queue": 8, "admission_timeout_s": 20}) == {  # the admission queue
        "admission_queue": 8, "admission_timeout_s": 20.0}
    assert parse_block({"tick_slot_ms": 40}) == {"tick_slot_ms": 40.0}  # the engine tick, at most half a frame
    assert parse_block({"tick_slot_ms": 0}) == {"tick_slot_ms": 0.0}


@pytest.mark.parametrize("block, message", [
    ({"warmup_position": 2}, "unknown keys"),
    ({"warmup_positions": -1}, ">= 0"),
    ({"settlement_blank_frames": 2.5}, "must be int"),
    ({"settlement_blank_frames": True}, "must be int"),
    ({"realtime_default": "v4"}, "one of"),
    ({"admission_queue": -1}, ">= 0"),
    ({"admission_timeout_s": 0}, ">= 0.001"),
    ({"audio_lag_positions": 10}, r"audio_lag_positions \(10\) must be below voicechat.settlement_blank_frames \(10\)"),
    ({"audio_lag_positions": 3, "settlement_blank_frames": 3}, "must be below"),
    ([1], "mapping"),
    ({"tick_slot_ms": 40.5}, r"tick_slot_ms must be at most half a frame \(40\)"),
    ({"tick_slot_ms": -1}, ">= 0.0"),
])
def test_bad_blocks_fail_with_a_clear_message(block, message):
    with pytest.raises(VoicechatSettingsError, match=message):
        parse_block(block)


@pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None, reason="vllm_omni is not installed")
def test_the_packaged_deploy_yaml_block():
    settings = read_settings(PACKAGED_DEPLOY_CONFIG)
    assert settings["warmup_positions"] == 2 and settings["max_session_model_frames"] == 5400
    assert settings["realtime_default"] == "v3" and settings["step_timeout_s"] == 5.0


def _deploy(window, sessions, seqs=(2, 2, 2)):
    return {"active_stream_window": window, "duplex_session": {"max_sessions": sessions},
            "stages": [{"stage_id": i, "max_num_seqs": n} for i, n in enumerate(seqs)]}


def test_every_admitted_session_can_stream_at_once():
    from vllm_omni_voicechat.omni.settings import check_concurrency

    check_concurrency(_deploy(2, 2))
    check_concurrency(_deploy(0, 2))  # 0: vLLM-Omni's unbounded window
    check_concurrency({})
    with pytest.raises(VoicechatSettingsError,
                       match=r"active_stream_window=1 lets only 1 session\(s\) stream .*max_sessions is 2"):
        check_concurrency(_deploy(1, 2))
    with pytest.raises(VoicechatSettingsError, match="stage 2 has max_num_seqs=1 but duplex_session.max_sessions is 2"):
        check_concurrency(_deploy(2, 2, seqs=(2, 2, 1)))


def test_async_scheduling_is_refused_because_our_schedulers_are_synchronous():
    from vllm_omni_voicechat.omni.settings import check_schedulers

    check_schedulers({"stages": [{"stage_id": 0, "async_scheduling": False}, {"stage_id": 1}]})
    with pytest.raises(VoicechatSettingsError, match="stage 1 sets async_scheduling: true"):
        check_schedulers({"stages": [{"stage_id": 0}, {"stage_id": 1, "engine_args": {"async_scheduling": True}}]})


@pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None, reason="vllm_omni is not installed")
@pytest.mark.parametrize("name", ["voicechat.yaml", "voicechat-cpu.yaml"])
def test_the_packaged_yamls_let_every_session_stream(name, tmp_path):
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    from vllm_omni_voicechat.omni.settings import check_concurrency

    path = PACKAGED_DEPLOY_CONFIG.parent / name
    deploy = resolve_deploy_yaml(path)
    check_concurrency(deploy)
    assert deploy["active_stream_window"] == deploy["duplex_session"]["max_sessions"]
    broken = tmp_path / name
    broken.write_text(path.read_text().replace(f"active_stream_window: {deploy['active_stream_window']} ",
                                               "active_stream_window: 1 "))
    with pytest.raises(VoicechatSettingsError, match="active_stream_window=1"):
        read_settings(broken)
