"""Session length on the real model: the runtime's position guard against Stage 0's ``max_model_len``."""

from __future__ import annotations

import importlib.util

import pytest

from vllm_omni_voicechat.omni.settings import (
    MIN_PROMPT_TOKENS,
    VoicechatSettingsError,
    prompt_token_budget,
    read_settings,
    stage0_max_model_len,
)


def test_the_budget_is_what_a_full_length_session_leaves_for_the_prompt():
    assert prompt_token_budget(8000, 9216) == 1215
    assert prompt_token_budget(8192 - 1 - MIN_PROMPT_TOKENS, 8192) == MIN_PROMPT_TOKENS
    with pytest.raises(VoicechatSettingsError, match=r"leaves 191 prompt tokens .* at most 7167"):
        prompt_token_budget(8000, 8192)


def test_stage0_max_model_len_is_read_from_the_resolved_yaml():
    deploy = {"stages": [{"stage_id": 1, "max_model_len": 5}, {"stage_id": 0, "engine_args": {"max_model_len": 7}}]}
    assert stage0_max_model_len(deploy) == 7
    assert stage0_max_model_len({"stages": [{"stage_id": 0}]}) is None


requires_omni = pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None, reason="vllm_omni is not installed")


@requires_omni
def test_the_packaged_yaml_keeps_room_for_the_prompt_and_a_tight_one_fails_at_startup(tmp_path):
    from vllm_omni_voicechat.omni.register import PACKAGED_DEPLOY_CONFIG

    text = PACKAGED_DEPLOY_CONFIG.read_text()
    assert read_settings(PACKAGED_DEPLOY_CONFIG)["max_session_model_frames"] == 8000
    tight = tmp_path / "tight.yaml"
    tight.write_text(text.replace("max_model_len: 9216", "max_model_len: 8192"))
    with pytest.raises(VoicechatSettingsError, match="leaves 191 prompt tokens"):
        read_settings(tight)
    unset = tmp_path / "unset.yaml"  # the runtime default (12,000 positions) does not fit either
    unset.write_text(text.replace("  max_session_model_frames: 8000\n", ""))
    with pytest.raises(VoicechatSettingsError, match="max_session_model_frames=12000"):
        read_settings(unset)
