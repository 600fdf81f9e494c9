"""Session settings of the tiered dialect (docs/tiered-dialect.md §1.3, §3.6, §7.1, §7.3, §8.3)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
from vllm_omni_voicechat.wire.tiered.audio import FORMATS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, OUTPUT_FORMATS
from vllm_omni_voicechat.wire.tiered.settings import (
    SessionSettings,
    SettingsError,
    apply_update,
    default_settings,
    render_session,
)

STATE = {
    "state": "open",
    "turn_state": "idle",
    "epoch": 0,
    "turn_id": 0,
    "active_request_id": None,
    "active_response_id": None,
    "active_response_turn_id": None,
    "playback": {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
}
CAPS = {"implementation_level": "model_native_duplex", "chunk_period_ms": 80, "supports_session_resume": False}

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_SPEC = ToolSpec(WEATHER["name"], WEATHER["description"], WEATHER["parameters"])
WEATHER_GA = {"type": "function", **WEATHER}

# §7.1: SessionConfig().to_session_payload(model="m") of DuplexClient 0.30.0
DUPLEX_DEFAULT = {
    "model": "m",
    "modalities": ["audio", "text"],
    "input_audio_format": "pcm16",
    "output_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
    "turn_detection": None,
    "extra_body": {"auto_response": True},
}

# §7.1: the Nemotron preset (clients/nemotron_voicechat.py), tools in extra_body.realtime_tools
NEMOTRON = {
    "model": "nemotron",
    "modalities": ["audio", "text"],
    "input_audio_format": "pcm_f32le",
    "output_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 22050}},
    "turn_detection": None,
    "instructions": "Be brief.",
    "idle_timeout_s": 60.0,
    "extra_body": {
        "auto_response": True,
        "realtime_tools": [{"type": "function", "function": WEATHER}],
        "return_stage_metrics": True,
    },
}

# §7.3: what openai-agents 0.24.0 sends first (probed)
AGENTS = {
    "type": "realtime",
    "model": "gpt-realtime-2.1",
    "instructions": "You are helpful.",
    "output_modalities": ["audio"],
    "tools": [],
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-4o-mini-transcribe"},
            "turn_detection": {"type": "semantic_vad", "interrupt_response": True},
        },
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "ash"},
    },
}
AGENTS_TRACING = {"type": "realtime", "model": "gpt-realtime-2.1", "tracing": "auto"}


def ok(current: SessionSettings, update: object, *, locked: bool = False, audio: bool = False) -> SessionSettings:
    result = apply_update(current, update, prompt_locked=locked, audio_started=audio)  # type: ignore[arg-type]
    assert isinstance(result, SessionSettings), result
    return result


def err(
    current: SessionSettings, update: object, code: str, param: str | None, *, locked: bool = False,
    audio: bool = False,
) -> SettingsError:
    result = apply_update(current, update, prompt_locked=locked, audio_started=audio)  # type: ignore[arg-type]
    assert isinstance(result, SettingsError), result
    assert (result.code, result.param) == (code, param), result
    assert result.message
    return result


def render(s: SessionSettings) -> dict:
    return render_session(s, session_id="duplex-abc", state=STATE, capabilities=CAPS)


# ------------------------------------------------------------------------------------------------- defaults


def test_full_lane_defaults() -> None:
    s = default_settings("full")
    assert (s.lane, s.model, s.instructions, s.tools, s.tools_wire, s.tool_choice) == ("full", None, "", (), (), "auto")
    assert s.output_modalities == ("audio", "text")
    assert (s.input_format, s.input_rate, s.output_format, s.output_rate) == ("pcm16", 16000, "pcm16", 24000)
    assert (s.turn_detection, s.overlap_policy, s.eou_blank_frames) == (None, "listen_only", None)
    assert (s.overlap_short_ack_ms, s.overlap_barge_in_ms, s.overlap_silence_rms) == (700, 1200, 0.003)
    assert (s.playback_commit_policy, s.idle_timeout_s, s.voice) == ("commit_all_on_done", 300.0, None)
    assert (s.auto_response, s.initial_user_text, s.extra_body, s.echo) == (True, None, {}, {})
    assert s.prompt == SessionPrompt("", ())


def test_openai_lane_defaults() -> None:
    s = default_settings("openai", model="gpt-realtime", instructions="Hi.")
    assert (s.lane, s.model, s.instructions) == ("openai", "gpt-realtime", "Hi.")
    assert s.output_modalities == ("audio",)
    assert (s.input_format, s.input_rate, s.output_format, s.output_rate) == ("pcm16", 24000, "pcm16", 24000)
    assert s.playback_commit_policy == "commit_all_on_done"
    assert s.prompt == SessionPrompt("Hi.", ())


def test_openai_lane_turns_default_model_owned_and_null_gives_them_to_the_client() -> None:
    s = default_settings("openai", model="sim")
    # GA's interrupt_response defaults to true: the user's speech cancels the response
    assert s.turn_detection == {"type": "semantic_vad"} and s.overlap_policy == "barge_in_on_speech"
    assert (s.client_turns, s.model_eou) == (False, True)
    assert render(s)["audio"]["input"]["turn_detection"] == {"type": "semantic_vad"}
    manual = ok(s, {"audio": {"input": {"turn_detection": None}}})
    assert (manual.turn_detection, manual.overlap_policy) == (None, "listen_only")
    assert (manual.client_turns, manual.model_eou) == (True, False)
    vad = ok(manual, {"turn_detection": {"type": "server_vad"}})
    assert (vad.client_turns, vad.model_eou, vad.overlap_policy) == (False, True, "barge_in_on_speech")
    held = ok(s, {"extra_body": {"auto_response": False}})
    assert (held.client_turns, held.model_eou) == (False, False)


def test_full_lane_null_turn_detection_stays_model_owned() -> None:
    s = default_settings("full")
    assert s.turn_detection is None and (s.client_turns, s.model_eou) == (False, True)
    assert ok(s, {"turn_detection": None}).model_eou


@pytest.mark.parametrize("kind", ["server_vad", "semantic_vad"])
def test_vad_create_response_false_is_refused_on_the_openai_lane_only(kind: str) -> None:
    update = {"audio": {"input": {"turn_detection": {"type": kind, "create_response": False}}}}
    err(default_settings("openai"), update, "unsupported_turn_detection", "turn_detection.create_response")
    assert ok(default_settings("full"), update).turn_detection == {"type": kind, "create_response": False}
    assert ok(default_settings("openai"), {TD: {"type": kind, "create_response": True}}).model_eou


def test_bad_lane_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        default_settings("beta")  # type: ignore[arg-type]


def test_empty_update_changes_nothing() -> None:
    s = ok(default_settings("full"), NEMOTRON)
    assert ok(s, {}, locked=True, audio=True) == s


# ------------------------------------------------------------------------------------------------- clients


def test_duplex_client_default_payload() -> None:
    s = ok(default_settings("full"), copy.deepcopy(DUPLEX_DEFAULT))
    assert s.model == "m"
    assert s.output_modalities == ("audio", "text")
    assert (s.input_format, s.input_rate, s.output_format, s.output_rate) == ("pcm16", 16000, "pcm16", 24000)
    assert (s.turn_detection, s.overlap_policy) == (None, "listen_only")
    assert (s.auto_response, s.extra_body, s.echo) == (True, {}, {})
    assert s.prompt == SessionPrompt("", ())


def test_nemotron_preset_payload() -> None:
    s = ok(default_settings("full"), copy.deepcopy(NEMOTRON))
    assert (s.input_format, s.input_rate, s.output_format, s.output_rate) == ("pcm_f32le", 16000, "pcm16", 22050)
    assert s.tools == (WEATHER_SPEC,)
    assert s.tools_wire == (WEATHER_GA,)
    assert s.prompt == SessionPrompt("Be brief.", (WEATHER_SPEC,))
    assert s.idle_timeout_s == 60.0
    assert s.extra_body == {"return_stage_metrics": True}  # realtime_tools lives in tools, auto_response in its field
    r = render(s)
    assert r["audio"]["input"]["format"] == {"type": "audio/pcm_f32le"}
    assert r["audio"]["output"] == {"format": {"type": "audio/pcm"}, "sample_rate_hz": 22050, "voice": None}
    assert r["tools"] == [WEATHER_GA]
    assert r["extra_body"] == {"return_stage_metrics": True, "auto_response": True}


def test_openai_agents_payload_then_tracing_update() -> None:
    start = default_settings("openai", model="gpt-realtime-2.1")
    s = ok(start, copy.deepcopy(AGENTS))
    assert s.instructions == "You are helpful." and s.tools == ()
    assert s.output_modalities == ("audio",)
    assert (s.input_format, s.input_rate, s.output_format, s.output_rate) == ("pcm16", 24000, "pcm16", 24000)
    assert s.turn_detection == {"type": "semantic_vad", "interrupt_response": True}
    assert (s.overlap_policy, s.eou_blank_frames, s.voice) == ("barge_in_on_speech", None, "ash")
    assert s.echo == {"transcription": {"model": "gpt-4o-mini-transcribe"}}
    r = render(s)
    assert r["audio"]["input"]["turn_detection"] == r["turn_detection"] == s.turn_detection

    # after session.created the model has started: the tracing-only update must not trip the prompt lock
    t = ok(s, copy.deepcopy(AGENTS_TRACING), locked=True, audio=True)
    assert t == SessionSettings(**{**_fields(s), "echo": {**s.echo, "tracing": "auto"}})
    # resending the unchanged first payload is fine too
    assert ok(t, copy.deepcopy(AGENTS), locked=True, audio=True) == t


def _fields(s: SessionSettings) -> dict:
    return {name: getattr(s, name) for name in SessionSettings.__dataclass_fields__}


def test_openai_agents_server_vad_variant() -> None:
    update = copy.deepcopy(AGENTS)
    update["audio"]["input"]["turn_detection"] = {"type": "server_vad", "interrupt_response": True}
    s = ok(default_settings("openai"), update)
    assert (s.overlap_policy, s.eou_blank_frames) == ("barge_in_on_speech", None)


# ------------------------------------------------------------------------------------------------- spellings


def test_beta_and_ga_spellings_fold_to_the_same_settings() -> None:
    vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 400}
    beta = {
        "modalities": ["text"],
        "input_audio_format": "g711_ulaw",
        "output_audio_format": "g711_alaw",
        "turn_detection": vad,
        "input_audio_transcription": {"model": "whisper-1"},
        "input_audio_noise_reduction": {"type": "near_field"},
        "voice": "ash",
        "max_response_output_tokens": 200,
        "speed": 1.1,
    }
    ga = {
        "output_modalities": ["text"],
        "max_output_tokens": 200,
        "audio": {
            "input": {
                "format": {"type": "audio/pcmu"},
                "turn_detection": vad,
                "transcription": {"model": "whisper-1"},
                "noise_reduction": {"type": "near_field"},
            },
            "output": {"format": {"type": "audio/pcma"}, "voice": "ash", "speed": 1.1},
        },
    }
    a = ok(default_settings("openai"), beta)
    b = ok(default_settings("openai"), ga)
    assert a == b
    assert (a.input_format, a.input_rate, a.output_format, a.output_rate) == ("g711_ulaw", 8000, "g711_alaw", 8000)
    assert a.output_modalities == ("text",)
    assert a.echo == {
        "transcription": {"model": "whisper-1"},
        "noise_reduction": {"type": "near_field"},
        "max_tokens": 200,
        "speed": 1.1,
    }


def test_response_format_is_an_output_format_alias() -> None:
    s = ok(default_settings("full"), {"response_format": "audio/pcmu"})
    assert (s.output_format, s.output_rate) == ("g711_ulaw", 8000)


def test_modalities_are_canonically_ordered_and_deduplicated() -> None:
    assert ok(default_settings("full"), {"output_modalities": ["text", "audio", "text"]}).output_modalities == (
        "audio",
        "text",
    )


@pytest.mark.parametrize(
    ("update", "expected"),
    [
        ({"input_audio_format": "g711_ulaw"}, ("g711_ulaw", 8000)),
        ({"input_audio_format": "alaw", "sample_rate_hz": 16000}, ("g711_alaw", 16000)),
        ({"input_audio_format": "pcm_f32le"}, ("pcm_f32le", 16000)),
        ({"sample_rate": 48000}, ("pcm16", 48000)),
        ({"audio": {"input": {"sample_rate_hz": 44100}}}, ("pcm16", 44100)),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}, ("pcm16", 24000)),
        ({"audio": {"input": {"format": {"rate": 22050}}}}, ("pcm16", 22050)),  # GA object without a type
        ({"input_audio_format": {"type": "audio/pcm", "rate": 32000}}, ("pcm16", 32000)),
        ({"input_audio_format": None}, ("pcm16", 16000)),
    ],
)
def test_input_format_and_rate(update: dict, expected: tuple[str, int]) -> None:
    s = ok(default_settings("full"), update)
    assert (s.input_format, s.input_rate) == expected
    assert (s.output_format, s.output_rate) == ("pcm16", 24000)  # a top-level rate is the input's


def test_rate_kept_for_an_unchanged_format_and_reset_by_a_new_one() -> None:
    s = ok(default_settings("openai"), {"input_audio_format": "pcm16", "sample_rate_hz": 16000})
    assert ok(s, {"input_audio_format": "pcm16"}).input_rate == 16000
    u = ok(s, {"input_audio_format": "g711_ulaw"})
    assert u.input_rate == 8000
    assert ok(u, {"input_audio_format": "pcm16"}).input_rate == 24000  # the OpenAI lane's default
    o = ok(s, {"output_audio_format": "g711_ulaw"})
    assert (o.output_format, o.output_rate) == ("g711_ulaw", 8000)
    o = ok(o, {"audio": {"output": {"sample_rate_hz": 16000}}})
    assert (o.output_format, o.output_rate) == ("g711_ulaw", 16000)
    assert ok(o, {"output_audio_format": "pcm16"}).output_rate == 24000


def test_turn_detection_and_overlap_policy() -> None:
    base = default_settings("full")
    vad = {
        "type": "server_vad",
        "threshold": 1,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "create_response": True,
        "interrupt_response": True,
        "min_speech_duration_ms": 100,
        "idle_timeout_ms": None,
    }
    s = ok(base, {"turn_detection": vad})
    assert (s.turn_detection, s.overlap_policy) == (vad, "barge_in_on_speech")
    assert ok(s, {"overlap_policy": "barge_in_on_speech"}).overlap_policy == "barge_in_on_speech"
    assert ok(s, {"idle_timeout_s": 10}).overlap_policy == "barge_in_on_speech"  # untouched, kept
    assert ok(s, {"idle_timeout_s": 3600}).idle_timeout_s == 3600  # the bound itself
    off = ok(s, {"turn_detection": None})
    assert (off.turn_detection, off.overlap_policy) == (None, "listen_only")
    sem = ok(s, {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}})
    # semantic_vad honours interrupt_response (GA default true: barge in; false: the model keeps the floor)
    assert (sem.turn_detection, sem.overlap_policy) == ({"type": "semantic_vad", "eagerness": "low"},
                                                        "barge_in_on_speech")
    keep = {"type": "semantic_vad", "interrupt_response": False}
    assert ok(s, {"audio": {"input": {"turn_detection": keep}}}).overlap_policy == "listen_only"
    assert ok(s, {"turn_detection": keep, "overlap_policy": "barge_in_on_speech"}).overlap_policy == (
        "barge_in_on_speech")  # an explicit policy wins
    # model-owned turns may still ask to barge in on speech
    assert ok(base, {"turn_detection": None, "overlap_policy": "barge_in_on_speech"}).overlap_policy == (
        "barge_in_on_speech"
    )


@pytest.mark.parametrize(
    ("turn_detection", "frames"),
    [
        ({"type": "server_vad", "silence_duration_ms": 0}, 1),
        ({"type": "server_vad", "silence_duration_ms": 1}, 1),
        ({"type": "server_vad", "silence_duration_ms": 80}, 1),
        ({"type": "server_vad", "silence_duration_ms": 81}, 2),
        ({"type": "server_vad", "silence_duration_ms": 500}, 7),
        ({"type": "server_vad", "silence_duration_ms": 800}, 10),
        ({"type": "server_vad"}, None),
        ({"type": "semantic_vad"}, None),
        (None, None),
    ],
)
def test_eou_blank_frames(turn_detection: dict | None, frames: int | None) -> None:
    assert ok(default_settings("full"), {"turn_detection": turn_detection}).eou_blank_frames == frames


def test_tools_spellings() -> None:
    base = default_settings("full")
    for tools in ([WEATHER_GA], [{"type": "function", "function": WEATHER}], [WEATHER]):
        s = ok(base, {"tools": tools})
        assert (s.tools, s.tools_wire) == ((WEATHER_SPEC,), (WEATHER_GA,))
    s = ok(base, {"tools": [WEATHER_GA]})
    assert ok(s, {"tools": None}).tools == ()
    # `tools` wins over extra_body.realtime_tools
    assert ok(base, {"tools": [], "extra_body": {"realtime_tools": [WEATHER]}}).tools == ()


def test_unchanged_prompt_model_and_voice_pass_the_locks() -> None:
    s = ok(default_settings("full", model="m"), {"instructions": "Hi.", "tools": [WEATHER], "voice": "v"})
    same = {"model": "m", "instructions": "Hi.", "tools": [WEATHER_GA], "voice": "v"}
    assert ok(s, same, locked=True, audio=True) == s
    assert ok(s, {"extra_body": {"realtime_tools": [{"type": "function", "function": WEATHER}]}}, locked=True) == s
    # the first model is adopted; null keeps it
    assert ok(default_settings("full"), {"model": "x"}).model == "x"
    assert ok(s, {"model": None}).model == "m"
    # instructions null means "" (allowed while unlocked); voice null keeps the voice
    assert ok(s, {"instructions": None}).instructions == ""
    assert ok(s, {"voice": None}, audio=True).voice == "v"
    # voice may change before any audio, prompt may change before the lock
    assert ok(s, {"voice": "w", "instructions": "Yo.", "tools": []}).voice == "w"


def test_extra_body() -> None:
    s = ok(default_settings("full"), {"extra_body": {"auto_response": False, "force_listen_count": 0}})
    assert (s.auto_response, s.extra_body) == (False, {"force_listen_count": 0})
    s = ok(s, {"extra_body": {"full_duplex": True, "duplex_initial_user_text": "Say hi."}})
    assert (s.auto_response, s.initial_user_text) == (True, "Say hi.")
    assert s.extra_body == {"force_listen_count": 0, "full_duplex": True}  # merged, not replaced
    assert render(s)["extra_body"] == {
        "force_listen_count": 0,
        "full_duplex": True,
        "auto_response": True,
        "duplex_initial_user_text": "Say hi.",
    }
    assert ok(s, {"extra_body": {"duplex_initial_user_text": None}}).initial_user_text is None
    assert ok(s, {"extra_body": None}) == s


def test_echo_fields_are_kept_rendered_and_cleared_by_null() -> None:
    update = {
        "temperature": 0.7,
        "max_tokens": "inf",
        "speed": 1.0,
        "tracing": {"workflow_name": "w"},
        "include": ["item.input_audio_transcription.logprobs"],
        "truncation": "auto",
        "prompt": {"id": "pmpt_1"},
        "metadata": {"k": "v"},
        "ref_audio": "UklGRg==",
    }
    s = ok(default_settings("full"), copy.deepcopy(update))
    assert s.echo == update
    r = render(s)
    for key, value in update.items():
        assert r[key] == value
    assert r["max_output_tokens"] == "inf"
    cleared = ok(s, {key: None for key in update})
    assert cleared.echo == {}
    assert "prompt" not in render(cleared) and render(cleared)["temperature"] is None


def test_session_level_parameters() -> None:
    update = {
        "overlap_policy": "barge_in_on_speech",
        "overlap_short_ack_ms": 500,
        "overlap_barge_in_ms": 900,
        "overlap_silence_rms": 0,
        "playback_commit_policy": "ack_only",
        "idle_timeout_s": 30,
        "tool_choice": "auto",
    }
    s = ok(default_settings("full"), update)
    assert (s.overlap_policy, s.overlap_short_ack_ms, s.overlap_barge_in_ms) == ("barge_in_on_speech", 500, 900)
    assert (s.overlap_silence_rms, s.playback_commit_policy, s.idle_timeout_s) == (0.0, "ack_only", 30.0)
    assert isinstance(s.idle_timeout_s, float) and isinstance(s.overlap_silence_rms, float)


# ------------------------------------------------------------------------------------------------- errors

TD = "turn_detection"

ERRORS: list[tuple[dict | object, str, str | None]] = [
    ([], "invalid_session_config", "session"),
    ({"type": "transcription"}, "invalid_session_config", "type"),
    ({"audio": 5}, "invalid_session_config", "audio"),
    ({"audio": {"input": "x"}}, "invalid_session_config", "audio.input"),
    ({"audio": {"output": []}}, "invalid_session_config", "audio.output"),
    ({"extra_body": []}, "invalid_session_config", "extra_body"),
    # formats
    ({"input_audio_format": "wav"}, "unsupported_audio_format", "input_audio_format"),
    ({"input_audio_format": 5}, "unsupported_audio_format", "input_audio_format"),
    ({"audio": {"input": {"format": {"type": "audio/flac"}}}}, "unsupported_audio_format", "audio.input.format"),
    ({"output_audio_format": "pcm_f32le"}, "unsupported_audio_format", "output_audio_format"),
    ({"response_format": "mp3"}, "unsupported_audio_format", "response_format"),
    ({"audio": {"output": {"format": "opus"}}}, "unsupported_audio_format", "audio.output.format"),
    # rates
    ({"sample_rate_hz": 4000}, "invalid_session_config", "sample_rate_hz"),
    ({"sample_rate": 192001}, "invalid_session_config", "sample_rate"),
    ({"sample_rate_hz": "16000"}, "invalid_session_config", "sample_rate_hz"),
    ({"sample_rate_hz": 16000.5}, "invalid_session_config", "sample_rate_hz"),
    ({"audio": {"input": {"sample_rate_hz": 200000}}}, "invalid_session_config", "audio.input.sample_rate_hz"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 1000}}}}, "invalid_session_config",
     "audio.input.format.rate"),
    ({"audio": {"output": {"sample_rate_hz": 7999}}}, "invalid_session_config", "audio.output.sample_rate_hz"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": True}}}}, "invalid_session_config",
     "audio.output.format.rate"),
    # modalities
    ({"modalities": []}, "invalid_session_config", "modalities"),
    ({"modalities": "audio"}, "invalid_session_config", "modalities"),
    ({"output_modalities": ["audio", "video"]}, "invalid_session_config", "output_modalities"),
    # turn detection
    ({TD: {"type": "server_vad", "foo": 1}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "eagerness": "low"}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "threshold": 0}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "threshold": 1.5}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "prefix_padding_ms": -1}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "silence_duration_ms": -5}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "silence_duration_ms": 1.5}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "min_speech_duration_ms": "x"}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "idle_timeout_ms": -1}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "interrupt_response": False}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad", "create_response": "yes"}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "semantic_vad", "eagerness": "very"}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "semantic_vad", "threshold": 0.5}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "none"}}, "unsupported_turn_detection", TD),
    ({TD: {}}, "unsupported_turn_detection", TD),
    ({TD: "server_vad"}, "unsupported_turn_detection", TD),
    ({"audio": {"input": {TD: {"type": "bogus"}}}}, "unsupported_turn_detection", TD),
    ({TD: {"type": "server_vad"}, "overlap_policy": "listen_only"}, "unsupported_turn_detection", TD),
    ({"overlap_policy": "always"}, "invalid_session_config", "overlap_policy"),
    # prompt, tools, voice, model
    ({"instructions": 5}, "invalid_session_config", "instructions"),
    ({"model": 5}, "invalid_session_config", "model"),
    ({"voice": 5}, "invalid_session_config", "voice"),
    ({"audio": {"output": {"voice": {"id": "v"}}}}, "invalid_session_config", "audio.output.voice"),
    ({"tools": "x"}, "invalid_session_config", "tools"),
    ({"tools": [WEATHER] * 2}, "invalid_session_config", "tools"),
    ({"tools": [{"name": f"t{i}"} for i in range(33)]}, "invalid_session_config", "tools"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "invalid_session_config", "tools"),
    ({"extra_body": {"realtime_tools": [{"name": "1bad"}]}}, "invalid_session_config", "extra_body.realtime_tools"),
    ({"tool_choice": "none"}, "invalid_session_config", "tool_choice"),
    ({"tool_choice": "required"}, "invalid_session_config", "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "get_weather"}}, "invalid_session_config", "tool_choice"),
    # session parameters
    ({"playback_commit_policy": "never"}, "invalid_session_config", "playback_commit_policy"),
    ({"idle_timeout_s": 0}, "invalid_session_config", "idle_timeout_s"),
    ({"idle_timeout_s": -1.0}, "invalid_session_config", "idle_timeout_s"),
    ({"idle_timeout_s": 1e300}, "invalid_session_config", "idle_timeout_s"),  # a slot held for ever
    ({"idle_timeout_s": 3600.5}, "invalid_session_config", "idle_timeout_s"),
    ({"idle_timeout_s": "5"}, "invalid_session_config", "idle_timeout_s"),
    ({"idle_timeout_s": True}, "invalid_session_config", "idle_timeout_s"),
    ({"idle_timeout_s": float("inf")}, "invalid_session_config", "idle_timeout_s"),
    ({"overlap_short_ack_ms": -1}, "invalid_session_config", "overlap_short_ack_ms"),
    ({"overlap_barge_in_ms": 1.5}, "invalid_session_config", "overlap_barge_in_ms"),
    ({"overlap_silence_rms": "low"}, "invalid_session_config", "overlap_silence_rms"),
    ({"extra_body": {"auto_response": "yes"}}, "invalid_session_config", "extra_body.auto_response"),
    ({"extra_body": {"duplex_initial_user_text": 5}}, "invalid_session_config",
     "extra_body.duplex_initial_user_text"),
    # echoed fields still have a shape
    ({"temperature": "hot"}, "invalid_session_config", "temperature"),
    ({"max_response_output_tokens": 0}, "invalid_session_config", "max_response_output_tokens"),
    ({"max_output_tokens": "lots"}, "invalid_session_config", "max_output_tokens"),
    ({"speed": []}, "invalid_session_config", "speed"),
    ({"input_audio_transcription": "whisper"}, "invalid_session_config", "input_audio_transcription"),
    ({"audio": {"input": {"transcription": 1}}}, "invalid_session_config", "audio.input.transcription"),
    ({"tracing": "on"}, "invalid_session_config", "tracing"),
    ({"include": ["logprobs"]}, "invalid_session_config", "include"),
    ({"truncation": "sometimes"}, "invalid_session_config", "truncation"),
    ({"truncation": {"type": "retention_ratio"}}, "invalid_session_config", "truncation"),
    ({"prompt": {"variables": {}}}, "invalid_session_config", "prompt"),
]


@pytest.mark.parametrize(("update", "code", "param"), ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_invalid_updates(update: object, code: str, param: str | None) -> None:
    err(default_settings("full"), update, code, param)


def test_server_vad_conflicts_with_a_later_listen_only() -> None:
    s = ok(default_settings("full"), {TD: {"type": "server_vad"}})
    err(s, {"overlap_policy": "listen_only"}, "unsupported_turn_detection", TD)


def test_model_update_unsupported() -> None:
    s = default_settings("full", model="a")
    err(s, {"model": "b"}, "model_update_unsupported", "model")


def test_openai_lane_keeps_the_served_model_when_an_sdk_names_its_own() -> None:
    s = default_settings("openai", model="sim")
    assert ok(s, {"model": "gpt-realtime-2.1", "instructions": "Hi."}).model == "sim"


def test_prompt_lock_codes() -> None:
    s = ok(default_settings("full"), {"instructions": "Hi.", "tools": [WEATHER]})
    err(s, {"instructions": "Bye."}, "instructions_update_unsupported", "instructions", locked=True)
    err(s, {"instructions": None}, "instructions_update_unsupported", "instructions", locked=True)
    err(s, {"tools": []}, "tools_update_unsupported", "tools", locked=True)
    err(s, {"tools": None}, "tools_update_unsupported", "tools", locked=True)
    err(s, {"extra_body": {"realtime_tools": []}}, "tools_update_unsupported", "tools", locked=True)


def test_voice_update_after_audio() -> None:
    s = ok(default_settings("full"), {"voice": "a"})
    err(s, {"voice": "b"}, "voice_update_after_audio_unsupported", "voice", audio=True)
    err(s, {"audio": {"output": {"voice": "b"}}}, "voice_update_after_audio_unsupported", "audio.output.voice",
        audio=True)
    err(default_settings("full"), {"voice": "a"}, "voice_update_after_audio_unsupported", "voice", audio=True)


def test_a_rejected_update_leaves_nothing_behind() -> None:
    s = default_settings("full")
    before = _fields(s)
    err(s, {"voice": "v", "input_audio_format": "g711_ulaw", "idle_timeout_s": -1}, "invalid_session_config",
        "idle_timeout_s")
    assert _fields(s) == before


# ------------------------------------------------------------------------------------------------- rendering


def test_full_lane_render_matches_the_handshake_example() -> None:
    s = ok(default_settings("full"), copy.deepcopy(NEMOTRON))
    r = render(s)
    example_keys = {
        "object", "type", "id", "model", "state", "turn_state", "epoch", "turn_id", "active_request_id",
        "active_response_id", "active_response_turn_id", "modalities", "output_modalities", "instructions", "voice",
        "response_format", "input_audio_format", "output_audio_format", "audio", "turn_detection",
        "input_audio_transcription", "tools", "tool_choice", "tracing", "temperature", "max_tokens", "speed",
        "idle_timeout_s", "overlap_policy", "overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms",
        "playback_commit_policy", "playback", "extra_body", "capabilities",
    }  # fmt: skip
    assert set(r) == example_keys | {"max_output_tokens"}
    assert (r["object"], r["type"], r["id"], r["model"]) == ("realtime.session", "realtime", "duplex-abc", "nemotron")
    assert {k: r[k] for k in STATE} == STATE
    assert (r["modalities"], r["output_modalities"]) == (["audio", "text"], ["audio", "text"])
    assert (r["response_format"], r["input_audio_format"], r["output_audio_format"]) == ("pcm16", "pcm_f32le", "pcm16")
    assert r["audio"] == {
        "input": {"format": {"type": "audio/pcm_f32le"}, "sample_rate_hz": 16000, "turn_detection": None,
                  "transcription": None},
        "output": {"format": {"type": "audio/pcm"}, "sample_rate_hz": 22050, "voice": None},
    }  # fmt: skip
    assert (r["turn_detection"], r["input_audio_transcription"], r["tool_choice"]) == (None, None, "auto")
    assert (r["tracing"], r["temperature"], r["max_tokens"], r["speed"]) == (None, None, None, None)
    assert (r["idle_timeout_s"], r["overlap_policy"], r["playback_commit_policy"]) == (
        60.0,
        "listen_only",
        "commit_all_on_done",
    )
    assert (r["overlap_short_ack_ms"], r["overlap_barge_in_ms"], r["overlap_silence_rms"]) == (700, 1200, 0.003)
    assert r["capabilities"] == CAPS


@pytest.mark.parametrize(
    ("lane", "fmt", "rate", "expected"),
    [
        ("openai", "pcm16", 24000, {"type": "audio/pcm", "rate": 24000}),
        ("openai", "pcm16", 16000, {"type": "audio/pcm"}),
        ("full", "pcm16", 16000, {"type": "audio/pcm"}),
        ("openai", "g711_ulaw", 8000, {"type": "audio/pcmu"}),
        ("openai", "g711_alaw", 8000, {"type": "audio/pcma"}),
        ("full", "pcm_f32le", 16000, {"type": "audio/pcm_f32le"}),
        ("openai", "pcm_f32le", 24000, None),  # no GA spelling: only the flat input_audio_format
    ],
)
def test_ga_input_format_object(lane: str, fmt: str, rate: int, expected: dict | None) -> None:
    s = ok(default_settings(lane), {"input_audio_format": fmt, "sample_rate_hz": rate})  # type: ignore[arg-type]
    audio_in = render(s)["audio"]["input"]
    assert audio_in.get("format") == expected
    assert audio_in["sample_rate_hz"] == rate
    assert render(s)["input_audio_format"] == fmt


def test_render_does_not_alias_the_settings() -> None:
    s = ok(default_settings("full"), {**copy.deepcopy(NEMOTRON), TD: {"type": "server_vad"}, "metadata": {"a": "b"}})
    before = copy.deepcopy(_fields(s))
    r = render(s)
    r["tools"][0]["parameters"]["x"] = 1
    r["turn_detection"]["type"] = "x"
    r["audio"]["input"]["turn_detection"]["type"] = "y"
    r["extra_body"]["return_stage_metrics"] = False
    r["metadata"]["a"] = "c"
    assert _fields(s) == before


ROUND_TRIP = [
    ("full", {}),
    ("openai", {}),
    ("full", DUPLEX_DEFAULT),
    ("full", NEMOTRON),
    ("openai", AGENTS),
    ("openai", {**AGENTS, "tracing": "auto"}),
    ("openai", {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw", TD: {"type": "server_vad",
                "silence_duration_ms": 300, "interrupt_response": True}, "voice": "ash"}),
    ("openai", {"input_audio_format": "pcm_f32le", "output_modalities": ["text"], "temperature": 0.2,
                "max_output_tokens": 100, "include": ["item.input_audio_transcription.logprobs"],
                "input_audio_noise_reduction": {"type": "far_field"}, "ref_audio": "x"}),
    ("full", {"extra_body": {"auto_response": False, "duplex_initial_user_text": "Hi", "force_listen_count": 1},
              "playback_commit_policy": "ack_only", "overlap_policy": "barge_in_on_speech", "idle_timeout_s": 5,
              "audio": {"output": {"sample_rate_hz": 48000}}, "tools": [WEATHER]}),
]  # fmt: skip


@pytest.mark.parametrize(("lane", "update"), ROUND_TRIP, ids=[str(i) for i in range(len(ROUND_TRIP))])
def test_render_round_trip(lane: str, update: dict) -> None:
    model = update.get("model")
    s = ok(default_settings(lane, model=model), copy.deepcopy(update))  # type: ignore[arg-type]
    rendered = render(s)
    assert ok(default_settings(lane, model=model), copy.deepcopy(rendered)) == s  # type: ignore[arg-type]
    # echoing the session.updated object back is never an error, even once everything is locked
    assert ok(s, copy.deepcopy(rendered), locked=True, audio=True) == s


# ------------------------------------------------------------------------------------------------- properties

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
interesting = st.sampled_from(
    [
        "pcm16", "pcm_f32le", "g711_ulaw", "audio/pcmu", "wav", "audio", "text", "auto", "server_vad",
        "semantic_vad", "listen_only", "barge_in_on_speech", "ack_only", 0, 1, 80, 8000, 16000, 24000, 10**400,
        ["audio"], ["text", "audio"], [], {"type": "audio/pcm", "rate": 24000}, {"type": "server_vad"},
        {"type": "semantic_vad", "interrupt_response": True}, {"rate": 16000}, [WEATHER], [WEATHER_GA],
    ]
)  # fmt: skip
values = json_values | interesting
TOP_KEYS = [
    "type", "model", "instructions", "tools", "tool_choice", "modalities", "output_modalities", "input_audio_format",
    "output_audio_format", "response_format", "sample_rate_hz", "sample_rate", "turn_detection",
    "input_audio_transcription", "input_audio_noise_reduction", "voice", "temperature", "max_response_output_tokens",
    "max_output_tokens", "max_tokens", "speed", "tracing", "include", "truncation", "prompt", "metadata", "ref_audio",
    "overlap_policy", "overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms", "playback_commit_policy",
    "idle_timeout_s",
]  # fmt: skip
audio_in = st.fixed_dictionaries(
    {},
    optional={k: values for k in ("format", "sample_rate_hz", "turn_detection", "transcription", "noise_reduction")},
)
audio_out = st.fixed_dictionaries({}, optional={k: values for k in ("format", "sample_rate_hz", "voice", "speed")})
updates = st.fixed_dictionaries(
    {},
    optional={
        **{k: values for k in TOP_KEYS},
        "audio": st.fixed_dictionaries({}, optional={"input": audio_in | values, "output": audio_out | values})
        | values,
        "extra_body": st.fixed_dictionaries(
            {},
            optional={
                k: values
                for k in ("auto_response", "full_duplex", "duplex_initial_user_text", "realtime_tools", "other")
            },
        )
        | values,
    },
)
starts = st.sampled_from(
    [
        default_settings("full"),
        default_settings("openai", model="m"),
        ok(default_settings("full"), NEMOTRON),
        ok(default_settings("openai", model="gpt-realtime-2.1"), AGENTS),
        ok(default_settings("full"), {TD: {"type": "server_vad"}, "voice": "v"}),
    ]
)


def check_settings(old: SessionSettings, new: SessionSettings, locked: bool, audio: bool) -> None:
    assert new.lane == old.lane
    assert new.output_modalities and set(new.output_modalities) <= {"audio", "text"}
    assert new.input_format in FORMATS and new.output_format in OUTPUT_FORMATS
    assert MIN_SAMPLE_RATE <= new.input_rate <= MAX_SAMPLE_RATE and MIN_SAMPLE_RATE <= new.output_rate <= MAX_SAMPLE_RATE
    assert new.overlap_policy in ("listen_only", "barge_in_on_speech")
    if new.turn_detection is not None and new.turn_detection["type"] == "server_vad":
        assert new.overlap_policy == "barge_in_on_speech"
    assert new.tool_choice == "auto" and len(new.tools) <= 32 and len(new.tools_wire) == len(new.tools)
    assert new.idle_timeout_s > 0 and isinstance(new.auto_response, bool)
    assert old.model is None or new.model == old.model
    if locked:
        assert new.prompt == old.prompt
    if audio:
        assert new.voice == old.voice
    assert None not in new.echo.values()
    render(new)


@settings(max_examples=600, deadline=None)
@given(starts, updates, st.booleans(), st.booleans())
def test_arbitrary_updates_never_raise(start: SessionSettings, update: dict, locked: bool, audio: bool) -> None:
    result = apply_update(start, update, prompt_locked=locked, audio_started=audio)
    assert isinstance(result, (SessionSettings, SettingsError))
    if isinstance(result, SettingsError):
        assert isinstance(result.code, str) and result.code and isinstance(result.message, str)
    else:
        check_settings(start, result, locked, audio)


@settings(max_examples=200, deadline=None)
@given(starts, json_values, st.booleans(), st.booleans())
def test_arbitrary_json_never_raises(start: SessionSettings, update: object, locked: bool, audio: bool) -> None:
    result = apply_update(start, update, prompt_locked=locked, audio_started=audio)  # type: ignore[arg-type]
    assert isinstance(result, (SessionSettings, SettingsError))


# mostly valid values per key, so that most updates are accepted and the invariants get exercised
PLAUSIBLE: dict[str, list] = {
    "model": [None, "m", "gpt-realtime-2.1"],
    "instructions": [None, "", "Hi.", "Be brief."],
    "tools": [None, [], [WEATHER], [WEATHER_GA]],
    "tool_choice": [None, "auto"],
    "modalities": [["audio"], ["text"], ["audio", "text"]],
    "output_modalities": [["audio"], ["text"], ["text", "audio"]],
    "input_audio_format": ["pcm16", "pcm_f32le", "g711_ulaw", "audio/pcma", "s16le"],
    "output_audio_format": ["pcm16", "g711_alaw", "audio/pcmu"],
    "response_format": ["pcm16", "ulaw"],
    "sample_rate_hz": [8000, 16000, 22050, 24000, 48000],
    "sample_rate": [16000, 44100],
    "turn_detection": [
        None,
        {"type": "semantic_vad", "interrupt_response": True, "eagerness": "auto"},
        {"type": "server_vad", "silence_duration_ms": 300, "threshold": 0.4, "interrupt_response": True},
    ],
    "input_audio_transcription": [None, {"model": "whisper-1"}],
    "voice": [None, "ash", "marin"],
    "temperature": [None, 0.8],
    "max_response_output_tokens": [None, "inf", 100],
    "speed": [None, 1.2],
    "tracing": [None, "auto", {"workflow_name": "w"}],
    "include": [None, ["item.input_audio_transcription.logprobs"]],
    "truncation": [None, "auto", {"type": "retention_ratio", "retention_ratio": 0.5}],
    "prompt": [None, {"id": "pmpt_1", "version": "2"}],
    "metadata": [None, {"a": "b"}],
    "ref_audio": [None, "UklGRg=="],
    "overlap_policy": [None, "listen_only", "barge_in_on_speech"],
    "overlap_short_ack_ms": [None, 0, 500],
    "overlap_barge_in_ms": [None, 900],
    "overlap_silence_rms": [None, 0.01],
    "playback_commit_policy": [None, "ack_only", "commit_all_on_done"],
    "idle_timeout_s": [None, 0.5, 60],
    "extra_body": [None, {"auto_response": False}, {"full_duplex": True}, {"duplex_initial_user_text": "hi"},
                   {"realtime_tools": [WEATHER]}, {"return_stage_metrics": True}],
    "audio": [
        {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "semantic_vad"}}},
        {"input": {"format": {"type": "audio/pcmu"}, "transcription": {"model": "gpt-4o-mini-transcribe"}}},
        {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 22050}},
        {"output": {"format": {"type": "audio/pcma"}, "voice": "ash", "speed": 1.0}},
        {"input": {"noise_reduction": {"type": "near_field"}}, "output": {"format": {"type": "audio/pcm"}}},
    ],
}  # fmt: skip
plausible_updates = st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in PLAUSIBLE.items()}).map(
    copy.deepcopy
)


@settings(max_examples=400, deadline=None)
@given(starts, plausible_updates, st.booleans(), st.booleans())
def test_plausible_updates_keep_the_invariants(
    start: SessionSettings, update: dict, locked: bool, audio: bool
) -> None:
    result = apply_update(start, update, prompt_locked=locked, audio_started=audio)
    if isinstance(result, SessionSettings):
        check_settings(start, result, locked, audio)
        # the rendered object folds back to the same settings
        assert ok(result, render(result), locked=True, audio=True) == result


# ------------------------------------------------------------------------------------------------- GA schema

OPENAI_CASES = [
    ("default", None, {}),
    ("agents", "gpt-realtime-2.1", AGENTS),
    ("agents+tracing", "gpt-realtime-2.1", {**AGENTS, "tracing": "auto"}),
    ("g711", None, {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}),
    ("g711-ga", None, {"audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format":
                                                                                        {"type": "audio/pcma"}}}}),
    ("pcm16-16k", None, {"input_audio_format": "pcm16", "sample_rate_hz": 16000,
                         "audio": {"output": {"sample_rate_hz": 16000}}}),
    ("f32", None, {"input_audio_format": "pcm_f32le", "sample_rate_hz": 16000}),
    ("text-only", None, {"output_modalities": ["text"]}),
    ("server_vad", None, {TD: {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                               "silence_duration_ms": 500, "create_response": True, "interrupt_response": True,
                               "min_speech_duration_ms": 100, "idle_timeout_ms": 5000}}),
    ("tools+echo", None, {"tools": [WEATHER_GA], "instructions": "x", "temperature": 0.5, "max_output_tokens": 256,
                          "tracing": {"workflow_name": "w"}, "include": ["item.input_audio_transcription.logprobs"],
                          "truncation": {"type": "retention_ratio", "retention_ratio": 0.8},
                          "prompt": {"id": "pmpt_1"}, "metadata": {"a": "b"},
                          "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                          "input_audio_noise_reduction": {"type": "near_field"}, "voice": "marin",
                          "extra_body": {"duplex_initial_user_text": "hi"}}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "model", "update"), OPENAI_CASES, ids=[c[0] for c in OPENAI_CASES])
def test_openai_lane_session_validates_against_the_ga_schema(name: str, model: str | None, update: dict) -> None:
    pytest.importorskip("openai")
    pydantic = pytest.importorskip("pydantic")
    from openai.types.realtime import (
        RealtimeServerEvent,
        RealtimeSessionCreateRequest,
        SessionCreatedEvent,
        SessionUpdatedEvent,
    )

    s = ok(default_settings("openai", model=model), copy.deepcopy(update))
    rendered = render(s)
    adapter = pydantic.TypeAdapter(RealtimeServerEvent)
    for kind, cls in (("session.created", SessionCreatedEvent), ("session.updated", SessionUpdatedEvent)):
        event = adapter.validate_python({"type": kind, "event_id": "e1", "session": rendered})
        assert isinstance(event, cls) and isinstance(event.session, RealtimeSessionCreateRequest), name
        assert event.session.model == s.model and event.session.instructions == s.instructions


def test_full_lane_f32_object_is_why_the_openai_lane_omits_it() -> None:
    pytest.importorskip("openai")
    pydantic = pytest.importorskip("pydantic")
    from openai.types.realtime import RealtimeServerEvent

    s = ok(default_settings("full"), {"input_audio_format": "pcm_f32le"})
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python(
            {"type": "session.created", "event_id": "e1", "session": render(s)}
        )


@settings(max_examples=300, deadline=None)
@given(plausible_updates)
def test_every_accepted_openai_lane_session_validates(update: dict) -> None:
    pytest.importorskip("openai")
    pydantic = pytest.importorskip("pydantic")
    from openai.types.realtime import RealtimeServerEvent

    result = apply_update(default_settings("openai"), update, prompt_locked=False, audio_started=False)
    if isinstance(result, SessionSettings):
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python(
            {"type": "session.created", "event_id": "e1", "session": render(result)}
        )
