"""The asyncio shell of one session: feeds the protocol object, runs the model off the event loop, executes
effects.

The protocol object is a :class:`~vllm_omni_voicechat.session.core.SessionCore` or a wire session wrapping one
(same driving interface). Client input is queued in an inbox and handed over only between positions, so the
protocol sees input and step results in one order and the model is never touched by two threads at once.
Everything that is not an effect (native events, wire events, transport instructions) goes to ``sink`` in order;
the sink may be a coroutine function, whose backpressure slows this session only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..model.port import ModelPort
from ..session.commands import Command
from ..session.core import SessionCore
from ..session.events import AbortModel, CancelSynthesis, Effect, Prefill, StartSynthesis
from ..synth.port import Synthesizer

Sink = Callable[[Any], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class _Done:
    """An effect finished in the executor: deliver its outcome to the core."""

    apply: Callable[[float], list[Any]]


class _Disconnect:
    pass


class SessionShell:
    def __init__(
        self,
        core: SessionCore | Any,
        model: ModelPort,
        sink: Sink,
        *,
        synthesizer: Synthesizer | None = None,
        executor: concurrent.futures.Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.model = model
        self.synthesizer = synthesizer
        self._sink = sink
        self._sink_is_async = inspect.iscoroutinefunction(sink)
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voicechat-model")
        self._clock = clock
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self.positions = 0
        self.cleanup_error: BaseException | None = None  # model.abort() failed: the model home is suspect
        self._released = False

    # --- inputs -----------------------------------------------------------------------------------------

    def submit(self, item: Command | str | bytes) -> None:
        """Queue client input: a command for a bare core, a raw frame for a wire session."""
        self._inbox.put_nowait(item)

    def disconnect(self) -> None:
        self._inbox.put_nowait(_Disconnect())

    # --- main loop --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until the session is closed (stop, fatal error or disconnect); always releases the model."""
        loop = asyncio.get_running_loop()
        try:
            while not self.core.closed:
                tick = self.core.poll(self._clock())
                await self._dispatch(tick.outputs)
                if self.core.closed:
                    break
                if tick.position is not None:
                    self.positions += 1
                    try:
                        result = await loop.run_in_executor(self._executor, self.model.step, tick.position.input)
                    except Exception as exc:
                        outputs = self.core.fail(tick.position, exc, self._clock())
                    else:
                        outputs = self.core.complete(tick.position, result, self._clock())
                    await self._dispatch(outputs)
                    while not self.core.closed and not self._inbox.empty():
                        await self._handle(self._inbox.get_nowait())
                    continue
                timeout = None if tick.wake_at is None else max(0.0, tick.wake_at - self._clock())
                try:
                    item = await asyncio.wait_for(self._inbox.get(), timeout)
                except TimeoutError:
                    continue
                await self._handle(item)
        finally:
            await self._teardown()

    async def _handle(self, item: Any) -> None:
        now = self._clock()
        if isinstance(item, _Disconnect):
            await self._dispatch(self.core.disconnect(now), publish=False)
        elif isinstance(item, _Done):
            await self._dispatch(item.apply(now))
        else:
            await self._dispatch(self.core.receive(item, now))

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
                    self._spawn(self._synthesize(job_id, text))
                case CancelSynthesis():
                    pass  # a finished synthesis for a cancelled job is ignored by the core

    async def _abort_model(self) -> None:
        self._released = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.model.abort)
        except Exception as exc:  # the model home is suspect: the server stops admitting sessions
            self.cleanup_error = exc

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prefill(self, prompt: Any) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        try:
            await loop.run_in_executor(self._executor, self.model.prefill, prompt)
        except Exception as exc:
            self._inbox.put_nowait(_Done(lambda now, e=exc: core.prefill_failed(e, now)))
        else:
            self._inbox.put_nowait(_Done(core.prefilled))

    async def _synthesize(self, job_id: str, text: str) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        synth = self.synthesizer
        try:
            if synth is None:
                raise RuntimeError("no typed-input synthesizer")
            # Synthesis has its own thread: it must not queue behind model positions.
            pcm = await loop.run_in_executor(None, synth.synthesize, text)
        except Exception as exc:
            self._inbox.put_nowait(_Done(lambda now, e=exc: core.synthesis_failed(job_id, e, now)))
        else:
            self._inbox.put_nowait(_Done(lambda now: core.synthesis_done(job_id, pcm, now)))

    async def _teardown(self) -> None:
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
