"""The input turn's lifecycle table (session/lifecycle.py): every (state, move) pair, the lifecycle's invariants
under any sequence of moves, and the session paths each move stands for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.errors import StateError
from vllm_omni_voicechat.session.commands import AppendAudio, ClearInput, CommitInput, RequestTypedInput, RespondNow
from vllm_omni_voicechat.session.lifecycle import InputTurn, TurnLifecycle, TurnMove, TurnState, next_turn_state

from .helpers import SILENCE_FRAME, T, names, protocol
from .test_session_model_turns import model_session

S, M = TurnState, TurnMove
_ENDED = {M.OPEN: S.OPEN, M.LISTEN: S.LISTENING, M.RESPOND: S.ENDING, M.ABANDON: S.LISTENING}

# The protocol's story, written out whole: a change to the table is a change to this test.
EXPECTED = {
    S.LISTENING: _ENDED,
    S.ANSWERED: {M.OPEN: S.OPEN, M.RESPOND: S.ENDING, M.ABANDON: S.LISTENING},
    S.COMMITTED: _ENDED,
    S.HELD: {**_ENDED, M.LISTEN: S.HELD},
    S.OPEN: {M.SETTLE: S.SETTLING, M.CLEAR: S.LISTENING, M.LISTEN: S.LISTENING, M.SUPERSEDE: S.LISTENING,
             M.RESPOND: S.OPEN, M.EOU: S.OPEN, M.ABANDON: S.LISTENING},
    S.SETTLING: {M.LISTEN: S.LISTENING, M.CLOSE: S.ENDING, M.ABANDON: S.LISTENING},
    S.ENDING: {M.HOLD: S.HELD, M.EOU: S.ANSWERED, M.FORCED_EOU: S.COMMITTED, M.ABANDON: S.LISTENING},
}


@pytest.mark.parametrize("state", list(TurnState))
@pytest.mark.parametrize("move", list(TurnMove))
def test_every_pair_is_in_the_table_or_the_one_state_error(state, move):
    expected = EXPECTED[state].get(move)
    if expected is None:
        with pytest.raises(StateError, match=f"turn move {move.value} is illegal in state {state.value}"):
            next_turn_state(state, move)
    else:
        assert next_turn_state(state, move) is expected


def _turn(n: int) -> InputTurn:
    return InputTurn(f"turn_{n}", "microphone", None)


_LEAVING = (M.CLOSE, M.CLEAR, M.LISTEN, M.SUPERSEDE, M.ABANDON)
_OPS = st.sampled_from(["open", "settle", "hold", "respond", "eou", "forced_eou", *(m.value for m in _LEAVING)])


@settings(max_examples=300, deadline=None)
@given(st.lists(_OPS, max_size=40))
def test_the_lifecycle_keeps_its_invariants_and_an_illegal_move_changes_nothing(ops):
    life = TurnLifecycle()
    for n, op in enumerate(ops):
        before = (life.state, life.turn, life.held)
        try:
            if op == "open":
                life.open(_turn(n))
            elif op == "settle":
                life.settle()
            elif op == "hold":
                life.hold(_turn(n))
            elif op == "respond":
                life.respond()
            elif op in ("eou", "forced_eou"):
                life.answered(forced=op == "forced_eou")
            else:
                life.close(TurnMove(op))
        except StateError:
            assert (life.state, life.turn, life.held) == before
            continue
        assert (life.turn is not None) == (life.state in (S.OPEN, S.SETTLING))
        assert life.settling == (life.state is S.SETTLING)
        if life.state is S.HELD:
            assert life.held is not None


def test_close_takes_only_a_move_that_ends_a_turn():
    life = TurnLifecycle()
    life.open(_turn(1))
    with pytest.raises(StateError, match="does not end a turn"):
        life.close(M.SETTLE)
    assert life.state is S.OPEN and life.turn is not None


# ================================================================ the session paths the moves stand for


def test_model_eou_then_a_commit_of_nothing_is_benign_but_after_a_forced_eou_it_is_a_listen_decision():
    d = model_session()
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 12))
    d.run()
    assert d.core.turn_state is S.ANSWERED
    d.events.clear()
    d.send(CommitInput("c1"))
    d.run()
    assert protocol(d.events) == []

    d.send(AppendAudio(render_speech("Hi") + SILENCE_FRAME * 3))
    d.run()
    assert d.core.turn_state is S.OPEN
    d.send(CommitInput("c2"))
    d.run()
    assert d.core.turn_state is S.COMMITTED
    d.events.clear()
    d.send(CommitInput("c3"))
    d.run()
    assert protocol(d.events) == [("ListenDecision", None, "silence_or_noise", "c3")]
    assert d.core.turn_state is S.LISTENING


def test_a_held_eou_survives_a_listen_decision_and_a_new_turn_and_answers_the_committed_turn():
    d = model_session()
    d.core.auto_eou = False
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 3))
    d.send(CommitInput("c1", respond=False))
    d.run()
    assert d.core.turn_state is S.HELD and "ResponseCreated" not in names(d.events)
    d.send(AppendAudio(SILENCE_FRAME * 3))
    d.send(CommitInput("c2", respond=False))
    d.run()
    assert d.core.turn_state is S.HELD  # the commit of silence was a listen decision; the hold stands
    d.send(AppendAudio(render_speech("More") + SILENCE_FRAME))
    d.run()
    assert d.core.turn_state is S.OPEN
    d.events.clear()
    d.send(RespondNow("r1"))
    d.run()
    created = [e for e in d.events if type(e).__name__ == "ResponseCreated"]
    assert [e.turn_id for e in created] == [T(1)]  # the committed turn is answered, beside the open one
    assert d.core.turn_state is S.OPEN and d.core.conversation.input_turn.turn_id == T(2)


def test_a_clear_drops_an_open_turn_but_not_one_that_is_settling():
    d = model_session()
    d.core.auto_eou = False
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 3))
    d.run()
    d.events.clear()
    d.send(ClearInput("x1"))
    d.run()
    assert protocol(d.events) == [("SpeechStopped", T(1), "microphone", None), ("InputCleared", T(1))]
    assert d.core.turn_state is S.LISTENING


def test_typing_while_a_model_owned_turn_is_open_closes_that_turn_before_the_typed_one_opens():
    """Found by the lifecycle table (the tiered fuzzer, seed 380): the typed job's turn replaced the open microphone
    turn without its speech_stopped or transcript."""
    d = model_session()
    d.core.auto_eou = False
    d.send(AppendAudio(render_speech("Hello") + SILENCE_FRAME * 3))
    d.run()
    assert d.core.turn_state is S.OPEN
    d.events.clear()
    d.send(RequestTypedInput("j1", "Hi"))
    d.run()
    seen = [p for p in protocol(d.events) if p[0] in ("SpeechStopped", "TranscriptCompleted", "TypedInjectionStarted",
                                                       "SpeechStarted")]
    assert seen[:4] == [
        ("SpeechStopped", T(1), "microphone", None),
        ("TranscriptCompleted", T(1), "Hello", "microphone", None),
        ("TypedInjectionStarted", "j1"),
        ("SpeechStarted", T(2), "typed", "j1", "j1"),
    ]
    assert d.core.turn_state is S.ANSWERED
