"""The one asyncio host: one session's shell feeds its protocol object, runs the model off the event loop and
executes effects.

The protocol object is anything with the driving interface of ``driving.py`` (a bare ``SessionCore`` or a wire
session). Client input is queued in an inbox and handed over only between positions, so the
protocol sees input and step results in one order and the model is never touched by two threads at once. The inbox
is bounded (:meth:`SessionShell.offer`): beyond its bounds a client message is refused, and its refusal is answered
through ``refuse`` in the same order as everything else (docs/reliability.md, "Backpressure"). A frame offered
while the loop waits with nothing queued is handled in the offering call itself (:meth:`SessionShell._direct`): the
same order, without a wake-up.
Everything that is not an effect (native events, wire events, transport instructions) goes to ``sink`` in order;
the sink may be a coroutine function, whose backpressure slows this session only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..model.port import ModelPort
from ..ops.tally import LATE_MS
from ..session.commands import Command
from ..session.core import Tick
from ..session.events import (
    AbortModel,
    CancelSynthesis,
    Effect,
    Prefill,
    StartSynthesis,
)
from ..synth.port import Synthesizer
from ..wire.limits import message_bytes
from .driving import Driven, Refusals
from .turn_end import TurnEnd, turn_end

Sink = Callable[[Any], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class _Done:
    """An effect finished in the executor: deliver its outcome to the core."""

    apply: Callable[[float], list[Any]]


class _Disconnect:
    pass


class _Wake:
    """Poll again: the protocol object changed outside the loop's own calls (a detach with its grace deadline)."""


@dataclass(frozen=True, slots=True)
class _Dispatch:
    """Outputs of a frame handled in the reader's call that need the loop (effects, an async sink)."""

    outputs: list[Any]


@dataclass(frozen=True, slots=True)
class _Raise:
    """The protocol object raised on a frame handled in the reader's call: the shell fails as if it had raised in
    the loop."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class _Offered:
    """A client frame queued through :meth:`SessionShell.offer` (counted against the inbox bounds)."""

    message: str | bytes
    size: int
    at: float
    """When it was offered (the shell's clock): a wait of 40 ms or more in the inbox is loop lag."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """A client frame the full inbox refused: only the client event id its typed error echoes is kept."""

    event_id: Any


class _Inbox:
    """The shell's FIFO with one waiter and a deadline. ``asyncio.wait_for(queue.get(), t)`` wraps the get in a
    task of its own on Python 3.11 (~6 us per wait, paid by every session between positions); this waits on one
    future. Its timer outlives a wait: a wait whose deadline is later than the armed one (an idle timeout moved on
    by the frame that just came) keeps it, and when it fires before the deadline of the wait then in progress it is
    moved on to it, instead of a timer made and cancelled on every wait."""

    __slots__ = ("_items", "_waiter", "_deadline", "_timer", "_timer_at", "_loop")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # the waits' loop, kept (see SessionShell._loop)
        self._waiter: asyncio.Future | None = None
        self._deadline: float | None = None  # the deadline of the wait in progress
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self) -> Any:
        return self._items.popleft()

    @property
    def parked(self) -> bool:
        """A wait is in progress and nothing has ended it yet (so nothing is queued)."""
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def retarget(self, deadline: float | None) -> None:
        """Move the deadline of the wait in progress (None: none)."""
        self._deadline = deadline
        if deadline is not None and deadline < self._timer_at:
            self._arm(self._loop, deadline)  # type: ignore[arg-type]  # a wait is in progress: its loop is known

    def empty(self) -> bool:
        return not self._items

    async def wait(self, deadline: float | None) -> bool:
        """Until an item is queued (True) or the loop's clock reaches ``deadline`` (False; None: no deadline)."""
        if self._items:
            return True
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._deadline = deadline
        if deadline is not None and deadline < self._timer_at:
            self._arm(loop, deadline)
        try:
            await waiter
        finally:
            self._waiter = None
        return bool(self._items)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when + TIMER_SLACK_S, self._expire, loop)
        self._timer_at = when

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._timer_at = math.inf
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return  # no wait, or one without a deadline: the next wait with one arms a timer again
        if loop.time() < deadline - EARLY_WAKE_S:
            self._arm(loop, deadline)  # armed for an earlier wait's deadline: on to this one's
            return
        waiter.set_result(None)

    def close(self) -> None:
        """Cancel the armed timer (the loop would hold the inbox, and what is queued in it, until it fires)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf


EARLY_WAKE_S = 0.001
"""A deadline timer that fires less than this before the wait's deadline ends the wait (the shell polls and, if
nothing is due yet, waits again), as a timer armed for it would: timers keep a millisecond's resolution."""

TIMER_SLACK_S = 0.002
"""How long after a wait's deadline its timer is armed. uvloop's clock is whole milliseconds, truncated, and it rounds
a delay to one: a timer armed for the deadline itself fired up to 1.5 ms before it by the shell's clock (most fired
~0.05 ms before), so a paced position woke its shell twice, once to find it not yet due (a quarter of all positions
at 200 v3 sessions). Armed 1.5 ms later, and a margin for the reads of the two clocks, the first wake-up finds it
due."""


BACKLOG_SLICE_S = 0.002
"""How long a session's work may run back to back (inline positions, client frames) before it yields the loop to
the others."""
LATE_INBOX_S = LATE_MS / 1000.0
"""A client message that waited half a frame in the inbox was read late (the tally's ``late_inbox``)."""


def _nowhere(output: Any) -> None:
    """The sink of an ended shell."""


class SessionShell:
    def __init__(
        self,
        core: Driven,
        model: ModelPort,
        sink: Sink,
        *,
        synthesizer: Synthesizer | None = None,
        executor: concurrent.futures.Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_inbox_messages: int | None = None,
        max_inbox_bytes: int | None = None,
        refusals: Refusals | None = None,
        backlog_slice_s: float = BACKLOG_SLICE_S,
    ) -> None:
        self.core = core
        self.model = model
        self.synthesizer = synthesizer
        self._sink = sink
        self._sink_is_async = inspect.iscoroutinefunction(sink)
        # A model whose steps take microseconds (the simulator) steps on the loop: a thread hop per position cost
        # more than the step itself, and a thread per session queued for the GIL under load.
        self._inline_steps = bool(getattr(model, "inline_steps", False))
        self.backlog_slice_s = backlog_slice_s
        # Model calls off the loop (prefill, abort, a slow model's steps) run one at a time, in order, in the given
        # executor (a pool the server shares among inline-step sessions: no thread per session) or in a thread of
        # this session's own.
        self._model_lock = asyncio.Lock()
        self._stray: asyncio.Future | None = None  # an executor call whose waiter was cancelled, still running
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voicechat-model")
        self._clock = clock
        self._inbox = _Inbox()
        # Bounds on client messages offered through offer() (internal items never count): queued messages and
        # bytes, then pending refusals; when both are full the reader waits (TCP backpressure, no growth).
        self.max_inbox_messages = max_inbox_messages
        self.max_inbox_bytes = max_inbox_bytes
        self._refusals = refusals
        self.inbox_messages = 0
        self.inbox_bytes = 0
        self.pending_refusals = 0
        self.peak_inbox_messages = 0
        self.peak_inbox_bytes = 0
        self.refused = 0
        self.late_messages = 0
        """Client messages read 40 ms or more after they were offered (``LATE_INBOX_S``): the loop, or this session's
        positions, fell behind. Also counted in the core's tally, when it keeps one."""
        self._room = asyncio.Event()
        self._room.set()
        self._handed = asyncio.Event()  # a client frame went from the inbox to the protocol object
        self._tasks: set[asyncio.Task] = set()
        self.positions = 0
        self.model_failure: str | None = None
        self.model_error: BaseException | None = None  # what the model raised (the server tells a timeout apart)
        self.last_step_at: float | None = None  # when a position last completed (the server's stall check)
        self.cleanup_error: BaseException | None = None  # model.abort() failed: the model home is suspect
        self._released = False
        self._synthesis_next: tuple[str, str] | None = None
        """The typed job whose synthesis runs next (one at a time: a replaced job's never starts)."""
        self._synthesizing = False
        self._carried: Tick | None = None
        """A tick polled in the reader's call whose position the loop runs (its outputs needed the loop first)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop :meth:`run` runs on, kept: Python 3.11's ``asyncio.get_running_loop()`` makes a ``getpid``
        syscall (~2.6 a position)."""
        self._direct_slice_end: float | None = None
        """The slice that frames handled in the reader's call share while the loop waits (None: none started)."""
        self._direct_turn = -1
        """The loop's turn (``TurnEnd.mark``) that slice belongs to: a later turn starts a new one."""
        self._turn_end: TurnEnd | None = None  # the loop's end-of-turn batch, once run() knows the loop

    # --- inputs -----------------------------------------------------------------------------------------

    def submit(self, item: Command | str | bytes) -> None:
        """Queue client input: a command for a bare core, a raw frame for a wire session."""
        self._inbox.put_nowait(item)

    async def offer(self, message: str | bytes) -> bool:
        """Queue one client frame within the inbox bounds; False when it was refused (its typed error follows in
        order). Waits only while the inbox and the refusals are both full."""
        while True:
            taken = self.offer_nowait(message)
            if taken is not None:
                return taken
            self._room.clear()
            await self._room.wait()

    def offer_nowait(self, message: str | bytes) -> bool | None:
        """:meth:`offer` without waiting: None (nothing queued) while the inbox and the refusals are both full."""
        cap = self.max_inbox_messages
        # Frames the protocol object holds behind an unfinished barrier are still in the receive pump.
        fits = cap is None or self.inbox_messages + self.core.held_messages < cap
        if fits and self._inbox.parked and self._direct_ok():  # a parked loop has nothing queued: no byte bound
            self._direct(message)
            return True
        size = message_bytes(message)
        if fits and self.max_inbox_bytes is not None and self.inbox_messages:
            fits = self.inbox_bytes + size <= self.max_inbox_bytes  # one message always fits an empty inbox
        if fits:
            self.inbox_messages += 1
            self.inbox_bytes += size
            if self.inbox_messages > self.peak_inbox_messages:
                self.peak_inbox_messages = self.inbox_messages
            if self.inbox_bytes > self.peak_inbox_bytes:
                self.peak_inbox_bytes = self.inbox_bytes
            self._inbox.put_nowait(_Offered(message, size, self._clock()))
            return True
        if self._refusals is not None and (cap is None or self.pending_refusals < cap):
            self.pending_refusals += 1
            self.refused += 1
            self._inbox.put_nowait(_Refused(self._refusals.refusal_id(message)))
            return False
        return None

    def _taken(self, item: Any, now: float) -> Any:
        """Release what ``item`` held of the bounds (a message read ``now``, late or not); returns what the core
        receives."""
        if isinstance(item, _Refused):
            self.pending_refusals -= 1
        elif isinstance(item, _Offered):
            self.inbox_messages -= 1
            self.inbox_bytes -= item.size
            if now - item.at >= LATE_INBOX_S:
                self.late_messages += 1
                if self.core.tally is not None:
                    self.core.tally.late_inbox += 1
            item = item.message
        else:
            return item
        self._room.set()
        self._handed.set()
        return item

    async def settled(self) -> None:
        """Until every client frame offered so far has been handed to the protocol object (answered, if refused):
        what it reports about its input then covers everything read from the socket."""
        while self.inbox_messages or self.pending_refusals:
            self._handed.clear()
            await self._handed.wait()

    @property
    def inbox_empty(self) -> bool:
        """Nothing waits to be handed to the protocol object (client frames, completions, wake-ups)."""
        return self._inbox.empty()

    def disconnect(self) -> None:
        self._inbox.put_nowait(_Disconnect())

    def wake(self) -> None:
        """Poll the protocol object again soon (its deadlines may have changed)."""
        self._inbox.put_nowait(_Wake())

    # --- main loop --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until the session is closed (stop, fatal error or disconnect); always releases the model."""
        # Inline steps back to back (a released pre-roll, a cancel tail) hold the loop for at most a slice, then
        # yield: a yield per position cost each one a whole turn of a busy loop (a 12-frame pre-roll started
        # 40-65 ms late at 300 sessions), and the slice keeps any session from holding the others up.
        slice_end: float | None = None  # while inline steps run back to back: when they must yield
        self._loop = asyncio.get_running_loop()
        self._turn_end = turn_end(self._loop)
        try:
            while not self.core.closed:
                tick = self._carried  # a position the offering call started and left to the loop
                if tick is None:
                    tick = self.core.poll(self._clock())
                else:
                    self._carried = None
                if tick.outputs and not self._published(tick.outputs):
                    await self._dispatch(tick.outputs)
                if self.core.closed:
                    break
                if tick.position is not None:
                    self.positions += 1
                    if not self._inline_steps:
                        try:
                            result = await self._model_call(self.model.step, tick.position.input)
                        except Exception as exc:
                            outputs = self._failed(tick.position, exc)
                        else:
                            outputs = self._completed(tick.position, result)
                    else:
                        slice_end = self._within_slice(slice_end) or await self._next_slice()
                        if self._model_lock.locked() or self._stray is not None:
                            async with self._model_lock:  # after the prefill (or abort) in the executor
                                await self._settle_stray()
                        outputs = self._step_inline(tick.position)  # no await since: no call can start
                    if outputs and not self._published(outputs):
                        await self._dispatch(outputs)
                    self._room.set()  # a position's ack may have released held frames
                    while not self.core.closed and not self._inbox.empty():
                        slice_end = self._within_slice(slice_end) or await self._next_slice()
                        await self._handle(self._inbox.get_nowait())
                    continue
                if not self._inbox.empty():  # client frames back to back: within the same slice
                    slice_end = self._within_slice(slice_end) or await self._next_slice()
                    await self._handle(self._inbox.get_nowait())
                    continue
                slice_end = None
                if await self._inbox.wait(self._loop_deadline(tick.wake_at)):
                    await self._handle(self._inbox.get_nowait())
        finally:
            await self._teardown()

    def _loop_deadline(self, wake_at: float | None) -> float | None:
        """``wake_at`` on the shell's clock as a time of the loop's (they differ under test clocks)."""
        if wake_at is None:
            return None
        return self._loop.time() + max(0.0, wake_at - self._clock())  # type: ignore[union-attr]  # run() set it

    def _step_inline(self, position: Any) -> list[Any]:
        """Step a model that steps on the loop; what the protocol object makes of the outcome."""
        try:
            result = self.model.step(position.input)
        except Exception as exc:
            return self._failed(position, exc)
        return self._completed(position, result)

    def _completed(self, position: Any, result: Any) -> list[Any]:
        self.last_step_at = now = self._clock()
        return self.core.complete(position, result, now)

    def _failed(self, position: Any, error: Exception) -> list[Any]:
        self.model_failure = f"position {self.positions - 1}: {error}"  # for the server's log
        self.model_error = error
        return self.core.fail(position, error, self._clock())

    # --- frames handled in the offering call --------------------------------------------------------------

    def _direct_ok(self) -> bool:
        """Whether a frame offered now may be handled in the offering call (:meth:`_direct`): the loop waits with
        nothing queued (the caller checks), the model steps on the loop and is free, the sink is plain, and the
        frames handled so in this turn of the event loop have not held it for a slice."""
        if not self._inline_steps or self._sink_is_async or self._model_lock.locked() or self._stray is not None:
            return False
        if self.core.closed:
            return False
        turn = self._turn_end.mark()  # type: ignore[union-attr]  # run() set it
        if turn != self._direct_turn:  # the first frame handled so in this turn: a slice starts (one turn at most)
            self._direct_turn = turn
            self._direct_slice_end = self._clock() + self.backlog_slice_s
            return True
        return self._clock() < self._direct_slice_end  # type: ignore[operator]

    def _direct(self, message: str | bytes) -> None:
        """Handle a client frame in the call that offers it, while the loop waits for one: what the loop would do
        next (the frame, the positions then due, the next deadline), without waking it (a future resolved, a turn
        of the event loop, the coroutine resumed). Whatever needs the loop is left to it, in order, and wakes it:
        outputs with an effect (or for an async sink), a position beyond the slice, what the sink queued (a
        disconnect, a wake-up), the session's end, an error raised."""
        inbox = self._inbox
        queued = inbox._items  # what the sink queued meanwhile (read here as the inbox's own empty() would)
        try:
            now = self._clock()
            outputs = self.core.receive(message, now, now)
            while True:
                if outputs and not self._published(outputs):
                    inbox.put_nowait(_Dispatch(outputs))  # the loop dispatches them, then polls
                    return
                if self.core.closed or queued:
                    break
                tick = self.core.poll(self._clock())
                position = tick.position
                published = not tick.outputs or self._published(tick.outputs)
                if position is None:
                    if not published:
                        inbox.put_nowait(_Dispatch(tick.outputs))
                        return
                    if self.core.closed or queued:
                        break
                    inbox.retarget(self._loop_deadline(tick.wake_at))  # the loop's wait goes on to the new deadline
                    return
                end = self._direct_slice_end  # _direct_ok started it
                if not published or queued or self._clock() >= end:  # type: ignore[operator]
                    self._carried = tick if not published else Tick([], position, tick.wake_at)
                    break
                self.positions += 1
                outputs = self._step_inline(position)
                self._room.set()  # a position's ack may have released held frames
            inbox.put_nowait(_Wake())
        except Exception as exc:
            inbox.put_nowait(_Raise(exc))

    def _within_slice(self, slice_end: float | None) -> float | None:
        """Work back to back (client frames, inline positions) holds the loop for at most a slice, then yields (a
        client flooding its inbox gets its turn, not everyone's): the slice's end, or None once it has passed."""
        if slice_end is None:
            return self._clock() + self.backlog_slice_s
        if self._clock() < slice_end:
            return slice_end
        return None

    async def _next_slice(self) -> float:
        """Yield the loop once; the end of the next slice."""
        await asyncio.sleep(0)
        return self._clock() + self.backlog_slice_s

    async def _handle(self, item: Any) -> None:
        now = self._clock()
        arrived = item.at if isinstance(item, _Offered) else None  # read then; handed on after the position in flight
        item = self._taken(item, now)
        if isinstance(item, _Refused):
            if self._refusals is not None and not self.core.closed:
                await self._dispatch(self._refusals.refuse(item.event_id, now))
        elif isinstance(item, _Disconnect):
            await self._dispatch(self.core.disconnect(now), publish=False)
        elif isinstance(item, _Done):
            await self._dispatch(item.apply(now))
            self._room.set()  # a finished barrier may have released held frames
        elif isinstance(item, _Wake):
            pass  # the loop polls again
        elif isinstance(item, _Dispatch):
            await self._dispatch(item.outputs)
            self._room.set()
        elif isinstance(item, _Raise):
            raise item.error
        else:
            outputs = self.core.receive(item, now, arrived)
            if outputs and not self._published(outputs):
                await self._dispatch(outputs)

    def _published(self, outputs: list[Any]) -> bool:
        """Hand ``outputs`` to a plain sink when none is an effect (most positions: a few events), without the
        coroutine :meth:`_dispatch` is; False (nothing handed) when :meth:`_dispatch` must take them."""
        if self._sink_is_async:
            return False
        for output in outputs:
            if isinstance(output, Effect):
                return False
        sink = self._sink
        for output in outputs:
            sink(output)
        return True

    async def _dispatch(self, outputs: list[Any], *, publish: bool = True) -> None:
        for output in outputs:
            if not isinstance(output, Effect):
                if publish:
                    if self._sink_is_async:
                        await self._sink(output)  # type: ignore[misc]
                    else:
                        self._sink(output)
                continue
            match output:
                case AbortModel():
                    await self._abort_model()
                case Prefill(prompt=prompt):
                    self._spawn(self._prefill(prompt))
                case StartSynthesis(job_id=job_id, text=text):
                    self._synthesis_next = (job_id, text)
                    if not self._synthesizing:
                        self._synthesizing = True
                        self._spawn(self._synthesize())
                case CancelSynthesis(job_id=job_id):
                    # One not started never runs; a finished one for a cancelled job is ignored by the core.
                    if self._synthesis_next is not None and self._synthesis_next[0] == job_id:
                        self._synthesis_next = None

    async def _model_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the executor after this session's earlier model calls have returned."""
        async with self._model_lock:
            await self._settle_stray()
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                if not future.done():
                    self._stray = future  # its thread still runs it: the next call waits for it
                raise

    async def _settle_stray(self) -> None:
        if self._stray is not None:
            await asyncio.wait({self._stray})
            self._stray = None

    async def _abort_model(self) -> None:
        self._released = True
        try:
            await self._model_call(self.model.abort)
        except Exception as exc:  # the model home is suspect: the server stops admitting sessions
            self.cleanup_error = exc

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prefill(self, prompt: Any) -> None:
        core = self.core
        try:
            await self._model_call(self.model.prefill, prompt)
        except Exception as exc:
            self._inbox.put_nowait(_Done(lambda now, e=exc: core.prefill_failed(e, now)))
        else:
            self._inbox.put_nowait(_Done(core.prefilled))

    async def _synthesize(self) -> None:
        """The session's syntheses, one at a time: a client replacing its typed request as fast as it can queues no
        more than one synthesis in the shared executor."""
        loop = asyncio.get_running_loop()
        core = self.core
        synth = self.synthesizer
        try:
            while self._synthesis_next is not None:
                job_id, text = self._synthesis_next
                self._synthesis_next = None
                try:
                    if synth is None:
                        raise RuntimeError("no typed-input synthesizer")
                    # Synthesis has its own thread: it must not queue behind model positions.
                    pcm = await loop.run_in_executor(None, synth.synthesize, text)
                except Exception as exc:
                    self._inbox.put_nowait(_Done(lambda now, j=job_id, e=exc: core.synthesis_failed(j, e, now)))
                else:
                    self._inbox.put_nowait(_Done(lambda now, j=job_id, p=pcm: core.synthesis_done(j, p, now)))
        finally:
            self._synthesizing = False

    async def _teardown(self) -> None:
        self._inbox.close()
        self._carried = None
        if not self.core.closed:  # cancelled from outside: tear down like a disconnect
            outputs = self.core.disconnect(self._clock())
            if any(isinstance(o, AbortModel) for o in outputs):
                try:
                    await asyncio.shield(self._abort_model())
                except asyncio.CancelledError:
                    pass
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self._released:
            # A session that ended normally still holds its model home (an engine-side session, KV state).
            try:
                await asyncio.shield(self._abort_model())
            except asyncio.CancelledError:
                pass
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)
        # An ended shell hands nothing on: dropping the sink (its owner's bound method, typically) leaves no cycle
        # between the shell and whoever holds it, so the ended session is freed by reference counting.
        self._sink = _nowhere
        self._sink_is_async = False
