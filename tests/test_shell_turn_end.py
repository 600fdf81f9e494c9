"""The loop's turn-end batch (shell/turn_end.py): one handle a turn, callbacks in order, a failure isolated."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import uvloop

from vllm_omni_voicechat.shell.turn_end import TurnEnd, turn_end

LOOPS = pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])


class _Loop:
    """A loop's two methods the batch uses, recorded: the handles it asks for, the failures it reports."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], object]] = []
        self.reported: list[dict] = []

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.soon.append(callback)

    def call_exception_handler(self, context: dict) -> None:
        self.reported.append(context)

    def turn(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()


def test_callbacks_added_in_one_turn_run_together_in_order_after_it_with_one_handle():
    loop = _Loop()
    batch = TurnEnd(loop)  # type: ignore[arg-type]
    ran: list[str] = []
    for name in "abc":
        batch.call(lambda name=name: ran.append(name))
    assert ran == [] and len(loop.soon) == 1  # nothing before the turn is over; one handle for the three
    loop.turn()
    assert ran == ["a", "b", "c"] and loop.soon == []


def test_the_mark_is_the_same_within_a_turn_and_changes_once_it_is_over():
    loop = _Loop()
    batch = TurnEnd(loop)  # type: ignore[arg-type]
    first = batch.mark()
    batch.call(lambda: None)
    assert batch.mark() == first and len(loop.soon) == 1  # marks and calls of one turn share its handle
    loop.turn()
    second = batch.mark()
    assert second != first and batch.mark() == second
    loop.turn()
    assert batch.mark() != second
    loop.turn()
    assert loop.soon == []  # a turn nobody marked asks for no handle


def test_a_callback_that_raises_is_reported_and_the_rest_still_run():
    loop = _Loop()
    batch = TurnEnd(loop)  # type: ignore[arg-type]
    ran: list[str] = []

    def fails() -> None:
        raise RuntimeError("boom")

    batch.call(lambda: ran.append("before"))
    batch.call(fails)
    batch.call(lambda: ran.append("after"))
    loop.turn()
    assert ran == ["before", "after"]
    assert [(type(c["exception"]), c["callback"]) for c in loop.reported] == [(RuntimeError, fails)]


def test_a_callback_added_while_the_batch_runs_runs_after_the_next_turn():
    loop = _Loop()
    batch = TurnEnd(loop)  # type: ignore[arg-type]
    ran: list[str] = []
    batch.call(lambda: (ran.append("first"), batch.call(lambda: ran.append("second"))))
    loop.turn()
    assert ran == ["first"]
    loop.turn()
    assert ran == ["first", "second"]


@LOOPS
def test_on_a_real_loop_the_batch_runs_once_the_turn_is_over_and_each_loop_has_its_own(new_loop):
    async def main() -> list[str]:
        batch = turn_end(asyncio.get_running_loop())
        assert turn_end(asyncio.get_running_loop()) is batch
        ran: list[str] = []
        mark = batch.mark()
        asyncio.get_running_loop().call_soon(ran.append, "queued after the mark")  # after the batch's handle
        batch.call(lambda: ran.append("batch"))
        ran.append("this turn")
        assert batch.mark() == mark
        await asyncio.sleep(0)  # ok: one turn of the loop, not a wait for time
        assert batch.mark() != mark
        return ran

    batches = []
    for _ in range(2):
        loop = new_loop()
        try:
            assert loop.run_until_complete(main()) == ["this turn", "batch", "queued after the mark"]
            batches.append(turn_end(loop))
        finally:
            loop.close()
    assert batches[0] is not batches[1]
