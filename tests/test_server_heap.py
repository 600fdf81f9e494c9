"""server/heap.py: an ended session frees itself, so by default a session's end asks for nothing; with
``collect_after_ends`` (the former policy) it asks for a full collection as soon as its handler has returned, or one
interval after the last, one timer at a time; nothing at all when the server does not own its process."""

from __future__ import annotations

import gc

import pytest

from vllm_omni_voicechat.server.heap import Heap


def make() -> tuple[Heap, list[int]]:
    calls: list[int] = []
    return Heap(managed=True, interval_s=2.0, collect_after_ends=True, collect=lambda: calls.append(1)), calls


def test_by_default_a_session_s_end_asks_for_no_collection():
    calls: list[int] = []
    heap = Heap(managed=True, interval_s=2.0, collect=lambda: calls.append(1))
    assert [heap.session_ended(t) for t in (0.0, 0.1, 5.0)] == [None, None, None]
    assert calls == [] and heap.collections == 0


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
    heap = Heap(managed=False, collect_after_ends=True, collect=lambda: calls.append(1))
    heap.started(0.0)
    assert [heap.session_ended(t) for t in (0.0, 0.1, 5.0)] == [None, None, None]
    assert calls == [] and heap.collections == 0


@pytest.fixture
def own_heap():
    """started() freezes this process's heap and changes its thresholds: put both back afterwards."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_a_started_server_runs_full_collections_only_when_asked(own_heap):
    """Young collections go on; the collector's own full collections (a pause that walks every live session) do
    not happen however many long-lived objects pile up."""
    heap, calls = make()
    heap.started(100.0)
    generations: list[int] = []

    def seen(phase, info):
        if phase == "stop":
            generations.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        kept = [[i] for i in range(300_000)]  # long-lived containers, promoted generation by generation
    finally:
        gc.callbacks.remove(seen)
    assert len(kept) == 300_000
    assert 0 in generations and 1 in generations
    assert 2 not in generations
    assert calls == []  # started() collects with gc itself; the injected collect is the sessions' and backstop's


def test_the_backstop_collects_once_the_last_full_collection_is_old(own_heap):
    heap = Heap(managed=True, interval_s=2.0, backstop_s=600.0, collect_after_ends=True,
                collect=lambda: calls.append(1))
    calls: list[int] = []
    heap.started(100.0)
    assert heap.backstop(100.0) == 600.0 and calls == []
    assert heap.backstop(400.0) == 300.0 and calls == []
    heap.session_ended(500.0)
    heap.collect_due(500.0)  # a session's end collected: the backstop counts from there
    assert heap.backstop(1_000.0) == 100.0 and calls == [1]
    assert heap.backstop(1_100.0) == 600.0 and calls == [1, 1]
    assert Heap(managed=False).backstop(0.0) is None


def test_a_managed_heap_trims_the_c_heap_on_its_interval_and_an_unmanaged_one_never():
    calls: list[int] = []
    heap = Heap(managed=True, trim_interval_s=1.5, trim=lambda: calls.append(1))
    assert heap.trim_due() == 1.5 and heap.trim_due() == 1.5
    assert calls == [1, 1] and heap.trims == 2
    assert Heap(managed=False, trim=lambda: calls.append(1)).trim_due() is None and calls == [1, 1]
    assert Heap(managed=True, trim=None).trim_due() in (None, 1.0)  # glibc here: trimmed; elsewhere nothing
