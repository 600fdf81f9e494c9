"""The ``session`` object of the tiered dialect (docs/tiered-dialect.md §1.3, §3.6, §7, §8.3): pure, no I/O.

* :func:`apply_update` folds one ``session.update`` ``session`` object, in either spelling (beta flat:
  ``modalities``, ``input_audio_format``, ``turn_detection``, ...; GA nested: ``output_modalities``,
  ``audio.input.format``, ``audio.output.voice``, ...), into the current :class:`SessionSettings`, or returns the
  :class:`SettingsError` to answer with. Fields the update leaves out keep their value. It never raises.
* :func:`render_session` renders the ``session`` object of ``session.created`` / ``session.updated`` for a lane;
  in the OpenAI lane it validates as openai 3.57.0's GA ``RealtimeSessionCreateRequest``.

Spelling precedence, first present wins: the beta flat key, then the GA nested key (as the input rate order of
§8.1). Format names and rates are the audio module's; tool validation is ``session/tools.py``'s.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ...model.port import SessionPrompt, ToolSpec
from ...session.tools import InvalidTools, normalize_tools, tool_to_dict
from ..limits import MAX_INSTRUCTIONS_CHARS
from .audio import (
    DEFAULT_INPUT_RATES,
    DEFAULT_OUTPUT_RATE,
    G711_ALAW,
    G711_ULAW,
    PCM16,
    PCM_F32LE,
    AudioFormatError,
    input_sample_rate,
    output_sample_rate,
)
from .fields import FieldRejected, format_and_rate, is_int, is_number

__all__ = [
    "CHUNK_MS",
    "OVERLAP_POLICIES",
    "PLAYBACK_COMMIT_POLICIES",
    "Lane",
    "SessionSettings",
    "SettingsError",
    "apply_update",
    "default_settings",
    "render_session",
]

Lane = Literal["full", "openai"]

CHUNK_MS = 80  # one model position: the unit of the EOU blank fence
MODALITIES: tuple[str, ...] = ("audio", "text")  # canonical order, so equal sets compare equal
OVERLAP_POLICIES: tuple[str, ...] = ("listen_only", "barge_in_on_speech")
PLAYBACK_COMMIT_POLICIES: tuple[str, ...] = ("commit_all_on_done", "ack_only")

_SERVER_VAD_KEYS = frozenset(
    {
        "type",
        "threshold",
        "prefix_padding_ms",
        "silence_duration_ms",
        "create_response",
        "interrupt_response",
        "min_speech_duration_ms",
        "idle_timeout_ms",
    }
)
_SEMANTIC_VAD_KEYS = frozenset({"type", "create_response", "interrupt_response", "eagerness"})
_EAGERNESS: tuple[str, ...] = ("low", "medium", "high", "auto")
_GA_INCLUDE: tuple[str, ...] = ("item.input_audio_transcription.logprobs",)
# extra_body keys that live in their own fields; rendered back from those fields, so not stored twice
_EXTRA_BODY_FIELDS = ("auto_response", "duplex_initial_user_text", "realtime_tools")


MAX_IDLE_TIMEOUT_S = 3600.0
"""The longest idle timeout a client may ask for: an idle session holds a slot (and its model state) that long."""

@dataclass(frozen=True, slots=True)
class SettingsError:
    code: str
    message: str
    param: str | None = None


@dataclass(frozen=True, slots=True)
class SessionSettings:
    lane: Lane
    model: str | None
    instructions: str
    tools: tuple[ToolSpec, ...]
    tools_wire: tuple[dict, ...]  # GA shape {type:"function", name, description, parameters}
    tool_choice: str
    output_modalities: tuple[str, ...]
    input_format: str
    input_rate: int
    output_format: str
    output_rate: int
    turn_detection: dict | None
    overlap_policy: str
    overlap_short_ack_ms: int = 700
    overlap_barge_in_ms: int = 1200
    overlap_silence_rms: float = 0.003
    playback_commit_policy: str = "commit_all_on_done"
    idle_timeout_s: float = 300.0
    voice: str | None = None
    auto_response: bool = True
    initial_user_text: str | None = None
    extra_body: dict = field(default_factory=dict)
    # accepted-and-echoed fields without effect, by canonical name; None values are never stored
    echo: dict = field(default_factory=dict)

    @property
    def prompt(self) -> SessionPrompt:
        return SessionPrompt(self.instructions, self.tools)

    @property
    def client_turns(self) -> bool:
        """The OpenAI lane with ``turn_detection: null``: the client owns turns the OpenAI way. A commit seals the
        user item and settles the turn without answering; ``response.create`` answers it (docs/tiered-dialect.md
        §3.4, "Manual turns"). The full lane keeps null as the model-owned turn policy (DuplexClient sends it)."""
        return self.lane == "openai" and self.turn_detection is None

    @property
    def model_eou(self) -> bool:
        """Whether the model's own end of turn (and a commit) makes it answer by itself: not with
        ``auto_response: false`` nor with client-owned turns."""
        return self.auto_response and not self.client_turns

    @property
    def eou_blank_frames(self) -> int | None:
        """server_vad ``silence_duration_ms`` as an EOU blank fence in positions (§8.3 tuning map), else None."""
        td = self.turn_detection
        if td is None or td.get("type") != "server_vad":
            return None
        ms = td.get("silence_duration_ms")
        if ms is None:
            return None
        return max(1, -(-ms // CHUNK_MS))


def default_settings(lane: Lane, *, model: str | None = None, instructions: str = "") -> SessionSettings:
    if lane not in DEFAULT_INPUT_RATES:
        raise ValueError(f"lane must be one of {', '.join(DEFAULT_INPUT_RATES)}, got {lane!r}")
    return SessionSettings(
        lane=lane,
        model=model,
        instructions=instructions,
        tools=(),
        tools_wire=(),
        tool_choice="auto",
        # GA clients default to audio only (openai forbids both together); DuplexClient asks for both
        output_modalities=("audio",) if lane == "openai" else MODALITIES,
        input_format=PCM16,
        input_rate=DEFAULT_INPUT_RATES[lane],
        output_format=PCM16,
        output_rate=DEFAULT_OUTPUT_RATE,
        # OpenAI lane: model-owned turns unless the client sends turn_detection null (OpenAI's default is a VAD,
        # and this model's own EOU is semantic); the full lane's null is model-owned already
        turn_detection={"type": "semantic_vad"} if lane == "openai" else None,
        # GA's interrupt_response defaults to true: the user's speech cancels the response
        overlap_policy="barge_in_on_speech" if lane == "openai" else "listen_only",
    )


# ------------------------------------------------------------------------------------------------- reading


_ABSENT: Any = object()


def _at(obj: Any, path: str) -> Any:
    """The value at a dotted path, or _ABSENT when a key is missing (or a parent is not an object)."""
    for key in path.split("."):
        if not isinstance(obj, Mapping) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _first(update: Mapping[str, Any], *paths: str, keep_null: bool = False) -> tuple[Any, str]:
    """The first spelling present (and non-null unless ``keep_null``) as (value, path); (_ABSENT, paths[0])."""
    for path in paths:
        value = _at(update, path)
        if value is _ABSENT or (value is None and not keep_null):
            continue
        return value, path
    return _ABSENT, paths[0]


def _invalid(message: str, param: str) -> FieldRejected:
    return FieldRejected("invalid_session_config", message, param)


def _check_objects(update: Mapping[str, Any]) -> None:
    for path in ("audio", "audio.input", "audio.output", "extra_body"):
        value = _at(update, path)
        if value is not _ABSENT and value is not None and not isinstance(value, Mapping):
            raise _invalid(f"{path} must be an object", path)


def _modalities(update: Mapping[str, Any], current: tuple[str, ...]) -> tuple[str, ...]:
    value, param = _first(update, "modalities", "output_modalities")
    if value is _ABSENT:
        return current
    if not isinstance(value, list) or not value or any(m not in MODALITIES for m in value):
        raise _invalid(f"{param} must be a non-empty list of 'audio' and 'text'", param)
    return tuple(m for m in MODALITIES if m in value)


def _format(value: Any, param: str, *, output: bool) -> tuple[str | None, int | None]:
    """(canonical format, rate carried by a GA object); a GA object without ``type`` only carries a rate."""
    try:
        return format_and_rate(value, param, output=output)
    except AudioFormatError as exc:
        if exc.code == "unsupported_audio_format":
            raise FieldRejected("unsupported_audio_format", str(exc), param) from None
        raise _invalid(str(exc), exc.param or param) from None


def _rate_error(exc: AudioFormatError) -> FieldRejected:
    param = exc.param or "sample_rate_hz"
    return _invalid(str(exc), param.removeprefix("session."))


def _input_audio(update: Mapping[str, Any], current: SessionSettings) -> tuple[str, int]:
    value, param = _first(update, "input_audio_format", "audio.input.format")
    fmt, flat_rate = (None, None) if value is _ABSENT else _format(value, param, output=False)
    fmt = fmt or current.input_format
    rate_given = _first(
        update, "sample_rate_hz", "sample_rate", "audio.input.sample_rate_hz", "audio.input.format.rate"
    )[0]
    if rate_given is _ABSENT and flat_rate is not None:
        return fmt, flat_rate
    if rate_given is _ABSENT and fmt == current.input_format:
        return fmt, current.input_rate
    # a new format without a rate falls back to that format's default (G.711: 8 kHz), not the old rate
    try:
        return fmt, input_sample_rate(None, update, lane=current.lane, format=fmt)
    except AudioFormatError as exc:
        raise _rate_error(exc) from None


def _output_audio(update: Mapping[str, Any], current: SessionSettings) -> tuple[str, int]:
    value, param = _first(update, "output_audio_format", "response_format", "audio.output.format")
    fmt = None if value is _ABSENT else _format(value, param, output=True)[0]
    fmt = fmt or current.output_format
    rate_given = _first(update, "audio.output.format.rate", "audio.output.sample_rate_hz")[0]
    if rate_given is _ABSENT and fmt == current.output_format:
        return fmt, current.output_rate
    # only the audio.output block: a top-level sample_rate is the input rate here (DuplexClient)
    output = _at(update, "audio.output")
    session = {"audio": {"output": output}} if isinstance(output, Mapping) else None
    try:
        return fmt, output_sample_rate(session, format=fmt)
    except AudioFormatError as exc:
        raise _rate_error(exc) from None


def _bad_td(message: str) -> FieldRejected:
    return FieldRejected("unsupported_turn_detection", message, "turn_detection")


def _turn_detection(value: Any, lane: Lane) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _bad_td("turn_detection must be null or an object")
    kind = value.get("type")
    if kind == "server_vad":
        allowed = _SERVER_VAD_KEYS
    elif kind == "semantic_vad":
        allowed = _SEMANTIC_VAD_KEYS
    else:
        raise _bad_td(f"turn_detection.type must be 'server_vad' or 'semantic_vad' (or null), got {kind!r}")
    extra = sorted(str(k) for k in value if k not in allowed)
    if extra:
        raise _bad_td(f"unsupported {kind} fields: {', '.join(extra)}")
    for key, ok, rule in (
        ("threshold", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        ("prefix_padding_ms", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        ("silence_duration_ms", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        ("min_speech_duration_ms", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        ("idle_timeout_ms", lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        ("create_response", lambda v: isinstance(v, bool), "a boolean"),
        # server_vad always barges in (overlap_policy), so interrupt_response:false cannot be honoured
        ("interrupt_response", lambda v: v is True or kind == "semantic_vad" and isinstance(v, bool),
         "true" if kind == "server_vad" else "a boolean"),
        ("eagerness", lambda v: v in _EAGERNESS, f"one of {', '.join(_EAGERNESS)}"),
    ):
        v = value.get(key)
        if v is not None and not ok(v):
            raise _bad_td(f"turn_detection.{key} must be {rule}, got {v!r}")
    if lane == "openai" and value.get("create_response") is False:
        # The model answers its own end of turn; a VAD turn that waits for response.create is not servable.
        # turn_detection null gives the client the turns instead (commit, then response.create).
        raise FieldRejected("unsupported_turn_detection",
                            f"{kind} with create_response false is not supported: this model answers its own end "
                            "of turn; use turn_detection null for client-owned turns",
                            "turn_detection.create_response")
    return dict(value)


def _overlap_policy(update: Mapping[str, Any], td: dict | None, td_given: bool, current: str) -> str:
    value = update.get("overlap_policy")
    if value is not None and value not in OVERLAP_POLICIES:
        raise _invalid(f"overlap_policy must be one of {', '.join(OVERLAP_POLICIES)}", "overlap_policy")
    server_vad = td is not None and td.get("type") == "server_vad"
    if server_vad:
        if value is not None and value != "barge_in_on_speech":
            raise _bad_td("server_vad implies overlap_policy 'barge_in_on_speech'")
        return "barge_in_on_speech"
    if value is not None:
        return value
    if td is not None and td.get("type") == "semantic_vad":
        # GA: interrupt_response (default true) cancels the response when the user's speech starts; false keeps it
        return "listen_only" if td.get("interrupt_response") is False else "barge_in_on_speech"
    # model-owned turns without a VAD (null) listen through overlaps
    return "listen_only" if td_given else current


def _tools(update: Mapping[str, Any], current: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    value, param = _first(update, "tools", "extra_body.realtime_tools", keep_null=True)
    if value is _ABSENT:
        return current
    if value is None:
        return ()
    try:
        return normalize_tools(value)
    except InvalidTools as exc:
        raise _invalid(str(exc), param) from None


def _tools_wire(tools: tuple[ToolSpec, ...]) -> tuple[dict, ...]:
    return tuple({"type": "function", **tool_to_dict(t)} for t in tools)


def _echo(update: Mapping[str, Any], current: dict) -> dict:
    echo = dict(current)
    for name, paths, ok, rule in (
        ("temperature", ("temperature",), is_number, "a number"),
        ("max_tokens", ("max_response_output_tokens", "max_output_tokens", "max_tokens"),
         lambda v: v == "inf" or is_int(v) and v >= 1, "an integer >= 1 or 'inf'"),
        ("speed", ("speed", "audio.output.speed"), is_number, "a number"),
        ("transcription", ("input_audio_transcription", "audio.input.transcription"),
         lambda v: isinstance(v, Mapping), "an object"),
        ("noise_reduction", ("input_audio_noise_reduction", "audio.input.noise_reduction"),
         lambda v: isinstance(v, Mapping), "an object"),
        ("tracing", ("tracing",), lambda v: v == "auto" or isinstance(v, Mapping), "'auto' or an object"),
        # GA-only fields: held to their GA values so the OpenAI lane's echo stays schema-valid
        ("include", ("include",), lambda v: isinstance(v, list) and all(i in _GA_INCLUDE for i in v),
         f"a list of {', '.join(_GA_INCLUDE)}"),
        ("truncation", ("truncation",), lambda v: v in ("auto", "disabled") or _retention_ratio(v),
         "'auto', 'disabled' or a retention_ratio object"),
        ("prompt", ("prompt",), lambda v: isinstance(v, Mapping) and isinstance(v.get("id"), str),
         "an object with a string id"),
        ("metadata", ("metadata",), lambda v: True, ""),
        ("ref_audio", ("ref_audio",), lambda v: True, ""),
    ):
        value, param = _first(update, *paths, keep_null=True)
        if value is _ABSENT:
            continue
        if value is None:
            echo.pop(name, None)
        elif not ok(value):
            raise _invalid(f"{param} must be {rule}", param)
        else:
            echo[name] = copy.deepcopy(value)
    return echo


def _retention_ratio(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and value.get("type") == "retention_ratio"
        and is_number(value.get("retention_ratio"))
        and (value.get("token_limits") is None or isinstance(value.get("token_limits"), Mapping))
    )


def _non_negative(update: Mapping[str, Any], key: str, current: Any, *, integer: bool) -> Any:
    value = update.get(key)
    if value is None:
        return current
    if not (is_int(value) if integer else is_number(value)) or value < 0:
        raise _invalid(f"{key} must be {'an integer' if integer else 'a number'} >= 0", key)
    return value if integer else float(value)


def _apply(
    current: SessionSettings, update: Mapping[str, Any], prompt_locked: bool, audio_started: bool
) -> SessionSettings:
    kind = update.get("type")
    if kind is not None and kind != "realtime":
        raise _invalid(f"session.type must be 'realtime', got {kind!r}", "type")
    _check_objects(update)

    model = update.get("model")
    if model is None:
        model = current.model
    elif not isinstance(model, str):
        raise _invalid("model must be a string", "model")
    elif current.model is not None and model != current.model:
        if current.lane == "openai":
            # Stock SDKs send their own default model name (openai-agents: gpt-realtime-*); this server has one.
            model = current.model
        else:
            raise FieldRejected("model_update_unsupported", f"the session model is {current.model!r}; it cannot change",
                                "model")

    instructions = current.instructions
    if "instructions" in update:
        instructions = update["instructions"]
        if instructions is None:
            instructions = ""
        elif not isinstance(instructions, str):
            raise _invalid("instructions must be a string", "instructions")
        elif len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise _invalid(f"instructions are at most {MAX_INSTRUCTIONS_CHARS} characters", "instructions")
        if prompt_locked and instructions != current.instructions:
            raise FieldRejected(
                "instructions_update_unsupported", "instructions cannot change once the model has started",
                "instructions",
            )

    tools = _tools(update, current.tools)
    if prompt_locked and tools != current.tools:
        raise FieldRejected("tools_update_unsupported", "tools cannot change once the model has started", "tools")

    tool_choice = update.get("tool_choice")
    if tool_choice is not None and tool_choice != "auto":
        raise _invalid("tool_choice must be 'auto'", "tool_choice")

    voice, param = _first(update, "voice", "audio.output.voice")
    if voice is _ABSENT:
        voice = current.voice
    elif not isinstance(voice, str):
        raise _invalid(f"{param} must be a string", param)
    elif audio_started and voice != current.voice:
        raise FieldRejected(
            "voice_update_after_audio_unsupported", "the voice cannot change after the first audio", param
        )

    modalities = _modalities(update, current.output_modalities)
    input_format, input_rate = _input_audio(update, current)
    output_format, output_rate = _output_audio(update, current)

    td_value, _ = _first(update, "turn_detection", "audio.input.turn_detection", keep_null=True)
    td_given = td_value is not _ABSENT
    td = _turn_detection(td_value, current.lane) if td_given else current.turn_detection
    overlap_policy = _overlap_policy(update, td, td_given, current.overlap_policy)

    policy = update.get("playback_commit_policy")
    if policy is None:
        policy = current.playback_commit_policy
    elif policy not in PLAYBACK_COMMIT_POLICIES:
        raise _invalid(
            f"playback_commit_policy must be one of {', '.join(PLAYBACK_COMMIT_POLICIES)}", "playback_commit_policy"
        )

    idle = update.get("idle_timeout_s")
    if idle is None:
        idle = current.idle_timeout_s
    elif not is_number(idle) or not 0 < idle <= MAX_IDLE_TIMEOUT_S:
        raise _invalid(f"idle_timeout_s must be a number > 0 and <= {MAX_IDLE_TIMEOUT_S:g}", "idle_timeout_s")

    extra_body = dict(current.extra_body)
    auto_response = current.auto_response
    initial_user_text = current.initial_user_text
    body = update.get("extra_body")
    if isinstance(body, Mapping):
        extra_body.update({k: copy.deepcopy(v) for k, v in body.items() if k not in _EXTRA_BODY_FIELDS})
        if body.get("auto_response") is not None:
            auto_response = body["auto_response"]
            if not isinstance(auto_response, bool):
                raise _invalid("extra_body.auto_response must be a boolean", "extra_body.auto_response")
        elif body.get("full_duplex") is True:
            auto_response = True
        if "duplex_initial_user_text" in body:
            initial_user_text = body["duplex_initial_user_text"]
            if initial_user_text is not None and not isinstance(initial_user_text, str):
                raise _invalid(
                    "extra_body.duplex_initial_user_text must be a string", "extra_body.duplex_initial_user_text"
                )

    return replace(
        current,
        model=model,
        instructions=instructions,
        tools=tools,
        tools_wire=_tools_wire(tools),
        output_modalities=modalities,
        input_format=input_format,
        input_rate=input_rate,
        output_format=output_format,
        output_rate=output_rate,
        turn_detection=td,
        overlap_policy=overlap_policy,
        overlap_short_ack_ms=_non_negative(update, "overlap_short_ack_ms", current.overlap_short_ack_ms, integer=True),
        overlap_barge_in_ms=_non_negative(update, "overlap_barge_in_ms", current.overlap_barge_in_ms, integer=True),
        overlap_silence_rms=_non_negative(update, "overlap_silence_rms", current.overlap_silence_rms, integer=False),
        playback_commit_policy=policy,
        idle_timeout_s=float(idle),
        voice=voice,
        auto_response=auto_response,
        initial_user_text=initial_user_text,
        extra_body=extra_body,
        echo=_echo(update, current.echo),
    )


def apply_update(
    current: SessionSettings, update: dict, *, prompt_locked: bool, audio_started: bool
) -> SessionSettings | SettingsError:
    """Fold a ``session.update`` ``session`` object into ``current`` (§8.3); never raises.

    ``prompt_locked``: the model has started, so changed instructions/tools are refused (unchanged ones pass,
    as openai-agents resends them). ``audio_started``: output audio went out, so the voice is fixed.
    """
    if not isinstance(update, Mapping):
        return SettingsError("invalid_session_config", "session must be an object", "session")
    try:
        return _apply(current, update, prompt_locked, audio_started)
    except FieldRejected as fail:
        return SettingsError(fail.code, fail.message, fail.param)


# ------------------------------------------------------------------------------------------------- rendering

_GA_TYPES = {G711_ULAW: "audio/pcmu", G711_ALAW: "audio/pcma", PCM_F32LE: "audio/pcm_f32le"}


def _ga_format(fmt: str, rate: int) -> dict:
    """§3.6: GA ``audio/pcm`` allows only ``rate: 24000``; any other rate lives in the sibling sample_rate_hz."""
    if fmt == PCM16:
        return {"type": "audio/pcm", "rate": rate} if rate == 24_000 else {"type": "audio/pcm"}
    return {"type": _GA_TYPES[fmt]}


def render_session(s: SessionSettings, *, session_id: str, state: dict, capabilities: dict) -> dict:
    """The ``session`` object of ``session.created`` / ``session.updated`` (§1.3), rendered for ``s.lane``."""
    echo = copy.deepcopy(s.echo)
    td = copy.deepcopy(s.turn_detection)
    audio_in: dict[str, Any] = {
        "format": _ga_format(s.input_format, s.input_rate),
        "sample_rate_hz": s.input_rate,
        "turn_detection": td,
        "transcription": echo.get("transcription"),
    }
    if s.lane == "openai" and s.input_format == PCM_F32LE:
        del audio_in["format"]  # no GA spelling; the flat input_audio_format carries it
    if "noise_reduction" in echo:
        audio_in["noise_reduction"] = echo["noise_reduction"]
    extra_body = {**copy.deepcopy(s.extra_body), "auto_response": s.auto_response}
    if s.initial_user_text is not None:
        extra_body["duplex_initial_user_text"] = s.initial_user_text

    out: dict[str, Any] = {"object": "realtime.session", "type": "realtime", "id": session_id, "model": s.model}
    out.update(copy.deepcopy(state))
    out.update(
        {
            "modalities": list(s.output_modalities),
            "output_modalities": list(s.output_modalities),
            "instructions": s.instructions,
            "voice": s.voice,
            "response_format": s.output_format,
            "input_audio_format": s.input_format,
            "output_audio_format": s.output_format,
            "audio": {
                "input": audio_in,
                "output": {
                    "format": _ga_format(s.output_format, s.output_rate),
                    "sample_rate_hz": s.output_rate,
                    "voice": s.voice,
                },
            },
            "turn_detection": copy.deepcopy(td),
            "input_audio_transcription": copy.deepcopy(echo.get("transcription")),
            "tools": copy.deepcopy(list(s.tools_wire)),
            "tool_choice": s.tool_choice,
            "tracing": echo.get("tracing"),
            "temperature": echo.get("temperature"),
            "max_tokens": echo.get("max_tokens"),
            "max_output_tokens": echo.get("max_tokens"),
            "speed": echo.get("speed"),
        }
    )
    for name in ("include", "truncation", "prompt", "metadata", "ref_audio"):
        if name in echo:
            out[name] = echo[name]
    out.update(
        {
            "idle_timeout_s": s.idle_timeout_s,
            "overlap_policy": s.overlap_policy,
            "overlap_short_ack_ms": s.overlap_short_ack_ms,
            "overlap_barge_in_ms": s.overlap_barge_in_ms,
            "overlap_silence_rms": s.overlap_silence_rms,
            "playback_commit_policy": s.playback_commit_policy,
            "extra_body": extra_body,
            "capabilities": copy.deepcopy(capabilities),
        }
    )
    return out
