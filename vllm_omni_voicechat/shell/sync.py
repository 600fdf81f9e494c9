"""The one synchronous host: drives any session object (the driving interface of ``driving.py``) against a model
on a virtual clock, for tests, the fuzzer, examples and benchmarks.

Deterministic and fast: positions run back to back and paced positions advance the virtual clock to their
deadline instead of waiting. Effects run inline, or, with ``defer_effects``, wait in :attr:`SyncDriver.pending`
until :meth:`SyncDriver.complete_pending` (a slow prefill or synthesis, as the asyncio host sees them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model.port import ModelPort
from ..session.events import AbortModel, CancelSynthesis, Effect, Prefill, StartSynthesis
from ..synth.port import Synthesizer
from .clock import VirtualClock
from .driving import Driven, Outputs


class SyncDriver:
    def __init__(
        self,
        session: Driven,
        model: ModelPort,
        *,
        synthesizer: Synthesizer | None = None,
        clock: VirtualClock | None = None,
        step_seconds: float = 0.0,
        on_event: Callable[[Any], None] | None = None,
        defer_effects: bool = False,
        keep: bool = True,
    ) -> None:
        self.session = session
        self.model = model
        self.synthesizer = synthesizer
        self.clock = clock or VirtualClock()
        self.step_seconds = step_seconds
        self.events: list[Any] = []
        """Everything that is not an effect, in order (native events, wire texts, transport instructions)."""
        self.effects: list[Effect] = []
        self.pending: list[Prefill | StartSynthesis] = []
        """With ``defer_effects``: prefills and syntheses not completed yet, oldest first."""
        self._on_event = on_event
        self._defer = defer_effects
        self._keep = keep
        self.positions = 0
        self.went_idle = True
        """Whether the last :meth:`run` stopped because nothing was left (False: a budget ran out)."""

    @property
    def core(self) -> Driven:
        """The driven session object (the historic name)."""
        return self.session

    def send(self, message: Any) -> list[Any]:
        """Deliver one client input; returns the events it produced at once (kept ones)."""
        start = len(self.events)
        self.dispatch(self.session.receive(message, self.clock.now))
        return self.events[start:] if self._keep else []

    def run(
        self,
        *,
        max_positions: int = 100_000,
        advance_time: bool = True,
        max_wakeups: int | None = None,
        stop_when: Callable[[], bool] | None = None,
    ) -> list[Any]:
        """Run positions until the session is idle; returns the events of the run.

        ``advance_time``: jump the clock to each wake-up time (paced positions, deadlines). ``stop_when``: checked
        when only a wake-up is left; true means that deadline is not work to wait for (an idle lease). Deferred
        effects complete one at a time whenever no position is due. :attr:`went_idle` is False when
        ``max_positions`` or ``max_wakeups`` ran out first.
        """
        start = len(self.events)
        session, clock, step_seconds = self.session, self.clock, self.step_seconds
        budget = max_positions
        wakeups = max_wakeups
        self.went_idle = True
        while not session.closed:
            if budget <= 0:
                self.went_idle = False
                break
            tick = session.poll(clock.now)
            self.dispatch(tick.outputs)
            position = tick.position  # a position begun means the session is open
            if position is not None:
                budget -= 1
                self.positions += 1
                try:
                    result = self.model.step(position.input)
                except Exception as exc:  # the model edge: any failure is the session's internal error
                    if step_seconds:
                        clock.advance(step_seconds)
                    self.dispatch(session.fail(position, exc, clock.now))
                    continue
                if step_seconds:
                    clock.advance(step_seconds)
                self.dispatch(session.complete(position, result, clock.now))
                continue
            if session.closed:
                break
            if self.pending and self.complete_pending():
                continue
            if tick.wake_at is None or not advance_time or (stop_when is not None and stop_when()):
                break
            if wakeups is not None:
                wakeups -= 1
                if wakeups <= 0:
                    self.went_idle = False
                    break
            clock.advance_to(tick.wake_at)
        return self.events[start:] if self._keep else []

    def dispatch(self, outputs: Outputs) -> None:
        if not outputs:
            return
        keep, on_event = self._keep, self._on_event
        for output in outputs:
            if not isinstance(output, Effect):
                if keep:
                    self.events.append(output)
                if on_event is not None:
                    on_event(output)
                continue
            if self._keep:
                self.effects.append(output)
            match output:
                case Prefill() | StartSynthesis():
                    if self._defer:
                        self.pending.append(output)
                    else:
                        self._execute(output)
                case AbortModel():
                    self.model.abort()
                case CancelSynthesis(job_id=job_id):
                    # a finished synthesis for a cancelled job is ignored by the session anyway
                    self.pending = [p for p in self.pending
                                    if not (isinstance(p, StartSynthesis) and p.job_id == job_id)]

    def complete_pending(self, *, every: bool = False) -> bool:
        """Complete the oldest deferred effect (or ``every`` one); False when none was pending."""
        if not self.pending:
            return False
        while self.pending:
            self._execute(self.pending.pop(0))
            if not every:
                break
        return True

    def _execute(self, effect: Prefill | StartSynthesis) -> None:
        session, now = self.session, self.clock.now
        if isinstance(effect, Prefill):
            try:
                self.model.prefill(effect.prompt)
            except Exception as exc:  # the model edge
                self.dispatch(session.prefill_failed(exc, now))
            else:
                self.dispatch(session.prefilled(now))
            return
        if self.synthesizer is None:
            self.dispatch(session.synthesis_failed(effect.job_id, RuntimeError("no synthesizer"), now))
            return
        try:
            pcm = self.synthesizer.synthesize(effect.text)
        except Exception as exc:  # the synthesizer edge
            self.dispatch(session.synthesis_failed(effect.job_id, exc, now))
        else:
            self.dispatch(session.synthesis_done(effect.job_id, pcm, now))
