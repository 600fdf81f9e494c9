"""The playback ledger (docs/tiered-dialect.md §5): ack/truncate arithmetic, commit policies, prefix marks."""

from __future__ import annotations

import gc
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.wire.tiered.ledger import AudioTextMark, PlaybackLedger

SENT = 1000


def ledger(policy: str = "commit_all_on_done", sent: int = SENT) -> PlaybackLedger:
    led = PlaybackLedger("resp_1", policy=policy)  # type: ignore[arg-type]
    led.generated(sent)
    led.sent(sent // 2, 5)
    led.sent(sent - sent // 2, 11)
    return led


def state(led: PlaybackLedger) -> tuple[int, int, int | None]:
    return led.played_ms, led.committed_ms, led.hard_cap


def test_fresh_ledger():
    led = PlaybackLedger("resp_x")
    assert led.policy == "commit_all_on_done"
    assert led.snapshot() == {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}
    assert led.hard_cap is None and led.done is False and led.marks == []
    assert led.unplayed is False
    led.ack(500)  # nothing sent yet: everything clamps to 0
    assert state(led) == (0, 0, None)


# --- the §5 arithmetic table --------------------------------------------------------------------------------

NAN = float("nan")


@pytest.mark.parametrize(
    ("played", "committed", "expect"),
    [
        (300, None, (300, 300)),  # committed defaults to played
        (0, None, (0, 0)),  # 0 is valid
        (-50, None, (0, 0)),  # negative clamps to 0
        (SENT + 4000, None, (SENT, SENT)),  # overshoot clamps to sent
        (SENT, None, (SENT, SENT)),
        (250.9, None, (250, 250)),  # int()
        (-0.5, None, (0, 0)),
        (NAN, None, (0, 0)),
        (True, None, (0, 0)),  # bools are not numbers here
        (False, None, (0, 0)),
        ("500", None, (0, 0)),
        (None, None, (0, 0)),
        ([500], None, (0, 0)),
        (300, 100, (300, 100)),  # committed may trail played
        (300, 5000, (300, SENT)),  # committed overshoot clamps to sent
        (300, -1, (300, 0)),
        (300, NAN, (300, 0)),
        (300, True, (300, 0)),
        (300, "200", (300, 0)),
        (100, 700, (100, 700)),  # committed may lead played (still <= sent)
    ],
)
def test_ack_arithmetic(played, committed, expect):
    led = ledger()
    led.ack(played, committed)
    assert (led.played_ms, led.committed_ms) == expect
    assert led.hard_cap is None


def test_played_is_monotone_and_committed_monotone_without_truncate():
    led = ledger()
    led.ack(600)
    led.ack(200)
    assert state(led) == (600, 600, None)
    led.ack(700, committed_ms=100)
    assert state(led) == (700, 600, None)
    led.ack(-10, committed_ms=-10)
    assert state(led) == (700, 600, None)
    led.ack(5000)
    assert state(led) == (SENT, SENT, None)


def test_truncate_may_go_backwards_and_sets_a_hard_cap():
    led = ledger()
    led.ack(800)
    assert led.truncate(300) == 300
    assert state(led) == (800, 300, 300)  # played stays monotone
    led.ack(900)
    assert state(led) == (900, 300, 300)  # later acks respect the cap
    led.ack(900, committed_ms=950)
    assert led.committed_ms == 300
    led.sent(500, 20)  # more audio after the cut
    led.ack(led.sent_ms)
    assert (led.played_ms, led.committed_ms) == (1500, 300)
    led.finish(completed=True)  # commit_all_on_done respects the cap
    assert led.committed_ms == 300 and led.done


@pytest.mark.parametrize(("end", "applied"), [(0, 0), (-5, 0), (SENT + 1, SENT), (10**12, SENT), (NAN, 0),
                                               (True, 0), ("300", 0), (None, 0), (412.7, 412)])
def test_truncate_clamps_never_rejects(end, applied):
    led = ledger()
    led.ack(500)
    assert led.truncate(end) == applied
    assert state(led) == (500, applied, applied)


def test_truncate_can_move_committed_up_from_below():
    led = ledger()
    led.ack(100)
    assert led.truncate(400) == 400
    assert state(led) == (100, 400, 400)


def test_a_lower_second_truncation_lowers_the_cap():
    led = ledger()
    led.truncate(600)
    led.truncate(200)
    assert state(led) == (0, 200, 200)
    led.ack(900)
    assert led.committed_ms == 200


def test_truncating_ack():
    led = ledger()
    led.ack(700, committed_ms=200, truncate=True)
    assert state(led) == (700, 200, 200)
    led.ack(100, truncate=True)  # committed defaults to played
    assert state(led) == (700, 100, 100)


def test_a_higher_second_truncation_does_not_extend_history_past_the_cap():
    led = ledger()
    led.truncate(300)
    led.truncate(600)
    assert led.hard_cap == 300
    assert led.committed_ms <= led.hard_cap


@pytest.mark.parametrize(
    ("value", "applied"), [(math.inf, SENT), (-math.inf, 0), (float("1e400"), SENT)], ids=["inf", "-inf", "1e400"]
)
def test_infinite_values_clamp(value, applied):
    led = ledger()
    assert led.clamp(value) == applied
    led.ack(value)
    assert led.played_ms == applied


# --- policies ----------------------------------------------------------------------------------------------


def test_commit_all_on_done_commits_everything_sent_at_completed_finish():
    led = ledger("commit_all_on_done")
    led.ack(200)
    assert led.unplayed
    led.finish(completed=True)
    assert led.done and led.committed_ms == SENT and led.played_ms == 200
    assert not led.unplayed
    # Later truncations still cut it.
    led.truncate(400)
    assert led.committed_ms == 400 and led.unplayed


def test_ack_only_commits_only_what_was_acked():
    led = ledger("ack_only")
    led.ack(200)
    led.finish(completed=True)
    assert led.done and led.committed_ms == 200 and led.unplayed
    led.ack(800)  # grows with acks after the end
    assert led.committed_ms == 800
    led.ack(SENT)
    assert not led.unplayed


def test_ack_only_with_no_ack_commits_nothing():
    led = ledger("ack_only")
    led.finish(completed=True)
    assert led.committed_ms == 0 and led.unplayed


@pytest.mark.parametrize("policy", ["commit_all_on_done", "ack_only"])
def test_cancelled_finish_commits_nothing_extra(policy):
    led = ledger(policy)
    led.ack(200)
    led.finish(completed=False)
    assert led.done and led.committed_ms == 200 and led.unplayed


@pytest.mark.parametrize("policy", ["commit_all_on_done", "ack_only"])
def test_completed_finish_respects_an_earlier_truncation(policy):
    led = ledger(policy)
    led.ack(700)
    led.truncate(250)
    led.finish(completed=True)
    assert led.committed_ms == 250


# --- marks, unplayed, snapshot -----------------------------------------------------------------------------


def test_text_chars_at_uses_the_last_mark_ending_by_t():
    led = PlaybackLedger("resp_1")
    led.sent(80, 3)
    led.sent(80, 7)
    led.sent(80, 12)
    assert led.marks == [AudioTextMark(3, 80), AudioTextMark(7, 160), AudioTextMark(12, 240)]
    expect = {0: 0, 79: 0, 80: 3, 81: 3, 159: 3, 160: 7, 239: 7, 240: 12, 10_000: 12, -1: 0}
    assert {t: led.text_chars_at(t) for t in expect} == expect
    led.sent(0, 14)  # a text-only delta at the same audio end: the last mark wins
    assert led.text_chars_at(240) == 14
    assert led.text_chars_at(239) == 7


def test_text_chars_at_on_an_empty_ledger():
    assert PlaybackLedger("r").text_chars_at(1000) == 0


def test_unplayed_and_snapshot():
    led = PlaybackLedger("resp_1")
    led.generated(100)
    led.generated(60)
    led.sent(150, 4)
    assert led.unplayed
    led.ack(150, committed_ms=90)
    assert led.snapshot() == {"generated_ms": 160, "sent_ms": 150, "played_ms": 150, "committed_ms": 90}
    assert led.unplayed
    led.ack(150)
    assert not led.unplayed
    snap = led.snapshot()
    snap["sent_ms"] = 0  # a copy
    assert led.sent_ms == 150


# --- properties --------------------------------------------------------------------------------------------

JUNK = st.one_of(
    st.integers(-2000, 6000),
    st.floats(allow_nan=True, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
SENT_OP = st.tuples(st.just("sent"), st.integers(0, 400), st.integers(0, 50))
GEN_OP = st.tuples(st.just("generated"), st.integers(0, 400))
ACK_OP = st.tuples(st.just("ack"), JUNK, st.one_of(st.none(), JUNK))
TRUNC_ACK_OP = st.tuples(st.just("ack_truncate"), JUNK, st.one_of(st.none(), JUNK))
TRUNC_OP = st.tuples(st.just("truncate"), JUNK)
FINISH_OP = st.tuples(st.just("finish"), st.booleans())
NON_TRUNCATING = st.one_of(SENT_OP, GEN_OP, ACK_OP, FINISH_OP)
ANY_OP = st.one_of(SENT_OP, GEN_OP, ACK_OP, TRUNC_ACK_OP, TRUNC_OP, FINISH_OP)


def clamp_model(value, sent: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0
    return min(max(int(value), 0), sent)


def run_and_check(policy: str, ops: list[tuple]) -> None:
    led = PlaybackLedger("resp_p", policy=policy)  # type: ignore[arg-type]
    for op in ops:
        kind = op[0]
        before = (led.played_ms, led.committed_ms, led.sent_ms)
        truncating = kind in ("truncate", "ack_truncate")
        if kind == "sent":
            led.sent(op[1], op[2])
            assert led.sent_ms == before[2] + op[1]
            assert led.marks[-1] == AudioTextMark(op[2], led.sent_ms)
        elif kind == "generated":
            led.generated(op[1])
        elif kind == "ack":
            led.ack(op[1], op[2])
            assert led.played_ms == max(before[0], clamp_model(op[1], led.sent_ms))
        elif kind == "ack_truncate":
            led.ack(op[1], op[2], truncate=True)
        elif kind == "truncate":
            applied = led.truncate(op[1])
            # the end history now holds: the clamped request, or an earlier, shorter truncation that still binds
            assert applied == led.committed_ms == min(clamp_model(op[1], led.sent_ms), led.hard_cap)
        else:
            led.finish(op[1])
            if op[1] and policy == "commit_all_on_done":
                cap = led.sent_ms if led.hard_cap is None else min(led.sent_ms, led.hard_cap)
                assert led.committed_ms == cap
            elif op[1] is False or policy == "ack_only":
                assert led.committed_ms == before[1]
        assert 0 <= led.committed_ms <= led.sent_ms
        assert 0 <= led.played_ms <= led.sent_ms
        assert led.played_ms >= before[0]
        if not truncating:
            assert led.committed_ms >= before[1]
        if led.hard_cap is not None:
            assert led.committed_ms <= led.hard_cap
        assert led.unplayed is (led.sent_ms > led.committed_ms)


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(["commit_all_on_done", "ack_only"]),
    before=st.lists(NON_TRUNCATING, max_size=12),
    cut=st.one_of(TRUNC_OP, TRUNC_ACK_OP),
    after=st.lists(NON_TRUNCATING, max_size=12),
    with_cut=st.booleans(),
)
def test_invariants_with_at_most_one_truncation(policy, before, cut, after, with_cut):
    run_and_check(policy, before + ([cut] if with_cut else []) + after)


@settings(max_examples=300, deadline=None)
@example(policy="commit_all_on_done", ops=[("sent", 400, 4), ("truncate", 100), ("truncate", 300)])
@given(policy=st.sampled_from(["commit_all_on_done", "ack_only"]), ops=st.lists(ANY_OP, max_size=25))
def test_invariants_with_any_truncations(policy, ops):
    run_and_check(policy, ops)


@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 50)), max_size=30), st.lists(st.integers(-5, 13_000)))
def test_text_chars_at_is_the_last_mark_ending_by_t(sends, probes):
    """The lookup (a bisection over the marks' ends) against the definition: scan the marks in order."""
    led = PlaybackLedger("resp_s")
    for ms, chars in sends:
        led.sent(ms, chars)
    ends = [m.audio_end_ms for m in led.marks]
    for t in probes + ends + [e - 1 for e in ends] + [e + 1 for e in ends]:
        chars = 0
        for mark in led.marks:
            if mark.audio_end_ms > t:
                break
            chars = mark.text_chars
        assert led.text_chars_at(t) == chars


def test_marks_are_no_objects_for_the_cycle_collector():
    """A session keeps its responses' ledgers: one tracked object per audio delta would lengthen every full
    collection of a busy server (the tiered over-budget steps)."""
    led = PlaybackLedger("resp_gc")
    gc.collect()
    before = len(gc.get_objects())
    for i in range(2000):
        led.sent(80, i)
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert led.text_chars_at(80 * 1000) == 999
