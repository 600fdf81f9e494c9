"""``OmniStage0Port``: our ``ModelPort`` on vLLM-Omni's engine (docs/omni-integration.md §2, D2-D6).

Each of our sessions rides one ``DuplexOmni`` session (admission, per-session request ids, abort on close come
with it). One model position is one ``AppendAudio`` of exactly 1,280 float32 samples, which vLLM-Omni turns into
one submit on the session's resumable Stage-0 request; the position's controls ride the append envelope through
the plugin's bus, and ``step`` waits on the bus for the Stage-0 output (token + ``vc_step`` evidence) and the
position's Stage-2 audio packet. ``step`` runs on the shell's model thread; the session handle lives on the API
event loop, so every call into it hops there with ``run_coroutine_threadsafe``.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import replace
from typing import Any

from vllm_omni.engine.duplex.commands import AppendAudio

from ..model.port import ModelError, ModelTimeout, PositionInput, SessionPrompt, StepResult
from ..session.tools import tool_to_dict
from .alignment import BoundaryRetimer
from .batching import EngineBatcher, TickStamp
from .bus import Channel, ChannelFailure, ChannelTimeout, Stage0Bus
from .envelope import EVIDENCE_KEY, EnvelopeError, decode_step, encode_controls, frame_to_f32

DEFAULT_STEP_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 10.0
"""What we give vLLM-Omni's control RPCs (open, close, cancel_input): its own default."""
CONTROL_GRACE_S = 5.0
"""How much longer we wait than the RPC itself: its own timeout (and its compensating close) fires first."""


class OmniStage0Port:
    def __init__(
        self,
        omni: Any,
        loop: asyncio.AbstractEventLoop,
        bus: Stage0Bus,
        *,
        token_ids=lambda tokens: [],
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        audio_lag: int = 0,
        batcher: EngineBatcher | None = None,
    ) -> None:
        self.omni = omni
        self.loop = loop
        self.bus = bus
        self.batcher = batcher
        """The engine's tick, shared by every session's port (None: each position is submitted at once)."""
        self.token_ids = token_ids
        self.step_timeout_s = step_timeout_s
        self.audio_lag = audio_lag
        self.retimer = BoundaryRetimer(audio_lag)
        self.handle: Any = None
        self.channel: Channel | None = None
        self.position = 0

    def _run(self, coro, timeout_s: float | None = None) -> Any:
        """Run ``coro`` on the API loop and wait; on our timeout the coroutine is cancelled, never orphaned (a
        cancelled ``open_session`` sends vLLM-Omni's compensating close, so a late admission cannot hold a slot)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.step_timeout_s if timeout_s is None else timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _control(self, call) -> Any:
        return self._run(call(timeout=CONTROL_TIMEOUT_S), CONTROL_TIMEOUT_S + CONTROL_GRACE_S)

    # ---- ModelPort ----

    def prefill(self, prompt: SessionPrompt) -> None:
        """A prompt is a session: open one (its first append carries the prompt into Stage 0)."""
        self.abort()
        config = {
            "modalities": ["audio", "text"],
            "input_audio_format": "pcm_f32le",
            "output_audio_format": "pcm16",
            "instructions": prompt.instructions,
            "extra_body": {"auto_response": True, "realtime_tools": [tool_to_dict(t) for t in prompt.tools]},
        }
        try:
            self.handle = self._control(lambda timeout: self.omni.open_session(config, timeout=timeout))
        except Exception as exc:
            raise ModelError(f"vLLM-Omni refused the session: {exc}") from exc
        self.channel = self.bus.open(self.handle.session_id, audio_lag=self.audio_lag)
        if self.batcher is not None:
            self.batcher.enter(self.handle.session_id)
        self.retimer.start()
        self.position = 0
        asyncio.run_coroutine_threadsafe(self._watch(self.handle, self.channel), self.loop)

    @staticmethod
    async def _watch(handle: Any, channel: Channel) -> None:
        """Engine errors for the session fail the position waiting on it, and so does the end of its events: the
        engine closed the session itself (a dead stage's request cleanup, the engine's shutdown), whose
        error never reaches the handle. After our own close the channel has already failed ("session closed")."""
        async for event in handle.events():
            if type(event).__name__ == "ErrorEvent":
                error = getattr(event, "error", None) or getattr(event, "raw", None) or event
                channel.fail(f"vLLM-Omni session error: {error}")
        channel.fail(f"vLLM-Omni ended the session ({getattr(handle, 'close_reason', None) or 'closed'})")

    def step(self, position: PositionInput) -> StepResult:
        handle, channel = self.handle, self.channel
        if handle is None or channel is None:
            raise ModelError("no open session: prefill first")
        if position.controls.reset:
            self._run(handle.cancel_input())  # a new epoch: a new Stage-0 request, re-prefilled
            channel.restart()
            self.retimer.start()
        vc = encode_controls(position.controls, position=self.position, synthetic=position.synthetic,
                             token_ids=self.token_ids)
        append = AppendAudio(audio=frame_to_f32(position.pcm).tobytes(), format="pcm_f32le", sample_rate_hz=16_000)
        stamp: TickStamp | None = None
        started = time.perf_counter()
        try:
            if self.batcher is None:
                channel.push_controls(vc)
                self._run(handle.submit(append))
            else:
                async def submit(tick: TickStamp) -> None:
                    channel.push_controls({**vc, "tick": tick.tick, "tick_size": tick.size})
                    await handle.submit(append)

                stamp = self.batcher.submit(handle.session_id, position.ready, submit, arrived=position.arrived)
                started = time.perf_counter()
            output = channel.wait_stage0(self.step_timeout_s)
            inference_ms = (time.perf_counter() - started) * 1000.0
            audio = channel.wait_packet(self.step_timeout_s)
        except (ChannelTimeout, TimeoutError) as exc:
            raise ModelTimeout(f"position {self.position}: {str(exc) or 'vLLM-Omni took no append in time'}") from exc
        except (ChannelFailure, EnvelopeError) as exc:
            raise ModelError(f"position {self.position}: {exc}") from exc
        except Exception as exc:
            if getattr(handle, "closed", False):  # the engine closed the session before our append (its shutdown)
                raise ModelError(f"position {self.position}: vLLM-Omni ended the session "
                                 f"({getattr(handle, 'close_reason', None) or 'closed'})") from exc
            raise
        self.position += 1
        evidence = output.metadata.get(EVIDENCE_KEY)
        if evidence is None:
            raise ModelError("Stage 0 returned no voicechat evidence (vc_step): the thinker is not ours")
        try:
            result = decode_step(evidence, audio, inference_ms)
        except EnvelopeError as exc:
            raise ModelError(str(exc)) from exc
        # What reached the session from each stage, in a form two runs can compare position by position: the
        # Stage-0 token and a digest of the Stage-2 packet (with the batch this position ran in, when batched).
        telemetry = {**result.telemetry, "stage0_token": output.token_ids[-1] if output.token_ids else None,
                     "stage2_crc32": zlib.crc32(audio)}
        if stamp is not None:
            telemetry.update(tick=stamp.tick, tick_size=stamp.size, held_ms=round(stamp.held_ms, 3))
            timings = replace(result.timings, held_ms=stamp.held_ms, late_ms=stamp.late_ms, batched_with=stamp.size)
            result = replace(result, timings=timings)
        result = replace(result, telemetry=telemetry)
        return replace(result, boundary=self.retimer.retime(result.boundary)) if self.audio_lag else result

    def abort(self) -> None:
        handle, self.handle = self.handle, None
        self.channel = None
        if handle is None:
            return
        if self.batcher is not None:
            self.batcher.leave(handle.session_id)
        self.bus.close(handle.session_id)
        try:
            self._control(lambda timeout: handle.close(reason="voicechat_session_end", timeout=timeout))
        except Exception as exc:
            raise ModelError(f"closing the vLLM-Omni session failed: {exc}") from exc
