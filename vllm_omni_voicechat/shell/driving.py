"""The one driving interface every session object offers to a host: ``SessionCore`` (native events),
``V3Session`` and ``TieredSession`` (wire events as JSON texts).

Every input carries an injected ``now``. Every output list is ordered and holds two kinds of things a host keeps
apart: effects (:class:`~vllm_omni_voicechat.session.events.Effect`: run a prefill, start or cancel a synthesis,
abort the model), which the host executes and answers through the completion methods, and everything else (native
events, :class:`~vllm_omni_voicechat.wire.transport.WireText` texts, :class:`CloseTransport`), which it hands on in
order. ``poll`` returns a :class:`~vllm_omni_voicechat.session.core.Tick`: outputs, maybe a position for the model,
maybe a wake-up time.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..model.port import StepResult
from ..ops.tally import SessionTally
from ..runner.stage0 import Position
from ..session.core import Tick
from ..session.events import Effect

Outputs = list[Any]


def is_effect(output: Any) -> bool:
    return isinstance(output, Effect)


@runtime_checkable
class Driven(Protocol):
    """What a host (``shell.sync.SyncDriver``, ``shell.aio.SessionShell``) drives."""

    session_id: str
    tally: SessionTally | None
    """What the session counts (a wire session's; None for a bare core): the host adds the messages it read late."""

    @property
    def held_messages(self) -> int:
        """Client frames received but held behind an unfinished barrier: still in the host's receive pump."""
        ...

    @property
    def closed(self) -> bool: ...

    def receive(self, message: Any, now: float, arrived: float | None = None) -> Outputs:
        """A client input: a command for a bare core, a raw frame (text or bytes) for a wire session. ``arrived``:
        when the host read it, if earlier than ``now`` (it waited for the position in flight): the audio in it is late
        from then."""
        ...

    def poll(self, now: float) -> Tick: ...

    def complete(self, position: Position, result: StepResult, now: float) -> Outputs: ...

    def fail(self, position: Position, error: BaseException, now: float) -> Outputs: ...

    def prefilled(self, now: float) -> Outputs: ...

    def prefill_failed(self, error: BaseException, now: float) -> Outputs: ...

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> Outputs: ...

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> Outputs: ...

    def disconnect(self, now: float) -> Outputs:
        """The transport went away for good: effects only (nothing is published)."""
        ...


@runtime_checkable
class WireDriven(Driven, Protocol):
    """A wire session adds its greeting, the poisoned start and the answer to a refused client frame."""

    def start(self, now: float) -> Outputs: ...

    def poisoned(self, failure: str, now: float) -> Outputs: ...

    def refusal_id(self, message: str | bytes) -> Any:
        """What the host keeps of a frame its full inbox refused: the client event id the refusal echoes."""
        ...

    def refuse(self, event_id: Any, now: float) -> Outputs:
        """The host's inbox was full: the recoverable error that answers the refused frame."""
        ...


class Refusals(Protocol):
    """How a host answers client frames its full inbox refused (a wire session; a bare core has no wire)."""

    def refusal_id(self, message: str | bytes) -> Any: ...

    def refuse(self, event_id: Any, now: float) -> Outputs: ...
