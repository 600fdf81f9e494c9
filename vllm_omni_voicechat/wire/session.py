"""What both dialects' protocol objects share: the session core they drive, the completions forwarded to it, the tally
and what a refused frame keeps.

A dialect subclass parses client frames (``receive``), polls (``poll``), greets (``start``) and answers a refused frame
(``refuse``), and says how the core's outputs become its wire outputs (``_project``). Everything the host hands back
(a position's result, a prefill, a synthesis) goes to the core here and comes out through ``_settle``: the projection,
plus what the dialect does once the core has moved (v3 hands on the frames it held behind a barrier).
"""

from __future__ import annotations

from typing import Any

from ..model.port import StepResult
from ..ops.tally import SessionTally
from ..runner.stage0 import Position
from ..session import events as ev
from ..session.core import SessionCore
from .transport import refused_event_id


class WireSession:
    """The shared half of a wire session's driving interface (``shell/driving.py``'s ``WireDriven``)."""

    resumable = False
    """Whether the session outlives its socket (the tiered full lane's does)."""
    held_messages = 0
    """Client frames received but held behind an unfinished barrier (v3's receive pump holds some)."""

    def __init__(self, core: SessionCore, tally: SessionTally | None) -> None:
        self.core = core
        self.tally = tally
        """Counts what the session does (``ops/tally.py``), fed every core output with its ``now``."""
        self.session_id = core.session_id

    @property
    def closed(self) -> bool:
        return self.core.closed

    # ================================================================ the dialect's part

    def _project(self, outputs: list[ev.Output], now: float) -> list[Any]:
        """The core's outputs as this dialect's wire outputs (texts, effects, the close)."""
        raise NotImplementedError

    def _settle(self, outputs: list[ev.Output], now: float) -> list[Any]:
        """The wire outputs of a completion the core has applied."""
        return self._project(outputs, now)

    # ================================================================ completions, forwarded to the core

    def complete(self, position: Position, result: StepResult, now: float) -> list[Any]:
        return self._settle(self.core.complete(position, result, now), now)

    def fail(self, position: Position, error: BaseException, now: float) -> list[Any]:
        return self._settle(self.core.fail(position, error, now), now)

    def prefilled(self, now: float) -> list[Any]:
        return self._settle(self.core.prefilled(now), now)

    def prefill_failed(self, error: BaseException, now: float) -> list[Any]:
        return self._settle(self.core.prefill_failed(error, now), now)

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[Any]:
        return self._settle(self.core.synthesis_done(job_id, pcm16, now), now)

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[Any]:
        return self._settle(self.core.synthesis_failed(job_id, error, now), now)

    def poisoned(self, failure: str, now: float) -> list[Any]:
        """The previous session's model cleanup failed: this session fails before it starts."""
        return self._settle(self.core.abort_session("model_cleanup_failed", failure, now), now)

    def disconnect(self, now: float) -> list[Any]:
        """The transport went away for good: effects only (nothing is published)."""
        return self.core.disconnect(now)  # type: ignore[return-value]

    def refusal_id(self, message: str | bytes) -> Any:
        """What the host keeps of a frame its full inbox refused: the event id the refusal echoes."""
        return refused_event_id(message)
