"""A synchronous driver: runs a session core against a model on a virtual clock, effects inline.

Deterministic and fast: positions run back to back and paced positions advance the virtual clock to their
deadline instead of waiting. Used by tests, the scripted example and the overhead benchmark.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.port import ModelPort
from ..session.commands import Command
from ..session.core import SessionCore
from ..session.events import (
    AbortModel,
    CancelSynthesis,
    NativeEvent,
    Output,
    Prefill,
    StartSynthesis,
)
from ..synth.port import Synthesizer
from .clock import VirtualClock


class SyncDriver:
    def __init__(
        self,
        core: SessionCore,
        model: ModelPort,
        *,
        synthesizer: Synthesizer | None = None,
        clock: VirtualClock | None = None,
        step_seconds: float = 0.0,
        on_event: Callable[[NativeEvent], None] | None = None,
    ) -> None:
        self.core = core
        self.model = model
        self.synthesizer = synthesizer
        self.clock = clock or VirtualClock()
        self.step_seconds = step_seconds
        self.events: list[NativeEvent] = []
        self.effects: list[Output] = []
        self._on_event = on_event
        self.positions = 0

    def send(self, command: Command) -> list[NativeEvent]:
        """Deliver one client command; returns the events it produced at once."""
        start = len(self.events)
        self.dispatch(self.core.receive(command, self.clock.now))
        return self.events[start:]

    def run(self, *, max_positions: int = 100_000, advance_time: bool = True) -> list[NativeEvent]:
        """Run positions until the session is idle (or only waits for a later deadline when not advancing)."""
        start = len(self.events)
        budget = max_positions
        while budget > 0:
            tick = self.core.poll(self.clock.now)
            self.dispatch(tick.outputs)
            if tick.position is not None:
                budget -= 1
                self.positions += 1
                try:
                    result = self.model.step(tick.position.input)
                except Exception as exc:  # the model edge: any failure is the session's internal error
                    self.clock.advance(self.step_seconds)
                    self.dispatch(self.core.fail(tick.position, exc, self.clock.now))
                    continue
                self.clock.advance(self.step_seconds)
                self.dispatch(self.core.complete(tick.position, result, self.clock.now))
                continue
            if tick.wake_at is not None and advance_time:
                self.clock.advance_to(tick.wake_at)
                continue
            break
        return self.events[start:]

    def dispatch(self, outputs: list[Output]) -> None:
        for output in outputs:
            if isinstance(output, NativeEvent):
                self.events.append(output)
                if self._on_event is not None:
                    self._on_event(output)
                continue
            self.effects.append(output)
            match output:
                case Prefill(prompt=prompt):
                    try:
                        self.model.prefill(prompt)
                    except Exception as exc:
                        self.dispatch(self.core.prefill_failed(exc, self.clock.now))
                    else:
                        self.dispatch(self.core.prefilled(self.clock.now))
                case StartSynthesis(job_id=job_id, text=text):
                    if self.synthesizer is None:
                        self.dispatch(self.core.synthesis_failed(job_id, RuntimeError("no synthesizer"), self.clock.now))
                        continue
                    try:
                        pcm = self.synthesizer.synthesize(text)
                    except Exception as exc:
                        self.dispatch(self.core.synthesis_failed(job_id, exc, self.clock.now))
                    else:
                        self.dispatch(self.core.synthesis_done(job_id, pcm, self.clock.now))
                case AbortModel():
                    self.model.abort()
                case CancelSynthesis():
                    pass
