"""The resume journal and credential (docs/tiered-dialect.md §3.7, §6.2, §6.4): pure, fake clock only."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from vllm_omni_voicechat.wire.tiered.journal import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_S,
    InvalidAck,
    Journal,
    Replay,
    ReplayConflict,
    ResumeCredential,
    ResyncRequired,
)


def compact(event: dict, seq: int) -> str:
    return json.dumps({**event, "server_event_seq": seq}, separators=(",", ":"), ensure_ascii=False)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def ev(i: int, **extra) -> dict:
    return {"type": "response.output_audio.delta", "delta": f"chunk-{i}", **extra}


def filled(n: int, *, at: float = 0.0, **kwargs) -> tuple[Journal, list[str]]:
    journal = Journal(**kwargs)
    texts = [journal.record(ev(i), at).text for i in range(1, n + 1)]
    return journal, texts


def replay_seqs(result) -> list[int]:
    assert isinstance(result, Replay), result
    return [entry.seq for entry in result.entries]


# --- stamping and sizing ------------------------------------------------------------------------------------


def test_defaults_match_the_spec_bounds():
    assert DEFAULT_MAX_BYTES == 8 * 1024 * 1024
    assert DEFAULT_TTL_S == 60.0
    journal = Journal()
    assert (journal.max_bytes, journal.ttl_s) == (DEFAULT_MAX_BYTES, DEFAULT_TTL_S)
    assert (journal.head, journal.dropped_through, journal.retained_bytes, len(journal)) == (0, 0, 0, 0)
    assert journal.overflowed is False


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"max_bytes": -1}, {"ttl_s": 0}, {"ttl_s": -1.0}])
def test_non_positive_bounds_are_rejected(kwargs):
    with pytest.raises(ValueError):
        Journal(**kwargs)


def test_seq_stamps_1_2_3_in_compact_json():
    journal = Journal()
    for n in range(1, 6):
        event = {"type": "response.output_text.delta", "response_id": "resp_1", "delta": f"w{n} ", "n": [n, {"k": 1}]}
        recorded = journal.record(event, float(n))
        assert recorded.seq == n == journal.head
        assert recorded.overflow_notice is False
        assert recorded.text == compact(event, n)
        assert ": " not in recorded.text and ", " not in recorded.text
        assert json.loads(recorded.text) == {**event, "server_event_seq": n}
        assert "server_event_seq" not in event  # the caller's event is not stamped in place
    assert len(journal) == 5


def test_retained_events_are_no_objects_for_the_cycle_collector():
    """Thousands of events a session retain for a resume: as tracked objects they would lengthen every full
    collection of a busy server (the tiered over-budget steps)."""
    journal = Journal()
    event = {"type": "response.output_audio.delta", "response_id": "resp_1", "delta": "AAAA"}
    gc.collect()
    before = len(gc.get_objects())
    for n in range(2000):
        journal.record(event, n * 0.001)
    gc.collect()
    assert len(journal) == 2000
    assert len(gc.get_objects()) - before < 50
    assert [e.seq for e in journal.entries()[:3]] == [1, 2, 3]


def test_retained_events_are_a_few_buffers_not_objects_per_event():
    """A client that never acknowledges keeps thousands of small events retained: kept as a string (and a tuple, a
    float, ints) each, they spread over the allocator's arenas, which one long-lived object allocated among them keeps
    from the OS after the session has ended. The journal's live allocations stay few whatever it retains."""
    journal = Journal()
    event = {"type": "conversation.item.created", "item": {"id": "item_1", "content": [{"text": "é"}]}}
    tracemalloc.start()
    try:
        for n in range(10_000):
            journal.record(event, n * 0.001)
        blocks = sum(stat.count for stat in tracemalloc.take_snapshot().statistics("filename")
                     if stat.traceback[0].filename.endswith("journal.py"))
    finally:
        tracemalloc.stop()
    assert len(journal) == 10_000
    assert journal.retained_bytes == sum(utf8_len(compact(event, n)) for n in range(1, 10_001))
    assert blocks < 500, blocks  # as objects: 40,000 (the interpreter's free lists keep a few dozen freed dicts)


def test_acks_and_ageing_over_many_events_keep_every_replay_exact():
    """Thousands of events acknowledged and aged out in steps (the buffers drop their front in bulk): every replay
    is exactly the events after its cursor, byte for byte, with their times."""
    journal = Journal(ttl_s=60.0)
    texts = {journal.record(ev(i), i * 0.01).seq: journal.entries()[-1].text for i in range(1, 3_001)}
    assert list(texts) == list(range(1, 3_001))
    for ack in (1, 700, 701, 1_500, 2_047):
        journal.acknowledge(ack)
        result = journal.replay_after(ack, 30.0)
        assert replay_seqs(result) == list(range(ack + 1, 3_001))
        assert [e.text for e in result.entries] == [texts[s] for s in range(ack + 1, 3_001)]
        assert [e.at for e in result.entries] == [s * 0.01 for s in range(ack + 1, 3_001)]
        assert journal.retained_bytes == sum(utf8_len(texts[s]) for s in range(ack + 1, 3_001))
    journal.prune(75.0)  # what is older than 15 s was acknowledged already
    assert (journal.dropped_through, len(journal)) == (2_047, 953)
    journal.prune(85.0)  # older than 25 s: through seq 2499
    assert (journal.dropped_through, len(journal)) == (2_499, 501)
    assert replay_seqs(journal.replay_after(2_499, 85.0)) == list(range(2_500, 3_001))
    journal.prune(100.0)
    assert (len(journal), journal.retained_bytes, journal.dropped_through) == (0, 0, 3_000)
    assert journal.record(ev(3_001), 100.0).seq == 3_001
    assert replay_seqs(journal.replay_after(3_000, 100.0)) == [3_001]


def test_an_existing_seq_field_is_overwritten_by_the_stamp():
    journal = Journal()
    recorded = journal.record({"type": "x", "server_event_seq": 99}, 0.0)
    assert json.loads(recorded.text)["server_event_seq"] == 1


def test_byte_accounting_is_utf8_of_the_unescaped_text():
    journal = Journal()
    event = {"type": "response.output_audio_transcript.delta", "delta": "héllo → wörld 🙂 日本語"}
    recorded = journal.record(event, 0.0)
    assert "🙂" in recorded.text and "\\u" not in recorded.text  # ensure_ascii=False
    size = utf8_len(recorded.text)
    assert size > len(recorded.text)
    assert journal.retained_bytes == size
    (entry,) = replay_after_ok(journal, 0, 0.0)
    assert entry.size == size and entry.text == recorded.text


def replay_after_ok(journal: Journal, seq: int, now: float):
    result = journal.replay_after(seq, now)
    assert isinstance(result, Replay), result
    return result.entries


def test_the_byte_bound_counts_utf8_bytes_not_characters():
    event = {"type": "x", "delta": "ééééé🙂🙂🙂🙂"}
    text = compact(event, 1)
    assert utf8_len(text) > len(text)
    # A bound that the character count fits but the UTF-8 size does not: the event overflows.
    journal = Journal(max_bytes=utf8_len(text) - 1)
    assert journal.record(event, 0.0).overflow_notice is True
    # Exactly the UTF-8 size fits.
    journal = Journal(max_bytes=utf8_len(text))
    assert journal.record(event, 0.0).overflow_notice is False
    assert journal.retained_bytes == utf8_len(text)


# --- acknowledgement ---------------------------------------------------------------------------------------


def test_ack_trims_exactly_through_n():
    journal, texts = filled(5)
    journal.acknowledge(3)
    assert journal.dropped_through == 3
    assert len(journal) == 2
    assert journal.retained_bytes == utf8_len(texts[3]) + utf8_len(texts[4])
    assert replay_seqs(journal.replay_after(3, 0.0)) == [4, 5]


@pytest.mark.parametrize("lower", [0, 1, 2, 3])
def test_acks_at_or_below_dropped_through_are_no_ops(lower):
    journal, _ = filled(5)
    journal.acknowledge(3)
    before = (journal.dropped_through, len(journal), journal.retained_bytes, journal.head)
    journal.acknowledge(lower)
    assert (journal.dropped_through, len(journal), journal.retained_bytes, journal.head) == before


def test_ack_of_the_head_empties_the_journal_and_zero_is_valid_when_empty():
    journal = Journal()
    journal.acknowledge(0)
    assert journal.dropped_through == 0
    journal, _ = filled(4)
    journal.acknowledge(4)
    assert (len(journal), journal.retained_bytes, journal.dropped_through) == (0, 0, 4)
    assert replay_seqs(journal.replay_after(4, 0.0)) == []


@pytest.mark.parametrize("bad", [-1, -100, 6, 10**9, True, False, 1.0, 3.0, "3", None, [3], {"seq": 3}])
def test_invalid_acks_raise_invalid_event_ack_and_change_nothing(bad):
    journal, _ = filled(5)
    journal.acknowledge(2)
    before = (journal.dropped_through, len(journal), journal.retained_bytes, journal.head)
    with pytest.raises(InvalidAck) as info:
        journal.acknowledge(bad)
    assert info.value.code == "invalid_event_ack"
    assert isinstance(info.value, ValueError)
    assert (journal.dropped_through, len(journal), journal.retained_bytes, journal.head) == before


def test_ack_above_head_is_invalid_even_on_an_empty_journal():
    with pytest.raises(InvalidAck):
        Journal().acknowledge(1)


# --- TTL ---------------------------------------------------------------------------------------------------


def test_ttl_pruning_moves_dropped_through_and_causes_a_gap():
    journal = Journal(ttl_s=10.0)
    for at in (0.0, 5.0, 9.0):
        journal.record(ev(int(at)), at)
    journal.prune(10.0)  # exactly ttl old: still retained
    assert (len(journal), journal.dropped_through) == (3, 0)
    journal.prune(10.5)
    assert (len(journal), journal.dropped_through) == (2, 1)
    assert journal.replay_after(0, 10.5) == ResyncRequired("journal_gap")
    assert replay_seqs(journal.replay_after(1, 10.5)) == [2, 3]


def test_record_and_replay_prune_with_their_own_clock():
    journal = Journal(ttl_s=10.0)
    journal.record(ev(1), 0.0)
    journal.record(ev(2), 5.0)
    journal.record(ev(3), 16.0)  # prunes first: seq 1 is 16 s old and seq 2 is 11 s old
    assert journal.dropped_through == 2
    assert len(journal) == 1
    assert replay_seqs(journal.replay_after(2, 16.0)) == [3]
    # The replay's own prune drops seq 3: the same cursor is now a gap, and the head cursor replays nothing.
    assert journal.replay_after(2, 100.0) == ResyncRequired("journal_gap")
    assert journal.dropped_through == 3
    assert replay_seqs(journal.replay_after(3, 100.0)) == []
    assert journal.retained_bytes == 0


def test_ack_below_a_ttl_drop_is_a_no_op():
    journal = Journal(ttl_s=1.0)
    journal.record(ev(1), 0.0)
    journal.record(ev(2), 0.0)
    journal.prune(2.0)
    assert journal.dropped_through == 2
    journal.acknowledge(1)
    assert journal.dropped_through == 2


# --- replay ------------------------------------------------------------------------------------------------


def test_replay_returns_byte_identical_entries_in_order_after_the_cursor():
    journal = Journal()
    texts = [journal.record({"type": "t", "delta": f"δ{i}🙂"}, float(i)).text for i in range(1, 8)]
    for cursor in range(0, 8):
        entries = replay_after_ok(journal, cursor, 8.0)
        assert [e.seq for e in entries] == list(range(cursor + 1, 8))
        assert [e.text for e in entries] == texts[cursor:]
        assert all(e.size == utf8_len(e.text) for e in entries)
    # Replay does not consume: it may be repeated.
    assert [e.text for e in replay_after_ok(journal, 0, 8.0)] == texts


def test_replay_cursor_below_dropped_through_is_a_gap():
    journal, _ = filled(5)
    journal.acknowledge(3)
    assert journal.replay_after(2, 0.0) == ResyncRequired("journal_gap")
    assert journal.replay_after(0, 0.0) == ResyncRequired("journal_gap")
    assert replay_seqs(journal.replay_after(3, 0.0)) == [4, 5]


@pytest.mark.parametrize("beyond", [1, 2, 50])
def test_replay_cursor_beyond_head_is_a_conflict(beyond):
    journal, _ = filled(3)
    assert journal.replay_after(3 + beyond, 0.0) == ReplayConflict(head=3)
    assert Journal().replay_after(beyond, 0.0) == ReplayConflict(head=0)


def test_empty_journal_replays_nothing():
    assert replay_seqs(Journal().replay_after(0, 0.0)) == []


# --- overflow ----------------------------------------------------------------------------------------------


def test_overflow_is_sticky_with_exactly_one_notice_and_seqs_keep_increasing():
    size = utf8_len(compact(ev(1), 1))  # every ev(i) for i < 10 has the same size at seq < 10
    journal = Journal(max_bytes=3 * size)
    results = [journal.record(ev(i), 0.0) for i in range(1, 4)]
    assert not any(r.overflow_notice for r in results)
    assert journal.retained_bytes == 3 * size and not journal.overflowed

    results += [journal.record(ev(i), 0.0) for i in range(4, 30)]
    assert [r.seq for r in results] == list(range(1, 30))
    assert [r.seq for r in results if r.overflow_notice] == [4]
    assert all(json.loads(r.text)["server_event_seq"] == r.seq for r in results)
    assert journal.overflowed and journal.head == 29
    assert len(journal) == 3 and journal.retained_bytes == 3 * size  # later events are not retained

    for cursor in (0, 3, 10, 29):
        assert journal.replay_after(cursor, 0.0) == ResyncRequired("journal_overflow")
    # Acknowledging everything frees the bytes but the overflow stays.
    journal.acknowledge(29)
    assert (len(journal), journal.retained_bytes) == (0, 0)
    assert journal.replay_after(29, 0.0) == ResyncRequired("journal_overflow")
    assert journal.record(ev(1), 0.0).overflow_notice is False
    assert journal.replay_after(29, 0.0) == ResyncRequired("journal_overflow")


def test_a_single_event_larger_than_the_bound_overflows_at_once():
    journal = Journal(max_bytes=10)
    recorded = journal.record({"type": "big", "delta": "x" * 100}, 0.0)
    assert recorded.overflow_notice and recorded.seq == 1 and len(journal) == 0
    assert journal.replay_after(0, 0.0) == ResyncRequired("journal_overflow")


def test_acks_and_ttl_make_room_before_the_bound_is_hit():
    size = utf8_len(compact(ev(1), 1))
    journal = Journal(max_bytes=2 * size, ttl_s=10.0)
    journal.record(ev(1), 0.0)
    journal.record(ev(2), 0.0)
    journal.acknowledge(1)
    assert journal.record(ev(3), 0.0).overflow_notice is False
    assert journal.record(ev(4), 11.0).overflow_notice is False  # seqs 2, 3 aged out first
    assert not journal.overflowed
    assert replay_seqs(journal.replay_after(3, 11.0)) == [4]


# --- state machine against a reference model --------------------------------------------------------------

KEYS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=4).filter(
    lambda k: k != "server_event_seq"
)
VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(-1000, 1000),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 9), max_size=3),
)
EVENTS = st.builds(lambda t, extra: {"type": t, **extra}, st.sampled_from(["a.b", "résumé.δ", "x"]),
                   st.dictionaries(KEYS, VALUES, max_size=3))


class JournalMachine(RuleBasedStateMachine):
    """Random record/ack/prune/replay on a fake monotone clock, against a simple reference model."""

    @initialize(max_bytes=st.integers(40, 400), ttl_s=st.sampled_from([0.5, 3.0, 10.0, 1e9]))
    def setup(self, max_bytes, ttl_s):
        self.journal = Journal(max_bytes=max_bytes, ttl_s=ttl_s)
        self.max_bytes, self.ttl_s = max_bytes, ttl_s
        self.now = 0.0
        self.texts: dict[int, str] = {}  # every seq ever stamped -> its text
        self.at: dict[int, float] = {}
        self.present: list[int] = []  # retained seqs, in order
        self.dropped = 0
        self.overflowed = False
        self.notices = 0
        self.last_seq = 0

    def _model_prune(self, now: float) -> None:
        while self.present and now - self.at[self.present[0]] > self.ttl_s:
            self.dropped = max(self.dropped, self.present.pop(0))

    def _model_bytes(self) -> int:
        return sum(utf8_len(self.texts[s]) for s in self.present)

    @rule(dt=st.integers(0, 8).map(lambda n: n / 2))
    def tick(self, dt):
        self.now += dt

    @rule(event=EVENTS)
    def record(self, event):
        self._model_prune(self.now)
        recorded = self.journal.record(event, self.now)
        seq = self.last_seq + 1
        assert recorded.seq == seq == self.journal.head
        assert recorded.text == compact(event, seq)
        self.last_seq = seq
        self.texts[seq], self.at[seq] = recorded.text, self.now
        size = utf8_len(recorded.text)
        expect_notice = False
        if not self.overflowed:
            if self._model_bytes() + size > self.max_bytes:
                self.overflowed = expect_notice = True
            else:
                self.present.append(seq)
        assert recorded.overflow_notice is expect_notice
        self.notices += recorded.overflow_notice

    @rule(data=st.data())
    def ack(self, data):
        seq = data.draw(st.integers(0, self.last_seq), label="ack")
        self.journal.acknowledge(seq)
        self.present = [s for s in self.present if s > seq]
        self.dropped = max(self.dropped, seq)

    @rule(bad=st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(allow_nan=False), st.text(max_size=2)))
    def invalid_ack(self, bad):
        with pytest.raises(InvalidAck):
            self.journal.acknowledge(bad)

    @rule(extra=st.integers(1, 3))
    def ack_above_head(self, extra):
        with pytest.raises(InvalidAck):
            self.journal.acknowledge(self.last_seq + extra)

    @rule()
    def prune(self):
        self._model_prune(self.now)
        self.journal.prune(self.now)

    @rule(data=st.data())
    def replay(self, data):
        cursor = data.draw(st.integers(0, self.last_seq + 2), label="cursor")
        self._check_replay(cursor)

    @rule(data=st.data())
    def replay_valid_cursor(self, data):
        self._model_prune(self.now)
        cursor = data.draw(st.integers(self.dropped, self.last_seq), label="valid cursor")
        self._check_replay(cursor)

    def _check_replay(self, cursor: int) -> None:
        self._model_prune(self.now)
        result = self.journal.replay_after(cursor, self.now)
        event(f"replay -> {result.reason if isinstance(result, ResyncRequired) else type(result).__name__}")
        if cursor > self.last_seq:
            assert result == ReplayConflict(self.last_seq)
        elif self.overflowed:
            assert result == ResyncRequired("journal_overflow")
        elif cursor < self.dropped:
            assert result == ResyncRequired("journal_gap")
        else:
            # No loss, no duplicates: exactly every event after the cursor, byte-identical, in order.
            assert isinstance(result, Replay), result
            assert [e.seq for e in result.entries] == list(range(cursor + 1, self.last_seq + 1))
            assert [e.text for e in result.entries] == [self.texts[s] for s in range(cursor + 1, self.last_seq + 1)]

    @invariant()
    def consistent(self):
        if not hasattr(self, "journal"):
            return
        j = self.journal
        assert j.head == self.last_seq
        assert j.dropped_through == self.dropped
        assert j.overflowed is self.overflowed
        assert self.notices == int(self.overflowed)
        entries = j.entries()
        seqs = [e.seq for e in entries]
        assert seqs == self.present
        assert all(a < b for a, b in zip(seqs, seqs[1:]))
        assert all(e.size == utf8_len(e.text) and e.text == self.texts[e.seq] for e in entries)
        assert all(e.seq > j.dropped_through for e in entries)
        assert j.retained_bytes == sum(e.size for e in entries) == self._model_bytes()
        assert j.retained_bytes <= j.max_bytes
        assert len(j) == len(entries)


JournalMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestJournalMachine = JournalMachine.TestCase


@settings(max_examples=150, deadline=None)
@given(events=st.lists(EVENTS, min_size=1, max_size=20), acks=st.lists(st.integers(0, 25), max_size=5))
def test_seqs_strictly_increase_and_replay_from_dropped_through_is_lossless(events, acks):
    journal = Journal()  # 8 MiB: no overflow here
    texts = [journal.record(e, 0.0).text for e in events]
    for a in acks:
        if a <= journal.head:
            journal.acknowledge(a)
    assert [json.loads(t)["server_event_seq"] for t in texts] == list(range(1, len(events) + 1))
    entries = replay_after_ok(journal, journal.dropped_through, 0.0)
    assert [e.text for e in entries] == texts[journal.dropped_through :]


# --- the resume credential ---------------------------------------------------------------------------------

TOKEN = re.compile(r"^rt_[A-Za-z0-9_-]{43}$")


def test_verify_before_issue_is_false():
    cred = ResumeCredential()
    assert cred.generation == 0
    for token in ("", "rt_", "rt_" + "A" * 43, None):
        assert cred.verify(token) is False


def test_issue_and_verify():
    cred = ResumeCredential()
    token = cred.issue()
    assert TOKEN.match(token)
    assert cred.generation == 1
    assert cred.verify(token) is True
    assert cred.verify(token + "x") is False
    assert cred.verify(token[:-1]) is False
    assert cred.verify("") is False


def test_only_a_digest_is_kept():
    cred = ResumeCredential()
    token = cred.issue()
    assert token not in repr(vars(cred))


@pytest.mark.parametrize(
    "make_bad",
    [lambda t: None, lambda t: 123, lambda t: t.encode(), lambda t: [t], lambda t: {"token": t}, lambda t: True],
)
def test_non_string_tokens_are_rejected(make_bad):
    cred = ResumeCredential()
    token = cred.issue()
    assert cred.verify(make_bad(token)) is False


def test_rotation_rejects_the_old_token_and_bumps_the_generation():
    cred = ResumeCredential()
    tokens = [cred.issue()]
    for generation in range(2, 6):
        tokens.append(cred.issue())
        assert cred.generation == generation  # 1 at open, +1 per resume
        assert cred.verify(tokens[-1]) is True
        assert not any(cred.verify(old) for old in tokens[:-1])
    assert len(set(tokens)) == len(tokens)


def test_rollback_restores_the_previous_token_and_generation():
    cred = ResumeCredential()
    old = cred.issue()
    new = cred.issue()
    assert cred.generation == 2
    cred.rollback()
    assert cred.generation == 1
    assert cred.verify(old) is True
    assert cred.verify(new) is False
    # The session can be resumed again afterwards: the next token is generation 2 and rotates out the old one.
    newer = cred.issue()
    assert cred.generation == 2 and cred.verify(newer) and not cred.verify(old) and not cred.verify(new)


def test_rollback_of_the_first_issue_leaves_nothing_valid():
    cred = ResumeCredential()
    token = cred.issue()
    cred.rollback()
    assert cred.generation == 0
    assert cred.verify(token) is False


def test_rollback_without_issue_is_harmless():
    cred = ResumeCredential()
    cred.rollback()
    assert cred.generation == 0


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.sampled_from(["issue", "rollback"]), max_size=12), junk=st.text(max_size=50))
def test_credential_model(ops, junk):
    """Exactly the latest un-rolled-back token verifies; the generation counts issues minus rollbacks."""
    cred = ResumeCredential()
    history: list[str] = []  # token per generation, index = generation - 1
    issued: list[str] = []
    can_roll_back = False
    for op in ops:
        if op == "issue":
            token = cred.issue()
            history.append(token)
            issued.append(token)
            can_roll_back = True
        elif can_roll_back:  # one step back after an issue (a second rollback is a no-op)
            cred.rollback()
            history.pop()
            can_roll_back = False
        else:
            cred.rollback()
        assert cred.generation == len(history)
        current = history[-1] if history else None
        for token in issued:
            assert cred.verify(token) is (token == current)
        assert cred.verify(junk) is (junk == current)


def test_verify_of_an_unencodable_string_is_false():
    cred = ResumeCredential()
    cred.issue()
    assert cred.verify("rt_\ud800") is False
