"""The Stage-0 bus: per-session channels between our port (executor thread) and our plugin's hooks (orchestrator
thread) (docs/omni-integration.md D3, D4).

The port pushes each position's ``vc`` controls and then waits; ``plan_append`` pops them into the append
envelope; ``decide_output`` puts the Stage-0 tokens and evidence; the data plane feeds Stage-2 audio into the
channel's aligner. Stdlib + our aligner only; request ownership is decided by an injected predicate (vLLM-Omni's
``duplex_resource_request_belongs_to_session``), so a new epoch's request id still finds its session.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import VoicechatError
from .alignment import AudioAligner


@dataclass(frozen=True, slots=True)
class Stage0Output:
    request_id: str
    token_ids: tuple[int, ...]
    metadata: dict[str, Any] = field(default_factory=dict)


class ChannelFailure(VoicechatError, RuntimeError):
    """The engine reported a failure for this session, or the wait timed out."""


class ChannelTimeout(ChannelFailure):
    """Nothing arrived within the wait's bound: the engine did not answer (a stalled stage), not a failure it
    reported."""


class Channel:
    def __init__(self, session_id: str, *, audio_lag: int = 0) -> None:
        self.session_id = session_id
        self._cond = threading.Condition()
        self._controls: deque[dict] = deque()
        self._stage0: deque[Stage0Output] = deque()
        self.aligner = AudioAligner(audio_lag)
        self._failure: str | None = None

    # --- port side (executor thread) ---

    def push_controls(self, vc: dict) -> None:
        with self._cond:
            self._controls.append(vc)

    def wait_stage0(self, timeout_s: float) -> Stage0Output:
        return self._wait(lambda: self._stage0.popleft() if self._stage0 else None, timeout_s, "Stage-0 output")

    def wait_packet(self, timeout_s: float) -> bytes:
        return self._wait(self.aligner.take, timeout_s, "Stage-2 audio")

    def _wait(self, take: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._failure is not None:
                    raise ChannelFailure(self._failure)
                item = take()
                if item is not None:
                    return item
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout(f"no {what} within {timeout_s:g} s")
                self._cond.wait(left)

    # --- plugin side (orchestrator thread) ---

    def pop_controls(self) -> dict | None:
        with self._cond:
            return self._controls.popleft() if self._controls else None

    def put_stage0(self, output: Stage0Output) -> None:
        with self._cond:
            self._stage0.append(output)
            self._cond.notify_all()

    def put_audio(self, samples: np.ndarray) -> None:
        with self._cond:
            self.aligner.feed(samples)
            self._cond.notify_all()

    def fail(self, message: str) -> None:
        with self._cond:
            self._failure = self._failure or message
            self._cond.notify_all()

    def restart(self) -> None:
        """A new Stage-0 request (reset): nothing of the old one is waited for."""
        with self._cond:
            self._controls.clear()
            self._stage0.clear()
            self.aligner.start()


class Stage0Bus:
    def __init__(self, belongs: Callable[[str, str], bool]) -> None:
        self._belongs = belongs
        self._lock = threading.Lock()
        self._channels: dict[str, Channel] = {}

    def open(self, session_id: str, *, audio_lag: int = 0) -> Channel:
        with self._lock:
            channel = self._channels[session_id] = Channel(session_id, audio_lag=audio_lag)
            return channel

    def close(self, session_id: str) -> None:
        with self._lock:
            channel = self._channels.pop(session_id, None)
        if channel is not None:
            channel.fail("session closed")

    def for_request(self, request_id: str | None) -> Channel | None:
        if not request_id:
            return None
        with self._lock:
            channels = list(self._channels.values())
        return next((c for c in channels if self._belongs(request_id, c.session_id)), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._channels)
