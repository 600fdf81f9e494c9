"""``VoiceChatDuplexPlugin`` against the real vLLM-Omni 0.30.0 plugin contract (skipped without vllm_omni)."""

from __future__ import annotations

import importlib.util

import asyncio
import base64
import inspect
from dataclasses import fields
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm_omni")

from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm_omni.engine.duplex.config import DuplexCapabilities, DuplexSessionConfig  # noqa: E402
from vllm_omni.engine.duplex.contracts import DuplexFence, DuplexOutputAction  # noqa: E402
from vllm_omni.engine.duplex.plugin import (  # noqa: E402
    DefaultDuplexModelSessionState,
    DuplexDataPlane,
    DuplexModelPlugin,
    DuplexRuntimeConfigError,
    load_duplex_plugin,
    validate_duplex_plugin_sampling,
)
from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio  # noqa: E402
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin import (  # noqa: E402
    NemotronVoiceChatDuplexPlugin,
)

from vllm_omni_voicechat.model.prompt import TOOLS_CLOSE, TOOLS_OPEN, tools_from_prompt  # noqa: E402
from vllm_omni_voicechat.omni.plugin import (  # noqa: E402
    PLUGIN_PATH,
    PRIVATE_RUNTIME_CONFIG_KEYS,
    VC_MAX_SESSION_MODEL_FRAMES,
    VC_RENDERED_PROMPT,
    VC_TALKER_SEED,
    VoiceChatDataPlane,
    VoiceChatDuplexPlugin,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "parameters": {}}},
    {"name": "set-timer", "description": "Start a timer."},
]
STAGES = 3


def _defaults() -> tuple[SamplingParams, ...]:
    return tuple(SamplingParams() for _ in range(STAGES))


@pytest.fixture(scope="module")
def plugin() -> VoiceChatDuplexPlugin:
    loaded = load_duplex_plugin(PLUGIN_PATH, encode_audio)
    assert isinstance(loaded, VoiceChatDuplexPlugin)
    return loaded


class _FakeTokenizer:
    """Characters -> ids (enough to check the prompt shape without checkpoint files)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert add_special_tokens is False
        return [1000 + (ord(c) % 500) for c in text]


SPECIAL = {
    "nvc_text_bos_id": 1,
    "nvc_text_eos_id": 2,
    "nvc_text_pad_id": 12,
    "nvc_function_sotc_id": 20,
    "nvc_function_eotc_id": 21,
    "nvc_function_eotr_id": 22,
    "nvc_tokenizer_ref": "fake/tokenizer",
}


@pytest.fixture()
def fresh(monkeypatch) -> VoiceChatDuplexPlugin:
    p = VoiceChatDuplexPlugin(encode_audio)

    async def fake_runtime(model_config):
        return dict(SPECIAL), _FakeTokenizer()

    monkeypatch.setattr(p, "_tokenizer_runtime", fake_runtime)
    return p


def _config(**kw) -> DuplexSessionConfig:
    return DuplexSessionConfig(**kw)


def _frame() -> dict[str, object]:
    audio = base64.b64encode(b"\x00" * 1280 * 4).decode("ascii")
    return {"type": "audio", "audio": audio, "format": "pcm_f32le", "sample_rate_hz": 16000, "final": False}


# ---- loading and sampling ----


def test_loads_through_load_duplex_plugin(plugin):
    assert plugin.plugin_id == "nemotron_voicechat_runtime"
    assert isinstance(plugin.data_plane, VoiceChatDataPlane)
    assert isinstance(plugin.data_plane, DuplexDataPlane)
    assert plugin.silence_continuation_samples == 1280


def test_sampling_passes_validation_and_is_the_stage0_contract(plugin):
    defaults = _defaults()
    validate_duplex_plugin_sampling(plugin, sampling_defaults=defaults)
    configured = plugin.configure_sampling_params(runtime_config={}, defaults=defaults)
    assert len(configured) == STAGES
    stage0 = configured[0]
    assert stage0.temperature == 0.0
    assert stage0.max_tokens == 1
    assert stage0.ignore_eos is True
    assert all(p.output_kind == RequestOutputKind.DELTA for p in configured)
    assert defaults[0].max_tokens != 1  # the defaults were cloned, not mutated


# ---- capabilities ----


def test_capabilities_advertise_the_runtime(plugin):
    caps = plugin.capabilities(max_sessions=4)
    assert isinstance(caps, DuplexCapabilities)
    assert caps.chunk_period_ms == 80
    assert caps.supports_multi_session and caps.supports_multi_session_same_replica
    assert caps.supports_session_resume and caps.supports_session_lease
    assert caps.supports_barge_in
    # typed input: true exactly when the engine can synthesize it (Pocket TTS, extra `pocket`)
    assert caps.supports_text_only_turn == (importlib.util.find_spec("pocket_tts") is not None)
    assert caps.supports_model_native_turn_policy
    assert caps.optional_input_modalities == frozenset()
    published = caps.as_dict()
    assert published["chunk_period_ms"] == 80 and published["supports_barge_in"] is True
    assert plugin.capabilities(max_sessions=1).supports_multi_session is False


# ---- extra_body ----


@pytest.mark.parametrize("key", sorted(PRIVATE_RUNTIME_CONFIG_KEYS))
def test_private_runtime_keys_are_rejected(plugin, key):
    with pytest.raises(DuplexRuntimeConfigError, match=key):
        plugin.validate_client_extra_body({key: 1})


def test_private_keys_cover_ours_and_the_delegates():
    assert {VC_MAX_SESSION_MODEL_FRAMES, "vc_settlement_blank_frames", "vc_function_call_timeout_s"} <= (
        PRIVATE_RUNTIME_CONFIG_KEYS
    )
    assert NemotronVoiceChatDuplexPlugin.private_runtime_config_keys <= PRIVATE_RUNTIME_CONFIG_KEYS


def test_public_extra_body_and_valid_tools_pass(plugin):
    plugin.validate_client_extra_body({"auto_response": True, "realtime_tools": TOOLS})
    plugin.validate_client_extra_body(None)


def test_invalid_tools_are_rejected_with_invalid_tools(plugin):
    with pytest.raises(DuplexRuntimeConfigError) as info:
        plugin.validate_client_extra_body({"realtime_tools": [{"name": "bad name"}]})
    assert info.value.code == "invalid_tools"


def test_more_than_five_tools_are_allowed(plugin):
    # The in-tree plugin caps tools at 5; our runtime normalizes up to 32.
    plugin.validate_client_extra_body({"realtime_tools": [{"name": f"t{i}"} for i in range(12)]})


# ---- prompt and runtime config ----


def test_rendered_prompt_has_the_tool_block(plugin):
    text = plugin.render_prompt(_config(instructions="Be brief.", extra_body={"realtime_tools": TOOLS}))
    assert text.startswith("Be brief.")
    assert TOOLS_OPEN in text and TOOLS_CLOSE in text and "<TOOLCALL>" in text
    assert [t.name for t in tools_from_prompt(text)] == ["get_weather", "set-timer"]
    assert TOOLS_OPEN not in plugin.render_prompt(_config(instructions="Be brief."))


def test_prepare_runtime_config_tokenizes_our_prompt(fresh):
    config = _config(instructions="Be brief.", extra_body={"realtime_tools": TOOLS})
    model_config = SimpleNamespace(max_model_len=8192)
    runtime = asyncio.run(fresh.prepare_runtime_config(config, model_config=model_config))
    rendered = runtime[VC_RENDERED_PROMPT]
    assert TOOLS_OPEN in rendered
    ids = runtime["nvc_prompt_token_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and ids[1:-1] == _FakeTokenizer().encode(rendered)
    assert runtime["nvc_max_model_len"] == 8192
    assert runtime[VC_MAX_SESSION_MODEL_FRAMES] > 0
    assert set(runtime) - {"instructions"} <= PRIVATE_RUNTIME_CONFIG_KEYS


def test_the_talker_seed_is_the_prompts_or_the_clients_and_becomes_stage_1s_sampling_seed(fresh):
    model_config = SimpleNamespace(max_model_len=8192)

    def runtime(**kw):
        return asyncio.run(fresh.prepare_runtime_config(_config(**kw), model_config=model_config))

    brief, brief_again, other = runtime(instructions="Be brief."), runtime(instructions="Be brief."), runtime()
    assert brief[VC_TALKER_SEED] == brief_again[VC_TALKER_SEED] != other[VC_TALKER_SEED]  # same prompt, same seed
    chosen = runtime(instructions="Be brief.", extra_body={"voicechat_seed": 7})
    assert chosen[VC_TALKER_SEED] == 7
    defaults = _defaults()
    configured = fresh.configure_sampling_params(runtime_config=chosen, defaults=defaults)
    assert [p.seed for p in configured] == [None, 7, None]
    assert defaults[1].seed is None  # cloned, not mutated
    validate_duplex_plugin_sampling(fresh, sampling_defaults=defaults)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "7", True])
def test_a_bad_voicechat_seed_is_rejected_with_invalid_seed(plugin, seed):
    with pytest.raises(DuplexRuntimeConfigError) as info:
        plugin.validate_client_extra_body({"voicechat_seed": seed})
    assert info.value.code == "invalid_seed"


def test_prepare_runtime_config_requires_max_model_len(fresh):
    with pytest.raises(DuplexRuntimeConfigError):
        asyncio.run(fresh.prepare_runtime_config(_config(), model_config=None))


def test_update_rejects_instruction_and_tool_changes_and_keeps_runtime(fresh):
    config = _config(instructions="A", extra_body={"realtime_tools": TOOLS})
    runtime = asyncio.run(fresh.prepare_runtime_config(config, model_config=SimpleNamespace(max_model_len=8192)))
    assert fresh.runtime_config_for_update(config, runtime) == runtime
    with pytest.raises(DuplexRuntimeConfigError) as a:
        fresh.runtime_config_for_update(_config(instructions="B", extra_body={"realtime_tools": TOOLS}), runtime)
    assert a.value.code == "immutable_instructions"
    with pytest.raises(DuplexRuntimeConfigError) as b:
        fresh.runtime_config_for_update(_config(instructions="A"), runtime)
    assert b.value.code == "immutable_tools"


# ---- append planning and outputs ----


def _plan(p, runtime, seq):
    return p.plan_append(
        request_id="r",
        fence=DuplexFence(session_id="s"),
        session_config={},
        runtime_config=runtime,
        seq=seq,
        turn_seq=seq,
        payload=_frame(),
        final=False,
        sampling_params=None,
    )


def test_plan_append_prefills_then_one_pad_per_position_and_enforces_our_limit(fresh):
    runtime = asyncio.run(fresh.prepare_runtime_config(_config(), model_config=SimpleNamespace(max_model_len=8192)))
    first = _plan(fresh, runtime, 1).prompt
    assert first["prompt_token_ids"] == [*runtime["nvc_prompt_token_ids"], 12]
    assert _plan(fresh, runtime, 2).prompt["prompt_token_ids"] == [12]
    limited = {**runtime, VC_MAX_SESSION_MODEL_FRAMES: 3}
    _plan(fresh, limited, 3)
    with pytest.raises(ValueError, match="session_position_limit"):
        _plan(fresh, limited, 4)


def test_decide_output_and_session_state(plugin):
    decision = plugin.decide_output(
        stage_id=0,
        final_stage_id=2,
        segment_finished=False,
        segment_token_ids=(12,),
        segment_output_metadata={},
        output=None,
    )
    assert decision.action is DuplexOutputAction.DIRECT_RESPONSE
    assert decision.metadata["nvc_text_token_ids"] == [12]
    later = dict(segment_finished=False, segment_token_ids=(), segment_output_metadata={}, output=None)
    assert plugin.decide_output(stage_id=1, final_stage_id=2, **later) is None
    assert isinstance(plugin.create_session_state(), DefaultDuplexModelSessionState)
    context = plugin.data_plane_context(
        epoch=1,
        turn_id=2,
        active_response_turn_id=None,
        active_response_id=None,
        auto_responds=True,
        response_format="pcm16",
        speed=None,
        modalities=("text", "audio"),
    )
    assert context.epoch == 1 and context.response_format == "pcm16"


# ---- the 0.30.0 shapes this adapter depends on (fail loudly when vLLM-Omni changes them) ----


def test_duplex_model_plugin_abstract_methods_are_the_030_set():
    assert DuplexModelPlugin.__abstractmethods__ == frozenset(
        {
            "configure_sampling_params",
            "plan_append",
            "decide_output",
            "create_session_state",
            "capabilities",
            "validate_client_extra_body",
            "prepare_runtime_config",
            "runtime_config_for_update",
            "data_plane_context",
        }
    )
    assert VoiceChatDuplexPlugin.__abstractmethods__ == frozenset()
    assert DuplexDataPlane.__abstractmethods__ == frozenset(
        {"begin_request", "is_terminal", "mark_terminal", "close_stream", "close_session", "project"}
    )


def test_loader_and_hook_signatures_are_the_030_shapes():
    assert list(inspect.signature(load_duplex_plugin).parameters) == ["path", "encode_audio"]
    assert list(inspect.signature(validate_duplex_plugin_sampling).parameters) == ["plugin", "sampling_defaults"]
    encode_params = ["audio_data", "sample_rate_hz", "response_format", "speed"]
    assert list(inspect.signature(encode_audio).parameters) == encode_params
    for name in DuplexModelPlugin.__abstractmethods__ | {
        "runtime_config_for_function_output",
        "runtime_config_after_model_output",
    }:
        base = inspect.signature(getattr(DuplexModelPlugin, name))
        ours = inspect.signature(getattr(VoiceChatDuplexPlugin, name))
        assert list(ours.parameters) == list(base.parameters), name
        assert [p.kind for p in ours.parameters.values()] == [p.kind for p in base.parameters.values()], name


def test_private_tokenizer_seam_exists():
    # vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin.NemotronVoiceChatDuplexPlugin._tokenizer_runtime
    seam = NemotronVoiceChatDuplexPlugin._tokenizer_runtime
    assert inspect.iscoroutinefunction(seam)
    assert list(inspect.signature(seam).parameters) == ["self", "model_config"]
    # The delegate's data plane is replaced by ours (shared, engine-scoped): the attribute must stay public.
    assert "data_plane" in vars(VoiceChatDuplexPlugin(encode_audio)._nemotron)


def test_capability_fields_we_set_exist():
    names = {f.name for f in fields(DuplexCapabilities)}
    assert {
        "chunk_period_ms",
        "supports_multi_session",
        "supports_multi_session_same_replica",
        "supports_session_lease",
        "supports_session_resume",
        "supports_barge_in",
        "supports_text_only_turn",
        "optional_input_modalities",
    } <= names


def test_our_per_position_outputs_are_kept_latest_only_not_accumulated_for_the_sessions_life(plugin):
    """vLLM-Omni's output processor keeps a request's multimodal outputs for its life and concatenates the history
    on every finished segment (a duplex session finishes one every position): our keys keep the latest only."""
    import torch
    from vllm_omni.outputs.mm_outputs import MultimodalPayload
    from vllm_omni.outputs.output_modality import OutputModality, TensorAccumulationStrategy, get_accumulation_strategy

    from vllm_omni_voicechat.omni.plugin import LATEST_ONLY_KEYS

    for key in LATEST_ONLY_KEYS:
        for modality in (OutputModality.TEXT, OutputModality.LATENT, OutputModality.AUDIO):
            assert get_accumulation_strategy(modality, key) is TensorAccumulationStrategy.REPLACE, key
    accumulated = MultimodalPayload()
    for position in range(50):  # what OmniRequestState does with each position's output, then consolidates
        incoming = MultimodalPayload.from_raw({"vc_step": torch.full((900,), position, dtype=torch.uint8)}, "text")
        accumulated = accumulated.merged_with(incoming)
        accumulated.consolidate_tensors(OutputModality.TEXT)
    assert accumulated.tensors["vc_step"].shape == (900,) and int(accumulated.tensors["vc_step"][0]) == 49
