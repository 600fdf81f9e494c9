"""The client's input journal (``client/input_journal.py``): after a drop at any point, what it sends again plus
what the session had taken in is exactly the stream the client appended, in order, with nothing twice."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni_voicechat.client.input_journal import InputGap, InputJournal, base64_size


def appends(sizes: list[int]) -> list[tuple[str, int, str]]:
    return [(f"e{i}", n, f"text{i}") for i, n in enumerate(sizes)]


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.data(), st.booleans())
def test_what_is_resent_completes_the_stream_exactly_once(sizes, data, by_id):
    """The session took in a prefix (some of it refused with an error: handled, never resent); the journal resends
    exactly the rest, by the last handled event id or, for clients without ids, by bytes."""
    journal = InputJournal()
    sent = appends(sizes)
    for event_id, size, text in sent:
        journal.record(event_id if by_id else None, size, text)
    handled = data.draw(st.integers(0, len(sent)), label="handled")
    if by_id:
        refused = data.draw(st.sets(st.integers(0, max(0, handled - 1))), label="refused") if handled else set()
        taken = sum(size for i, (_, size, _) in enumerate(sent[:handled]) if i not in refused)
        receipt = {"audio_bytes": taken, "appends": handled - len(refused),
                   "last_append_event_id": sent[handled - 1][0] if handled else None}
    else:
        receipt = {"audio_bytes": sum(size for _, size, _ in sent[:handled]), "appends": handled,
                   "last_append_event_id": None}
    again = journal.unreceived(receipt)
    assert [e.text for e in again] == [text for _, _, text in sent[handled:]]
    # A second drop before anything new: the same receipt asks for the same appends, nothing more.
    assert [e.text for e in journal.unreceived(receipt)] == [e.text for e in again]
    assert len(journal) == len(sent) - handled


def test_a_receipt_behind_what_the_journal_retains_is_a_gap():
    journal = InputJournal(max_bytes=2500)
    for event_id, size, text in appends([1000, 1000, 1000, 1000]):
        journal.record(event_id, size, text)
    assert len(journal) == 2  # the oldest two were forgotten past the bound
    with pytest.raises(InputGap, match="'e0' is not in the journal"):
        journal.unreceived({"last_append_event_id": "e0"})
    with pytest.raises(InputGap, match="has 1000 bytes; the journal holds 2000..4000"):
        journal.unreceived({"audio_bytes": 1000})
    assert [e.text for e in journal.unreceived({"last_append_event_id": "e2"})] == ["text3"]


def test_a_byte_receipt_must_end_on_an_append_boundary_and_within_what_was_sent():
    journal = InputJournal()
    for _, size, text in appends([1000, 1000]):
        journal.record(None, size, text)
    with pytest.raises(InputGap, match="inside an append"):
        journal.unreceived({"audio_bytes": 1500})
    with pytest.raises(InputGap, match="has 2001 bytes"):
        journal.unreceived({"audio_bytes": 2001})
    with pytest.raises(InputGap, match="no usable position"):
        journal.unreceived({"audio_bytes": True})
    assert journal.unreceived({"audio_bytes": 2000}) == []


def test_the_newest_append_is_kept_even_beyond_the_bound():
    journal = InputJournal(max_bytes=10)
    journal.record("big", 100, "t")
    assert len(journal) == 1 and [e.text for e in journal.unreceived({"audio_bytes": 0})] == ["t"]
    with pytest.raises(ValueError):
        InputJournal(max_bytes=0)


@given(st.binary(max_size=300))
def test_base64_size_is_the_decoded_size(raw):
    assert base64_size(base64.b64encode(raw).decode()) == len(raw)
