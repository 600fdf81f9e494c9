"""Session length on the real model: the runtime's position guard against Stage 0's ``max_model_len``."""

from __future__ import annotations

import importlib.util

import pytest

from vllm_omni_voicechat.omni.settings import (
    MIN_PROMPT_TOKENS,
    TALKER_TOKENS_PER_POSITION,
    VoicechatSettingsError,
    check_talker_length,
    prompt_token_budget,
    read_settings,
    stage0_max_model_len,
    talker_lengths,
)


def test_the_budget_is_what_a_full_length_session_leaves_for_the_prompt():
    assert prompt_token_budget(8000, 9216) == 1215
    assert prompt_token_budget(5400, 9216) == 3815
    assert prompt_token_budget(8192 - 1 - MIN_PROMPT_TOKENS, 8192) == MIN_PROMPT_TOKENS
    with pytest.raises(VoicechatSettingsError, match=r"leaves 191 prompt tokens .* at most 7167"):
        prompt_token_budget(8000, 8192)


def test_stage0_max_model_len_is_read_from_the_resolved_yaml():
    deploy = {"stages": [{"stage_id": 1, "max_model_len": 5}, {"stage_id": 0, "engine_args": {"max_model_len": 7}}]}
    assert stage0_max_model_len(deploy) == 7
    assert stage0_max_model_len({"stages": [{"stage_id": 0}]}) is None


def test_the_talker_request_must_hold_a_full_length_session():
    """Stage 1's request grows up to 3 tokens a position (the CPU engine stalled at 680 positions with 2,048)."""
    assert TALKER_TOKENS_PER_POSITION == 3
    check_talker_length(1000, 8192, 8155, 37)  # the CPU YAML
    check_talker_length(5400, 16384, 16347, 37)  # the GPU YAML
    check_talker_length(5449, 16384, 16347, 37)  # the most 16,384 holds
    with pytest.raises(VoicechatSettingsError, match=r"needs 3037 tokens .* is 2048: lower it to at most 670"):
        check_talker_length(1000, 2048, None, 37)  # what stalled on the CPU engine
    with pytest.raises(VoicechatSettingsError, match=r"needs 3000 generated tokens .* is 2047: .* at most 682"):
        check_talker_length(1000, 8192, 2047, 37)
    with pytest.raises(VoicechatSettingsError, match="max_model_len is 16384: lower it to at most 5449"):
        check_talker_length(8000, 16384, 16347, 37)  # the 8,000-position guard the GPU YAML had
    check_talker_length(10**6, None, None)  # a YAML silent on Stage 1 is not checked


def test_talker_lengths_are_read_from_the_resolved_yaml():
    deploy = {"stages": [{"stage_id": 1, "max_model_len": 4096, "hf_overrides": {"talker_init_len": 37},
                          "default_sampling_params": {"max_tokens": 4059}}]}
    assert talker_lengths(deploy) == (4096, 4059, 37)
    assert talker_lengths({"stages": [{"stage_id": 1, "engine_args": {"max_model_len": 9}}]}) == (9, None, 0)
    assert talker_lengths({"stages": []}) == (None, None, 0)


requires_omni = pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None, reason="vllm_omni is not installed")


@requires_omni
def test_the_packaged_yaml_keeps_room_for_the_prompt_and_a_tight_one_fails_at_startup(tmp_path):
    from vllm_omni_voicechat.omni.register import PACKAGED_DEPLOY_CONFIG

    text = PACKAGED_DEPLOY_CONFIG.read_text()
    assert read_settings(PACKAGED_DEPLOY_CONFIG)["max_session_model_frames"] == 5400
    tight = tmp_path / "tight.yaml"
    tight.write_text(text.replace("max_model_len: 9216", "max_model_len: 6400"))
    with pytest.raises(VoicechatSettingsError, match="leaves 999 prompt tokens"):
        read_settings(tight)
    talker = tmp_path / "talker.yaml"  # the talker's request is checked too
    talker.write_text(text.replace("  max_session_model_frames: 5400\n", "  max_session_model_frames: 6000\n"))
    with pytest.raises(VoicechatSettingsError, match="Stage 1's request"):
        read_settings(talker)
    unset = tmp_path / "unset.yaml"  # the runtime default (12,000 positions) does not fit either
    unset.write_text(text.replace("  max_session_model_frames: 5400\n", ""))
    with pytest.raises(VoicechatSettingsError, match="max_session_model_frames=12000"):
        read_settings(unset)


@requires_omni
def test_the_cpu_yaml_fits_its_guard_and_the_stage1_length_that_stalled_fails_at_startup(tmp_path):
    from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY

    assert read_settings(CPU_DEPLOY)["max_session_model_frames"] == 1000
    stalled = tmp_path / "stalled.yaml"  # Stage 1 as it was when a burst-fed session stalled at 680 positions
    stalled.write_text(CPU_DEPLOY.read_text().replace("    max_model_len: 8192 ", "    max_model_len: 2048 ", 1))
    with pytest.raises(VoicechatSettingsError, match="max_model_len is 2048: lower it to at most 670"):
        read_settings(stalled)
