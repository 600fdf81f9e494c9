"""server/heap.py: a session's end asks for a full collection: as soon as its handler has returned, or one interval
after the last; one timer at a time, and nothing at all when the server does not own its process."""

from __future__ import annotations

from vllm_omni_voicechat.server.heap import Heap


def make() -> tuple[Heap, list[int]]:
    calls: list[int] = []
    return Heap(managed=True, interval_s=2.0, collect=lambda: calls.append(1)), calls


def test_the_first_end_collects_next_and_a_burst_shares_one_timer():
    heap, calls = make()
    assert heap.session_ended(10.0) == 0.0  # once the handler has returned: the edge runs it from the loop
    assert heap.session_ended(10.0) is None  # the timer covers this end too
    heap.collect_due(10.0)
    assert calls == [1] and heap.collections == 1
    assert heap.session_ended(10.5) == 1.5  # due 2 s after the last
    assert heap.session_ended(11.0) is None
    heap.collect_due(12.0)
    assert heap.session_ended(13.0) == 1.0
    assert calls == [1, 1] and heap.collections == 2


def test_an_end_an_interval_after_the_last_collection_collects_next():
    heap, calls = make()
    heap.session_ended(0.0)
    heap.collect_due(0.0)
    assert heap.session_ended(2.0) == 0.0 and heap.session_ended(9.0) is None
    heap.collect_due(2.0)
    assert heap.session_ended(9.0) == 0.0
    assert calls == [1, 1]


def test_an_unmanaged_heap_does_nothing():
    calls: list[int] = []
    heap = Heap(managed=False, collect=lambda: calls.append(1))
    heap.started()
    assert [heap.session_ended(t) for t in (0.0, 0.1, 5.0)] == [None, None, None]
    assert calls == [] and heap.collections == 0
