"""Server configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..ids import SYSTEM_IDS, Ids
from ..model.port import ModelPort
from ..runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from ..session.core import SessionConfig
from ..session.functions import FUNCTION_CALL_TIMEOUT_S, FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES
from ..session.settlement import DEFAULT_FENCE
from ..sim.model import SimBehaviour, SimulatorModel
from ..sim.real_speech import EspeakSynthesizer, check_available
from ..synth.port import Synthesizer
from ..synth.simulated import SimulatorSynthesizer
from ..wire.limits import TIERED_MAX_MESSAGE_BYTES, V3_MAX_MESSAGE_BYTES
from ..wire.tiered import journal
from ..wire.tiered.schema import DISCONNECT_GRACE_S, HANDSHAKE_TIMEOUT_S
from ..wire.v3 import schema as v3_schema
from ..wire.v3.schema import RECEIVE_QUEUE_MESSAGES


@dataclass(slots=True)
class ServerConfig:
    max_sessions: int = 4
    max_session_model_frames: int = DEFAULT_MAX_SESSION_MODEL_FRAMES
    settlement_blank_frames: int = DEFAULT_FENCE
    settlement_await_s: float = 0.0
    """``SessionConfig.settlement_await_s``: the engine's deploy YAML sets it beside its tick."""
    default_instructions: str = ""
    function_call_timeout_s: float = FUNCTION_CALL_TIMEOUT_S
    function_recovery_max_frames: int = FUNCTION_OUTPUT_RECOVERY_MAX_FRAMES
    model_kind: str = "simulator"
    speech: str = "simulator"
    """What the simulator hears and speaks: ``simulator`` (its deterministic tone speech) or ``real`` (PocketSphinx
    in, eSpeak NG out); reported by ``/health``, shown by the page."""
    model_factory: Callable[[], ModelPort] = field(default=lambda: SimulatorModel())
    synthesizer: Synthesizer | None = field(default_factory=SimulatorSynthesizer)
    realtime_default: str = "v3"
    """What a bare ``/v1/realtime`` (no ``duplex``/``model`` query, no ``OpenAI-Beta``) speaks: v3 | tiered |
    tiered-openai."""
    v3_turns: str = "client"
    """Who owns v3 turns, in the contract's words: ``client`` (production: client barriers) or ``legacy`` (its
    diagnostic RNNT-owned mode: the model's end-of-utterance opens responses, ``turn_start`` is unsupported); the
    session's turn policy follows (``wire.v3.schema.V3_TURN_POLICY``)."""
    admission_queue: int = 0
    """Tiered connections that may wait for a slot when every slot is taken (a FIFO with ``session.queued`` /
    ``queue_update`` / ``queue_done``); 0: none, a full server answers busy at once. v3 always answers busy at
    once (its contract defines nothing before ``session.created``)."""
    admission_timeout_s: float = 30.0
    """How long a connection may wait in that queue before it gets the busy answer."""
    disconnect_grace_s: float = DISCONNECT_GRACE_S
    """How long a detached tiered session waits for ``session.resume``."""
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    """How long a tiered socket without autostart may wait before its first message (then config_timeout)."""
    warmup_positions: int = 0
    """Silent positions of a throwaway session run before the server admits clients (0: none). A failing warmup
    fails the startup: a model home that cannot run positions should not accept sessions. The simulator needs
    none; real model homes do (first-position compilation and allocation)."""
    journal_max_bytes: int = journal.DEFAULT_MAX_BYTES
    journal_ttl_s: float = journal.DEFAULT_TTL_S
    # Input limits (docs/reliability.md, "Input limits").
    v3_max_message_bytes: int = V3_MAX_MESSAGE_BYTES
    """The largest v3 client message (1 MiB): a larger one closes the socket with 1009 before it is buffered."""
    tiered_max_message_bytes: int = TIERED_MAX_MESSAGE_BYTES
    """The largest tiered client message (16 MiB; the dialect answers one over 15 MiB with ``event_too_large``)."""
    v3_configure_timeout_s: float | None = v3_schema.CONFIGURE_TIMEOUT_S
    """A v3 session with no ``session.update`` this long after ``session.created`` ends (None: never)."""
    v3_idle_timeout_s: float | None = v3_schema.IDLE_TIMEOUT_S
    """A v3 session whose client sends nothing this long while the model merely listens ends (None: never)."""
    # Backpressure bounds, per socket (docs/reliability.md, "Backpressure"). Sizes trip them, and a transport that
    # takes nothing at all for a minute; a slow consumer must not trip a transport timer (v3 contract §1).
    max_outbound_bytes: int = 8 << 20
    """Server events queued for one socket but not yet handed to the transport (~2 min of 22.05 kHz audio).
    Beyond it the session's policy runs: tiered detaches the socket (resume within the grace), v3 fails the
    session (fatal ``output_backpressure``, close 1011)."""
    max_outbound_events: int = 16_384
    """The same bound counted in events (~7 min of per-position events)."""
    outbound_stall_timeout_s: float | None = 60.0
    """A socket whose transport takes nothing at all for this long while events wait for it trips the same policy
    as the bounds: a reader that stopped, not a slow one (a reader draining even ~1 KB/s makes the transport
    writable again well within it). Without it, a v3 client that stopped reading while its session was quiet held
    its session until 16,384 metrics events had piled up (~5 minutes). None: sizes only."""
    outbound_close_timeout_s: float = 10.0
    """After a bound tripped: how long the fatal error and close frame may wait for the socket before it is
    aborted (a stalled reader never drains them)."""
    max_inbox_messages: int = RECEIVE_QUEUE_MESSAGES
    """Client messages received but not yet handed to the session (the v3 reference's 256-message receive
    queue). Beyond it a message is refused with a typed recoverable error (v3 ``input_backpressure``, tiered
    ``rate_limit_error/input_backpressure``); as many refusals may be pending, then the reader stops reading."""
    max_inbox_bytes: int = 16 << 20
    """The same bound in bytes (one message of any size always fits an empty inbox)."""
    api_keys: tuple[str, ...] = ()
    """Keys of which every request and WebSocket upgrade under ``/v1`` must carry one (``server/auth.py``: Bearer
    header, or the subprotocol form of browsers); empty: no authentication."""
    external_auth: bool = False
    """A middleware in front of the server checks keys (vLLM's ``--api-key`` inside ``vllm-omni serve``): only
    ``/health`` reports it."""
    replica: str | None = None
    """This process's name among replicas behind a balancer (``fleet/``): full-lane session ids name it, so a
    resume can be routed to its owner by the id in its URL; SIGTERM then drains (no new sessions; the process
    ends when its sessions have). None: a lone server."""
    agent_port: int | None = None
    """Where HAProxy's agent check reads whether this replica takes new sessions (``fleet/agent.py``); None: no
    agent."""
    agent_host: str = "127.0.0.1"
    ids: Ids = SYSTEM_IDS
    """Where session ids, resume tokens and handshake event ids come from (seeded: reproducible runs)."""
    trace_factory: Callable[[str], Any] | None = None
    """Called once per accepted socket with its dialect (``v3``, ``tiered``, ``tiered-openai``); the result (a
    ``vllm_omni_voicechat.trace.TraceChecker`` or alike) sees every frame of that socket (tests check invariants
    on every integration trace). None: no tap."""

    def session_config(self, session_id: str, *, typed_input_ready: bool, **dialect: Any) -> SessionConfig:
        """A new session's core configuration: the server's limits, and what its dialect sets (``dialect``)."""
        return SessionConfig(
            session_id=session_id,
            settlement_blank_frames=self.settlement_blank_frames,
            settlement_await_s=self.settlement_await_s,
            max_session_model_frames=self.max_session_model_frames,
            typed_input_ready=typed_input_ready,
            function_call_timeout_s=self.function_call_timeout_s,
            function_recovery_max_frames=self.function_recovery_max_frames,
            **dialect,
        )

    @classmethod
    def simulator(cls, *, prefill_delay_s: float = 0.05, behaviour: SimBehaviour | None = None,
                  real_speech: bool = False, **kw) -> ServerConfig:
        """The embedded CPU default: the simulator model with a measurable prefill (the model-ready barrier).
        ``real_speech``: it hears PocketSphinx and speaks eSpeak NG (``sim/real_speech.py``; raises
        ``SpeechUnavailable`` naming the install when they are missing), typed input spoken by eSpeak NG too."""
        base = behaviour or SimBehaviour()
        if prefill_delay_s and not base.prefill_delay_s:
            base = replace(base, prefill_delay_s=prefill_delay_s)
        if real_speech:
            check_available()
            kw.setdefault("synthesizer", EspeakSynthesizer())
        return cls(model_kind="simulator", model_factory=lambda: SimulatorModel(base, real_speech=real_speech),
                   speech="real" if real_speech else "simulator", **kw)
