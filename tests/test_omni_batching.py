"""The engine tick on threads (omni/batching.py): sessions' model threads block until their tick is released, and the
tick's positions are submitted together, stamped, in one coroutine on the API loop. No vLLM needed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from vllm_omni_voicechat.omni.batching import EngineBatcher, TickStamp


class Clock:
    """A clock the test moves; ``wait`` is real (threads block on a condition), deadlines are the clock's."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _run(batcher: EngineBatcher, key: str, ready: float, log: list, results: dict, fail: bool = False):
    async def submit(stamp: TickStamp) -> None:
        log.append((key, stamp.tick, stamp.size, threading.current_thread().name))
        if fail:
            raise RuntimeError(f"{key}: the engine refused the append")

    def body():
        try:
            results[key] = batcher.submit(key, ready, submit)
        except Exception as exc:  # what the session's step would raise
            results[key] = exc

    thread = threading.Thread(target=body, name=f"model-{key}")
    thread.start()
    return thread


def _wait_until(predicate, timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        done.wait(0.005)  # another thread's progress: there is no event of ours to wait on
    raise AssertionError("condition not reached")


def test_a_lone_session_is_submitted_at_once_with_its_stamp(api_loop):
    clock = Clock()
    batcher = EngineBatcher(0.04, api_loop, clock=clock)
    batcher.enter("a")
    log, results = [], {}
    _run(batcher, "a", clock.now, log, results).join(5)
    assert results["a"] == TickStamp(tick=0, size=1, held_ms=0.0, late_ms=0.0)
    assert log == [("a", 0, 1, log[0][3])] and log[0][3] != "model-a"  # submitted on the API loop's thread


def test_sessions_in_step_are_held_and_submitted_together_in_one_coroutine(api_loop):
    clock = Clock()
    batcher = EngineBatcher(0.04, api_loop, clock=clock)
    for key in ("a", "b", "c"):
        batcher.enter(key)
    log, results = [], {}
    for key in ("a", "b", "c"):  # a first round alone (nobody expected yet)
        _run(batcher, key, clock.now, log, results).join(5)
    assert [r.size for r in results.values()] == [1, 1, 1]
    clock.now += 0.08
    log.clear()
    threads = [_run(batcher, "a", clock.now, log, results)]
    _wait_until(lambda: batcher.tick.waiting_for == {"b", "c"})
    clock.now += 0.01
    threads.append(_run(batcher, "b", clock.now, log, results))
    _wait_until(lambda: batcher.tick.waiting_for == {"c"})
    assert log == []  # nothing submitted while the tick waits
    clock.now += 0.005
    threads.append(_run(batcher, "c", clock.now, log, results))
    for thread in threads:
        thread.join(5)
    assert [(k, t, n) for k, t, n, _ in log] == [("a", 3, 3), ("b", 3, 3), ("c", 3, 3)]
    assert len({name for *_, name in log}) == 1  # the API loop's one thread
    assert results["a"].held_ms == pytest.approx(15.0)
    assert results["b"].held_ms == pytest.approx(5.0)
    assert results["c"] == TickStamp(3, 3, 0.0, 0.0)
    assert batcher.releases == 4


def test_the_slot_releases_a_tick_whose_expected_session_never_comes(api_loop):
    clock = Clock()
    batcher = EngineBatcher(0.02, api_loop, clock=clock)  # the waiting thread wakes by its own timed wait
    batcher.enter("a")
    batcher.enter("b")
    log, results = [], {}
    for key in ("a", "b"):  # each alone (nobody is expected yet); a frame later both are
        _run(batcher, key, clock.now, log, results).join(5)
    clock.now += 0.08
    waiter = _run(batcher, "a", clock.now, log, results)  # b is expected within the slot and does not come
    _wait_until(lambda: batcher.tick.waiting_for == {"b"})
    clock.now += 0.02
    waiter.join(5)
    assert results["a"].size == 1 and results["a"].held_ms == pytest.approx(20.0)
    assert results["a"].late_ms == 0.0
    assert batcher.tick.waiting_for == frozenset()


def test_a_failed_submission_fails_only_its_own_session(api_loop):
    clock = Clock()
    batcher = EngineBatcher(0.04, api_loop, clock=clock)
    batcher.enter("a")
    batcher.enter("b")
    log, results = [], {}
    for key in ("a", "b"):
        _run(batcher, key, clock.now, log, results).join(5)
    clock.now += 0.08
    first = _run(batcher, "a", clock.now, log, results, fail=True)
    _wait_until(lambda: batcher.tick.waiting_for == {"b"})
    _run(batcher, "b", clock.now, log, results).join(5)
    first.join(5)
    assert isinstance(results["a"], RuntimeError) and "refused" in str(results["a"])
    assert results["b"] == TickStamp(2, 2, 0.0, 0.0)


def test_a_session_that_leaves_is_no_longer_waited_for(api_loop):
    clock = Clock()
    batcher = EngineBatcher(0.04, api_loop, clock=clock)
    batcher.enter("a")
    batcher.enter("b")
    log, results = [], {}
    for key in ("a", "b"):
        _run(batcher, key, clock.now, log, results).join(5)
    clock.now += 0.08
    waiting = _run(batcher, "a", clock.now, log, results)
    _wait_until(lambda: batcher.tick.waiting_for == {"b"})
    batcher.leave("b")  # b's session ended: a's tick goes at once
    waiting.join(5)
    assert results["a"].size == 1
