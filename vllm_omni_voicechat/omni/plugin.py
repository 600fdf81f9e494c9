"""``VoiceChatDuplexPlugin``: our vLLM-Omni 0.30.0 ``DuplexModelPlugin``, first slice.

What is ours here: the plugin identity, the private runtime keys our runtime owns (position limit, settlement
fence, function-call bounds), the capabilities our runtime serves (80 ms, several sessions, resume, barge-in,
tools, typed input), client ``extra_body`` validation (private keys, our tool normalization), the system prompt
with the NVIDIA tool block rendered by ``vllm_omni_voicechat.model.prompt.render_system_prompt`` and tokenized
with the checkpoint tokenizer, immutability of instructions/tools inside a session, and our session position
limit on every append.

What is delegated, by composition, to vLLM-Omni's in-tree ``NemotronVoiceChatDuplexPlugin``
(``vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin``) until our engine-side Stage-0 runner
lands: Stage-0 sampling policy, frame-locked append planning, the Stage-0 direct-response decision, the per-session
PCM packetizer state, the data-plane projection and its context, the checkpoint tokenizer / special-token
resolution, and the function-result channel. Nothing is copied from vLLM-Omni; each delegated hook says so.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vllm_omni.engine.duplex.config import DuplexCapabilities, DuplexSessionConfig
from vllm_omni.engine.duplex.contracts import (
    DuplexAppendPlan,
    DuplexFence,
    DuplexOutputDecision,
    duplex_resource_request_belongs_to_session,
)
from vllm_omni.engine.duplex.plugin import (
    DuplexModelPlugin,
    DuplexModelSessionState,
    DuplexRuntimeConfigError,
    EncodeAudio,
    reject_private_runtime_keys,
)
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.capabilities import (
    nemotron_voicechat_capabilities,
)
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.data_plane import (
    NemotronVoiceChatDataPlaneSession,
)
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.input import NEMOTRON_VOICECHAT_FRAME_SAMPLES
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin import (
    PRIVATE_RUNTIME_CONFIG_KEYS as NEMOTRON_PRIVATE_RUNTIME_CONFIG_KEYS,
)
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin import NemotronVoiceChatDuplexPlugin

from ..errors import VoicechatError
from ..model.port import SessionPrompt, ToolSpec
from ..model.prompt import render_system_prompt
from ..runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from ..session.functions import (
    FUNCTION_CALL_TIMEOUT_S,
    FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES,
    MAX_FUNCTION_CALLS_PER_RESPONSE,
)
from ..session.settlement import DEFAULT_FENCE
from ..session.tools import InvalidTools, normalize_tools, tool_to_dict
from .bus import Stage0Bus, Stage0Output
from .envelope import VC_KEY
from .stage2 import Stage2AudioError, stage2_audio
from .talker.seed import MAX_SEED, digest_seed

if TYPE_CHECKING:
    from vllm.config import ModelConfig

PLUGIN_PATH = "vllm_omni_voicechat.omni.plugin.VoiceChatDuplexPlugin"
CHUNK_PERIOD_MS = 80

# Our runtime's server-owned keys (deploy-YAML bounds; a client may never set them through extra_body).
VC_MAX_SESSION_MODEL_FRAMES = "vc_max_session_model_frames"
VC_SETTLEMENT_BLANK_FRAMES = "vc_settlement_blank_frames"
VC_FUNCTION_CALL_TIMEOUT_S = "vc_function_call_timeout_s"
VC_MAX_FUNCTION_CALLS_PER_RESPONSE = "vc_max_function_calls_per_response"
VC_FUNCTION_RECOVERY_MAX_FRAMES = "vc_function_recovery_max_frames"
VC_RENDERED_PROMPT = "vc_rendered_prompt"
VC_TALKER_SEED = "vc_talker_seed"
SEED_KEY = "voicechat_seed"
"""A client's choice of the session's talker seed (``extra_body``): an integer 0 .. 2**63 - 1."""

RUNTIME_DEFAULTS: Mapping[str, object] = {
    VC_MAX_SESSION_MODEL_FRAMES: DEFAULT_MAX_SESSION_MODEL_FRAMES,
    VC_SETTLEMENT_BLANK_FRAMES: DEFAULT_FENCE,
    VC_FUNCTION_CALL_TIMEOUT_S: FUNCTION_CALL_TIMEOUT_S,
    VC_MAX_FUNCTION_CALLS_PER_RESPONSE: MAX_FUNCTION_CALLS_PER_RESPONSE,
    VC_FUNCTION_RECOVERY_MAX_FRAMES: FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES,
}

VOICECHAT_PRIVATE_RUNTIME_CONFIG_KEYS = frozenset({*RUNTIME_DEFAULTS, VC_RENDERED_PROMPT, VC_TALKER_SEED})
# The in-tree Nemotron keys stay private too: the delegated planner and data plane read them.
PRIVATE_RUNTIME_CONFIG_KEYS = VOICECHAT_PRIVATE_RUNTIME_CONFIG_KEYS | NEMOTRON_PRIVATE_RUNTIME_CONFIG_KEYS


LATEST_ONLY_KEYS = (
    "vc_step", "nvc_function_token",  # Stage 0: this position's evidence and function token
    "codes.audio", "latent", "meta.nvc_logical_prompt_len", "meta.codec_streaming",  # Stage 1's per-step outputs
)
"""The per-position outputs of our sessions' stages that vLLM-Omni's output processor must not accumulate."""


def keep_latest_outputs() -> None:
    """vLLM-Omni's output processor keeps every multimodal output of a request for the request's life and, on each
    finished segment, concatenates the history (``OmniRequestState.mm_accumulated``; in DELTA mode it drains only
    ``audio`` / ``image``). A duplex session is one request that finishes a segment every position, so each position
    concatenated everything before it: measured on the CPU engine, one session's step went from 26 ms at 0-30 s to
    99 ms at 60-70 s, three quarters of the API process in ``_cat_tensors``; the talker's ``codes.audio`` (already
    cumulative per step) grew quadratically. Each key here is a per-position value (or, for ``codes.audio``, a
    snapshot): keep the latest only, through vLLM-Omni's own per-key strategy registry."""
    from vllm_omni.outputs.output_modality import TensorAccumulationStrategy, register_key_accumulation_strategy

    for key in LATEST_ONLY_KEYS:
        register_key_accumulation_strategy(key, TensorAccumulationStrategy.REPLACE)


class VoiceChatRuntimeConfigError(VoicechatError, DuplexRuntimeConfigError):
    """A client configuration our plugin rejects (reported with ``code``)."""


def _with_seed(params: Any, seed: int) -> Any:
    params = params.clone() if hasattr(params, "clone") else deepcopy(params)
    params.seed = seed
    return params


def _stage_id(output: Any) -> int | None:
    stage_id = getattr(output, "stage_id", None)
    if stage_id is None:
        stage_id = getattr(getattr(output, "request_output", None), "stage_id", None)
    return stage_id if isinstance(stage_id, int) else None


class VoiceChatDataPlane(NemotronVoiceChatDataPlaneSession):
    """The data plane of our plugin.

    Sessions driven by our engine-side port (they have a bus channel): Stage-2 audio goes into the channel's
    aligner and nothing is projected to vLLM-Omni's wire layer (our server speaks to the client). Other sessions
    get the in-tree Nemotron projection unchanged.
    """

    bus: Stage0Bus | None = None

    def project(self, result, *, context=None):
        outputs = result.get("data_plane_outputs", []) if isinstance(result, dict) else []
        bus = self.bus
        channels = [(o, bus.for_request(getattr(o, "request_id", None))) for o in outputs] if bus else []
        if not any(channel is not None for _, channel in channels):
            return super().project(result, context=context)
        for output, channel in channels:
            if channel is not None and _stage_id(output) == 2:
                try:
                    audio = stage2_audio(output)
                except Stage2AudioError as exc:
                    channel.fail(str(exc))
                    continue
                if audio is not None:
                    channel.put_audio(audio)
        return iter(())


class VoiceChatDuplexPlugin(DuplexModelPlugin):
    """Nemotron VoiceChat served through the voicechat runtime (see the module docstring for what is ours)."""

    plugin_id = "nemotron_voicechat_runtime"
    private_runtime_config_keys = PRIVATE_RUNTIME_CONFIG_KEYS
    #: One silence continuation unit is one 80 ms frame at 16 kHz.
    silence_continuation_samples = NEMOTRON_VOICECHAT_FRAME_SAMPLES
    data_plane: VoiceChatDataPlane

    def __init__(self, encode_audio: EncodeAudio, *, runtime_defaults: Mapping[str, object] | None = None) -> None:
        super().__init__(encode_audio)
        keep_latest_outputs()
        self.data_plane = VoiceChatDataPlane(encode_audio)
        self._nemotron = NemotronVoiceChatDuplexPlugin(encode_audio)
        # One engine-scoped data plane: the delegate's hooks and ours must see the same instance.
        self._nemotron.data_plane = self.data_plane
        # Engine-scoped: our port's sessions meet the orchestrator-side hooks here.
        self.bus = Stage0Bus(duplex_resource_request_belongs_to_session)
        self.data_plane.bus = self.bus
        # Inside `vllm-omni serve` (we are loaded before the app includes vLLM-Omni's router): our routes.
        from .mount import install_for_serve

        install_for_serve(self)
        self.runtime_defaults: dict[str, object] = {**RUNTIME_DEFAULTS, **(runtime_defaults or {})}
        unknown = set(self.runtime_defaults) - set(RUNTIME_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown voicechat runtime keys: {sorted(unknown)}")

    SETTINGS_TO_RUNTIME: Mapping[str, str] = {
        "max_session_model_frames": VC_MAX_SESSION_MODEL_FRAMES,
        "settlement_blank_frames": VC_SETTLEMENT_BLANK_FRAMES,
        "function_call_timeout_s": VC_FUNCTION_CALL_TIMEOUT_S,
        "function_recovery_max_frames": VC_FUNCTION_RECOVERY_MAX_FRAMES,
    }

    def apply_settings(self, settings: Mapping[str, object]) -> None:
        """Our runtime's bounds from the deploy YAML's ``voicechat:`` block (one source of truth for the plugin's
        own backstop and the server's runtime; the mount calls it at start-up)."""
        for name, key in self.SETTINGS_TO_RUNTIME.items():
            if name in settings:
                self.runtime_defaults[key] = settings[name]

    # ---- engine policy ----

    def configure_sampling_params(
        self,
        *,
        runtime_config: dict[str, object],
        defaults: tuple[object, ...],
    ) -> tuple[object, ...]:
        # Delegated: Stage 0 greedy (temperature 0, top_p 1, top_k 0), max_tokens 1 (one token per position),
        # ignore_eos, and DELTA output on every stage. This is exactly our Stage-0 contract.
        configured = self._nemotron.configure_sampling_params(runtime_config=runtime_config, defaults=defaults)
        # Ours: the session's talker seed as Stage 1's sampling seed, which vLLM-Omni's runner hands the talker
        # (``_omni_seed``); our talker draws its noise from a stream of that seed (omni/talker).
        seed = runtime_config.get(VC_TALKER_SEED)
        if isinstance(seed, int) and len(configured) > 1 and hasattr(configured[1], "seed"):
            configured = (configured[0], _with_seed(configured[1], seed), *configured[2:])
        return configured

    def plan_append(
        self,
        *,
        request_id: str,
        fence: DuplexFence,
        session_config: dict[str, object],
        runtime_config: dict[str, object],
        seq: int,
        turn_seq: int,
        payload: object,
        final: bool,
        sampling_params: object,
    ) -> DuplexAppendPlan:
        # Ours: the session position limit (deploy bound), checked before any model work.
        limit = int(runtime_config.get(VC_MAX_SESSION_MODEL_FRAMES, self.runtime_defaults[VC_MAX_SESSION_MODEL_FRAMES]))
        if seq > limit:
            raise ValueError(f"session_position_limit: position {seq} exceeds the session limit of {limit} positions")
        # Delegated: exact 80 ms pcm_f32le frame validation, the Stage-0 max_model_len bound, and the
        # resumable prompt (system prompt ids + PAD on the first position, PAD afterwards).
        plan = self._nemotron.plan_append(
            request_id=request_id,
            fence=fence,
            session_config=session_config,
            runtime_config=runtime_config,
            seq=seq,
            turn_seq=turn_seq,
            payload=payload,
            final=final,
            sampling_params=sampling_params,
        )
        # Ours: the position's controls ride the append envelope as model fields (one push per position).
        channel = self.bus.for_request(request_id)
        if channel is not None:
            vc = channel.pop_controls()
            if vc is not None:
                plan.prompt["model_intermediate_buffer"]["duplex"][VC_KEY] = vc
        return plan

    def decide_output(
        self,
        *,
        stage_id: int,
        final_stage_id: int,
        segment_finished: bool,
        segment_token_ids: tuple[int, ...],
        segment_output_metadata: dict[str, object],
        output: object,
    ) -> DuplexOutputDecision | None:
        if stage_id == 0 and segment_finished:
            # Ours: the Stage-0 tap, before the runner's mailbox and epoch filter (stale epochs are dropped by
            # request id: the bus only knows the session, the port restarts the channel on a new request).
            channel = self.bus.for_request(getattr(output, "request_id", None))
            if channel is not None:
                channel.put_stage0(
                    Stage0Output(output.request_id, tuple(segment_token_ids), dict(segment_output_metadata or {}))
                )
        # Delegated: Stage 0 tokens are a direct (client-visible) response side channel; later stages flow on.
        return self._nemotron.decide_output(
            stage_id=stage_id,
            final_stage_id=final_stage_id,
            segment_finished=segment_finished,
            segment_token_ids=segment_token_ids,
            segment_output_metadata=segment_output_metadata,
            output=output,
        )

    # ---- session policy ----

    def create_session_state(self) -> DuplexModelSessionState:
        # Delegated: the framework flag set with the in-tree 80 ms PCM packetizer.
        return self._nemotron.create_session_state()

    def capabilities(self, *, max_sessions: int) -> DuplexCapabilities:
        # Start from the in-tree Nemotron preset (frame-locked resumable Stage 0, model-native turn policy) and
        # state what our runtime adds. Tools have no DuplexCapabilities field in 0.30.0; typed input maps to
        # supports_text_only_turn. Video is not accepted.
        several = max_sessions > 1
        return replace(
            nemotron_voicechat_capabilities(max_sessions=max_sessions),
            chunk_period_ms=CHUNK_PERIOD_MS,
            supports_multi_session=several,
            supports_multi_session_same_replica=several,
            supports_session_lease=True,
            supports_session_resume=True,
            supports_barge_in=True,
            # typed input needs a synthesizer on the engine: Pocket TTS (extra `pocket`)
            supports_text_only_turn=importlib.util.find_spec("pocket_tts") is not None,
            optional_input_modalities=frozenset(),
        )

    def validate_client_extra_body(self, extra_body: object) -> None:
        reject_private_runtime_keys(
            extra_body,
            self.private_runtime_config_keys,
            message="voicechat runtime configuration is server-owned: ",
            error_cls=VoiceChatRuntimeConfigError,
        )
        if isinstance(extra_body, dict) and extra_body.get("realtime_tools") is not None:
            self._tools(extra_body)
        if isinstance(extra_body, dict) and SEED_KEY in extra_body:
            seed = extra_body[SEED_KEY]
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise VoiceChatRuntimeConfigError(f"{SEED_KEY} must be an integer from 0 to 2**63 - 1, not {seed!r}",
                                                  code="invalid_seed")

    @staticmethod
    def _tools(extra_body: Mapping[str, object]) -> tuple[ToolSpec, ...]:
        raw = extra_body.get("realtime_tools")
        if raw is None:
            return ()
        try:
            return normalize_tools(raw)
        except InvalidTools as exc:
            raise VoiceChatRuntimeConfigError(str(exc), code="invalid_tools") from exc

    def session_prompt(self, config: DuplexSessionConfig) -> tuple[SessionPrompt, str]:
        """The session prompt (instructions + our normalized tools) and its tool signature."""
        tools = self._tools(config.extra_body)
        signature = json.dumps([tool_to_dict(t) for t in tools], sort_keys=True, separators=(",", ":"))
        return SessionPrompt(instructions=str(config.instructions or ""), tools=tools), signature

    def render_prompt(self, config: DuplexSessionConfig) -> str:
        return render_system_prompt(self.session_prompt(config)[0])

    async def _tokenizer_runtime(self, model_config: ModelConfig | None) -> tuple[dict[str, object], Any]:
        # Private seam: vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin
        # NemotronVoiceChatDuplexPlugin._tokenizer_runtime (async, returns (special-token ids incl.
        # nvc_tokenizer_ref, tokenizer), cached per tokenizer ref). Reusing it also fills the cache that the
        # delegated runtime_config_for_function_output reads. Covered by tests/test_omni_plugin.py.
        return await self._nemotron._tokenizer_runtime(model_config)

    async def prepare_runtime_config(
        self,
        config: DuplexSessionConfig,
        *,
        model_config: ModelConfig | None,
    ) -> dict[str, object]:
        self.validate_client_extra_body(config.extra_body)
        prompt, signature = self.session_prompt(config)
        rendered = render_system_prompt(prompt)
        max_model_len = getattr(model_config, "max_model_len", None)
        if not isinstance(max_model_len, int) or max_model_len <= 0:
            raise VoiceChatRuntimeConfigError("voicechat requires a positive Stage-0 max_model_len")
        special, tokenizer = await self._tokenizer_runtime(model_config)
        body = await asyncio.to_thread(tokenizer.encode, rendered, add_special_tokens=False)
        runtime: dict[str, object] = dict(special)
        bos, eos = int(special["nvc_text_bos_id"]), int(special["nvc_text_eos_id"])
        runtime["nvc_prompt_token_ids"] = [bos, *map(int, body), eos]
        runtime["nvc_max_model_len"] = max_model_len
        runtime["nvc_tools_signature"] = signature
        runtime["instructions"] = prompt.instructions
        runtime[VC_RENDERED_PROMPT] = rendered
        # The same conversation is answered with the same audio: the talker's seed is the client's, or the prompt's.
        chosen = config.extra_body.get(SEED_KEY) if isinstance(config.extra_body, dict) else None
        runtime[VC_TALKER_SEED] = chosen if isinstance(chosen, int) else digest_seed("prompt", rendered)
        runtime.update(self.runtime_defaults)
        self.data_plane.configure_runtime(runtime, tokenizer=tokenizer)
        return runtime

    def runtime_config_for_update(
        self,
        config: DuplexSessionConfig,
        current: Mapping[str, object],
    ) -> dict[str, object]:
        self.validate_client_extra_body(config.extra_body)
        prompt, signature = self.session_prompt(config)
        runtime = deepcopy(dict(current))
        # The rendered prompt is resident in Stage-0 KV: changing it inside a session would desynchronize the
        # advertised configuration from model state.
        if runtime and prompt.instructions != runtime.get("instructions"):
            raise VoiceChatRuntimeConfigError(
                "instructions cannot change inside an active voicechat session", code="immutable_instructions"
            )
        if runtime and signature != runtime.get("nvc_tools_signature", "[]"):
            raise VoiceChatRuntimeConfigError(
                "tools cannot change inside an active voicechat session", code="immutable_tools"
            )
        return runtime

    def runtime_config_for_function_output(
        self,
        config: DuplexSessionConfig,
        current: Mapping[str, object],
        item: Mapping[str, object],
    ) -> dict[str, object] | None:
        # Delegated until the engine-side runner: the in-tree function-result channel (tokenized
        # <TOOL_RESPONSE> batches drained one token per frame). Our applied acknowledgements come with the runner.
        return self._nemotron.runtime_config_for_function_output(config, current, item)

    def runtime_config_after_model_output(
        self,
        current: Mapping[str, object],
        output_metadata: Mapping[str, object],
    ) -> dict[str, object] | None:
        # Delegated: retire function-result batches the thinker has consumed.
        return self._nemotron.runtime_config_after_model_output(current, output_metadata)

    def data_plane_context(
        self,
        *,
        epoch: int,
        turn_id: int,
        active_response_turn_id: int | None,
        active_response_id: str | None,
        auto_responds: bool,
        response_format: str,
        speed: float | None,
        modalities: tuple[str, ...],
    ) -> object:
        # Delegated: the in-tree data plane's context type.
        return self._nemotron.data_plane_context(
            epoch=epoch,
            turn_id=turn_id,
            active_response_turn_id=active_response_turn_id,
            active_response_id=active_response_id,
            auto_responds=auto_responds,
            response_format=response_format,
            speed=speed,
            modalities=modalities,
        )


__all__ = [
    "PLUGIN_PATH",
    "PRIVATE_RUNTIME_CONFIG_KEYS",
    "RUNTIME_DEFAULTS",
    "VoiceChatDataPlane",
    "VoiceChatDuplexPlugin",
    "VoiceChatRuntimeConfigError",
]
