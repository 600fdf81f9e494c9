"""The input turn's lifecycle, every legal move in one table (in the manner of h11's ``_state.py``).

One input turn at a time: the user's speech (a client turn or a model-owned one), a typed job's injected speech, or
the empty turn of a speak-first request. ``LISTENING``: no turn is open and none ended with an end of utterance
(none yet, a listen decision, a clear). ``OPEN``: a turn is open. ``SETTLING``: a procedure is ending it (a cancel
tail, settlement to the blank fence); a clear can no longer drop it. ``ENDING``: it is closed (speech stopped,
transcript completed) and its separate EOU position is next. ``HELD``: it is closed and settled and its EOU waits for
a response request. ``ANSWERED``: its EOU fired (the model's own, a client turn's, a typed job's, a held one asked
for). ``COMMITTED``: its EOU fired because the client's commit forced it (a second commit of nothing is then the
client's mistake, not a redundant one).

A held EOU outlives a turn opened after it: the committed turn is what the next response request answers. That
answer runs beside the new turn, which stays open (``RESPOND`` and ``EOU`` keep ``OPEN``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import StateError
from .events import Source


class TurnState(enum.Enum):
    LISTENING = "listening"
    OPEN = "open"
    SETTLING = "settling"
    ENDING = "ending"
    HELD = "held"
    ANSWERED = "answered"
    COMMITTED = "committed"


class TurnMove(enum.Enum):
    OPEN = "open"
    """A turn opens: speech onset, ``turn_start``, a typed job's first frame, a speak-first request."""
    SETTLE = "settle"
    """A procedure starts ending the open turn."""
    CLEAR = "clear"
    """The client drops the open turn before it settles (``input_audio_buffer.clear``)."""
    LISTEN = "listen"
    """A listen decision: the turn (if one is open) held no words the model heard."""
    CLOSE = "close"
    """The settled turn closes; its EOU is separate (tools) or held."""
    SUPERSEDE = "supersede"
    """A typed job's turn replaces an open microphone turn (model-owned turns: the user spoke, then typed): it
    closes without an EOU of its own; the typed turn's EOU answers."""
    HOLD = "hold"
    """The closed turn's EOU waits for a response request."""
    RESPOND = "respond"
    """A response request takes the held EOU."""
    EOU = "eou"
    """The EOU fired."""
    FORCED_EOU = "forced_eou"
    """The EOU fired on the client's commit."""
    ABANDON = "abandon"
    """The session ended with whatever turn was open."""


_S = TurnState
_M = TurnMove

# Written out whole: ABANDON (the session ended) is legal everywhere and leads to LISTENING.
_TABLE: dict[TurnState, dict[TurnMove, TurnState]] = {
    _S.LISTENING: {_M.OPEN: _S.OPEN, _M.LISTEN: _S.LISTENING, _M.RESPOND: _S.ENDING, _M.ABANDON: _S.LISTENING},
    # A commit of nothing after the model's own EOU is benign, never a listen decision: no LISTEN.
    _S.ANSWERED: {_M.OPEN: _S.OPEN, _M.RESPOND: _S.ENDING, _M.ABANDON: _S.LISTENING},
    _S.COMMITTED: {_M.OPEN: _S.OPEN, _M.LISTEN: _S.LISTENING, _M.RESPOND: _S.ENDING, _M.ABANDON: _S.LISTENING},
    # A listen decision about audio committed after a held EOU leaves the hold standing.
    _S.HELD: {_M.OPEN: _S.OPEN, _M.LISTEN: _S.HELD, _M.RESPOND: _S.ENDING, _M.ABANDON: _S.LISTENING},
    _S.OPEN: {_M.SETTLE: _S.SETTLING, _M.CLEAR: _S.LISTENING, _M.LISTEN: _S.LISTENING, _M.SUPERSEDE: _S.LISTENING,
              _M.RESPOND: _S.OPEN, _M.EOU: _S.OPEN, _M.ABANDON: _S.LISTENING},
    _S.SETTLING: {_M.LISTEN: _S.LISTENING, _M.CLOSE: _S.ENDING, _M.ABANDON: _S.LISTENING},
    _S.ENDING: {_M.HOLD: _S.HELD, _M.EOU: _S.ANSWERED, _M.FORCED_EOU: _S.COMMITTED, _M.ABANDON: _S.LISTENING},
}

_LEAVING = frozenset({TurnMove.CLOSE, TurnMove.CLEAR, TurnMove.LISTEN, TurnMove.SUPERSEDE, TurnMove.ABANDON})


def next_turn_state(state: TurnState, move: TurnMove) -> TurnState:
    """The state after ``move``; :class:`~vllm_omni_voicechat.errors.StateError` when it is illegal."""
    try:
        return _TABLE[state][move]
    except KeyError:
        raise StateError(f"turn move {move.value} is illegal in state {state.value}") from None


@dataclass(slots=True)
class InputTurn:
    turn_id: str
    source: Source
    job_id: str | None
    transcript: str = ""
    quiet: int = 0
    """Consecutive quiet microphone frames (model-owned policy: ends a turn that never produced words)."""


class TurnLifecycle:
    """The one owner of the input turn: the open turn, the held one, and the state the table keeps."""

    __slots__ = ("state", "turn", "held")

    def __init__(self) -> None:
        self.state = TurnState.LISTENING
        self.turn: InputTurn | None = None
        """The open turn (``OPEN`` / ``SETTLING``)."""
        self.held: InputTurn | None = None
        """The committed turn whose EOU waits for a response request."""

    def _move(self, move: TurnMove) -> None:
        self.state = next_turn_state(self.state, move)

    def open(self, turn: InputTurn) -> None:
        self._move(TurnMove.OPEN)
        self.turn = turn

    def settle(self) -> None:
        self._move(TurnMove.SETTLE)

    def close(self, move: TurnMove) -> InputTurn | None:
        """``CLOSE`` / ``CLEAR`` / ``LISTEN`` / ``SUPERSEDE`` / ``ABANDON``: the open turn leaves (None when none was
        open)."""
        if move not in _LEAVING:
            raise StateError(f"turn move {move.value} does not end a turn")
        self._move(move)
        turn, self.turn = self.turn, None
        return turn

    def hold(self, turn: InputTurn) -> None:
        self._move(TurnMove.HOLD)
        self.held = turn

    def respond(self) -> InputTurn | None:
        """The held turn, taken for its EOU (None, and no move, when nothing is held)."""
        turn = self.held
        if turn is not None:
            self._move(TurnMove.RESPOND)
            self.held = None
        return turn

    def answered(self, *, forced: bool = False) -> None:
        """The EOU fired (``FORCED_EOU``: on the client's commit)."""
        self._move(TurnMove.FORCED_EOU if forced else TurnMove.EOU)

    @property
    def settling(self) -> bool:
        return self.state is TurnState.SETTLING
