"""The asyncio shell: the model runs off the event loop, commands are ordered with positions, teardown is clean."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
import time

import pytest

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, StartTurn, Stop
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore, Tick
from vllm_omni_voicechat.session.events import NativeEvent, ResponseDone, SessionClosed, SessionConfigured
from vllm_omni_voicechat.shell.aio import SessionShell
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

from .helpers import names


class Recorder:
    """A sink that lets a test await the first event of a type (no sleeps)."""

    def __init__(self) -> None:
        self.events: list[NativeEvent] = []
        self._waiters: list[tuple[type, asyncio.Future]] = []

    def __call__(self, event: NativeEvent) -> None:
        self.events.append(event)
        for kind, fut in list(self._waiters):
            if isinstance(event, kind) and not fut.done():
                fut.set_result(event)

    async def wait_for(self, kind: type, timeout: float = 10.0) -> NativeEvent:
        for e in self.events:
            if isinstance(e, kind):
                return e
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((kind, fut))
        return await asyncio.wait_for(fut, timeout)


class WireStub:
    """A wire session reduced to what the shell drives: it records what it read."""

    closed = False

    def __init__(self, tally=None) -> None:
        self.tally = tally
        self.read: list[tuple[str, float]] = []
        self.arrived: list[float | None] = []

    def poll(self, now):
        return Tick([])

    def receive(self, message, now, arrived=None):
        self.read.append((message, now))
        self.arrived.append(arrived)
        return []

    def disconnect(self, now):
        self.closed = True
        return []


class ThreadCheckingModel(SimulatorModel):
    inline_steps = False  # a model whose steps take real time (the engine port)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.threads: set[int] = set()
        self.prefill_threads: set[int] = set()

    def step(self, position):
        self.threads.add(threading.get_ident())
        return super().step(position)

    def prefill(self, prompt):
        self.prefill_threads.add(threading.get_ident())
        return super().prefill(prompt)


class InlineThreadCheckingModel(ThreadCheckingModel):
    inline_steps = True  # microsecond steps (the simulator): no thread hop per position


def test_full_turn_runs_the_model_off_the_event_loop_and_stops_cleanly():
    rec, model, loop_thread = full_turn(ThreadCheckingModel())
    assert loop_thread not in model.threads and len(model.threads) == 1
    assert names(rec.events)[-1] == "SessionClosed"
    assert rec.events[-1] == SessionClosed("completed", "client_stop")


def test_an_inline_model_steps_on_the_loop_and_still_prefills_off_it():
    rec, model, loop_thread = full_turn(InlineThreadCheckingModel())
    assert model.threads == {loop_thread} and loop_thread not in model.prefill_threads
    assert rec.events[-1] == SessionClosed("completed", "client_stop")
    assert SimulatorModel().inline_steps and not SimulatorModel(SimBehaviour(step_delay_s=0.01)).inline_steps


def full_turn(model: ThreadCheckingModel):
    async def main():
        rec = Recorder()
        shell = SessionShell(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)), model, rec,
                             synthesizer=SimulatorSynthesizer())
        task = asyncio.create_task(shell.run())
        shell.submit(Configure(SessionPrompt()))
        await rec.wait_for(SessionConfigured)
        shell.submit(StartTurn(1, "s1"))
        shell.submit(AppendAudio(render_speech("hello")))
        shell.submit(CommitTurn(1, "c1"))
        await rec.wait_for(ResponseDone)
        shell.submit(Stop())
        await asyncio.wait_for(task, 10)
        return rec, model, threading.get_ident()

    return asyncio.run(main())


def test_disconnect_mid_response_aborts_the_model_and_ends_the_task():
    async def main():
        rec = Recorder()
        model = SimulatorModel(SimBehaviour(endless_response=True))
        shell = SessionShell(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=2)), model, rec)
        task = asyncio.create_task(shell.run())
        shell.submit(Configure(SessionPrompt()))
        await rec.wait_for(SessionConfigured)
        shell.submit(StartTurn(1, "s1"))
        shell.submit(CommitTurn(1, "c1"))
        from vllm_omni_voicechat.session.events import TextDelta

        await rec.wait_for(TextDelta)
        shell.disconnect()
        await asyncio.wait_for(task, 10)
        return rec, model, shell

    rec, model, shell = asyncio.run(main())
    assert model.aborted
    assert shell.core.closed
    assert "SessionClosed" not in names(rec.events)  # silent teardown


def test_cancelling_the_shell_task_tears_down_the_session():
    async def main():
        rec = Recorder()
        model = SimulatorModel()
        shell = SessionShell(SessionCore(SessionConfig(session_id="S")), model, rec)
        task = asyncio.create_task(shell.run())
        shell.submit(Configure(SessionPrompt()))
        await rec.wait_for(SessionConfigured)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return shell

    shell = asyncio.run(main())
    assert shell.core.closed


class OneCallAtATimeModel(SimulatorModel):
    """Records every port call as (name, thread, start, end) and flags two calls at once; its prefill blocks until
    the test releases it."""

    inline_steps = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[str, int]] = []
        self.overlaps = 0
        self._active = 0
        self._lock = threading.Lock()
        self.release_prefill = threading.Event()
        self.prefill_started = threading.Event()

    def _call(self, name, fn, *args):
        with self._lock:
            self._active += 1
            self.overlaps += self._active > 1
            self.calls.append((name, threading.get_ident()))
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._active -= 1

    def prefill(self, prompt):
        def slow(p):
            self.prefill_started.set()
            assert self.release_prefill.wait(10)
            return SimulatorModel.prefill(self, p)

        return self._call("prefill", slow, prompt)

    def step(self, position):
        return self._call("step", super().step, position)

    def abort(self):
        return self._call("abort", super().abort)


def test_sessions_share_one_pool_thread_for_prefill_and_abort_and_step_on_the_loop():
    """Two inline-step sessions given one shared one-thread pool (the server's: no thread per session):
    both prefill and abort on that one thread, step on the loop, and no call of a model overlaps another."""
    import concurrent.futures

    async def main():
        pool = concurrent.futures.ThreadPoolExecutor(1)
        models = [OneCallAtATimeModel(), OneCallAtATimeModel()]
        recs = [Recorder(), Recorder()]
        shells = [SessionShell(SessionCore(SessionConfig(session_id=f"S{i}", settlement_blank_frames=3)), m, r,
                               executor=pool) for i, (m, r) in enumerate(zip(models, recs, strict=True))]
        tasks = [asyncio.create_task(s.run()) for s in shells]
        for model, shell, rec in zip(models, shells, recs, strict=True):
            model.release_prefill.set()
            shell.submit(Configure(SessionPrompt()))
            await rec.wait_for(SessionConfigured)
            shell.submit(StartTurn(1, "s1"))
            shell.submit(AppendAudio(render_speech("hello")))
            shell.submit(CommitTurn(1, "c1"))
        for shell, rec in zip(shells, recs, strict=True):
            await rec.wait_for(ResponseDone)
            shell.submit(Stop())
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        pool.shutdown()
        return models, threading.get_ident()

    models, loop_thread = asyncio.run(main())
    for model in models:
        calls = [c[0] for c in model.calls]
        assert calls[0] == "prefill" and calls[-1] == "abort" and "step" in calls and model.overlaps == 0
        assert {t for n, t in model.calls if n == "step"} == {loop_thread}
    pool_threads = {t for m in models for n, t in m.calls if n != "step"}
    assert len(pool_threads) == 1 and loop_thread not in pool_threads


def test_a_prefill_cut_short_by_a_disconnect_still_returns_before_the_abort_runs():
    """The client leaves while the prefill runs in the pool: teardown cancels the prefill's waiter, and the abort
    waits for the prefill call itself to return (a port's calls come one at a time), then the task ends."""
    import concurrent.futures

    async def main():
        pool = concurrent.futures.ThreadPoolExecutor(2)
        model = OneCallAtATimeModel()
        shell = SessionShell(SessionCore(SessionConfig(session_id="S")), model, Recorder(), executor=pool)
        task = asyncio.create_task(shell.run())
        shell.submit(Configure(SessionPrompt()))
        await asyncio.get_running_loop().run_in_executor(None, model.prefill_started.wait, 10)
        shell.disconnect()
        # ok: a deliberate delay: the prefill must still be running when the abort is asked for
        asyncio.get_running_loop().call_later(0.2, model.release_prefill.set)  # ok: still running at the next call
        await asyncio.wait_for(task, 10)
        pool.shutdown()
        return model

    model = asyncio.run(main())
    assert [c[0] for c in model.calls] == ["prefill", "abort"] and model.overlaps == 0 and model.aborted


def test_a_model_call_whose_waiter_is_cancelled_still_returns_before_the_next_call_starts():
    """The shell's one-call-at-a-time rule holds even when the coroutine waiting on a call is cancelled (its thread
    cannot be): the next call waits for the stray one."""
    import concurrent.futures

    async def main():
        pool = concurrent.futures.ThreadPoolExecutor(2)
        model = OneCallAtATimeModel()
        shell = SessionShell(SessionCore(SessionConfig(session_id="S")), model, Recorder(), executor=pool)
        waiter = asyncio.create_task(shell._model_call(model.prefill, SessionPrompt()))
        await asyncio.get_running_loop().run_in_executor(None, model.prefill_started.wait, 10)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        asyncio.get_running_loop().call_later(0.2, model.release_prefill.set)  # ok: still running at the next call
        await asyncio.wait_for(shell._model_call(model.abort), 10)
        pool.shutdown()
        return model

    model = asyncio.run(main())
    assert [c[0] for c in model.calls] == ["prefill", "abort"] and model.overlaps == 0


def test_the_inbox_wait_ends_at_an_item_or_its_deadline_and_leaves_no_waiter():
    from vllm_omni_voicechat.shell.aio import _Inbox

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inbox = _Inbox()
        assert not await inbox.wait(loop.time() + 0.01)  # the deadline passes: nothing queued
        assert inbox._waiter is None
        loop.call_soon(inbox.put_nowait, "a")
        assert await inbox.wait(None) and inbox.get_nowait() == "a" and inbox.empty()
        inbox.put_nowait("b")
        assert await inbox.wait(loop.time() - 1.0)  # an item already queued wins over a past deadline
        assert inbox.get_nowait() == "b"
        waiting = asyncio.ensure_future(inbox.wait(None))
        await asyncio.sleep(0)  # ok: one loop turn, so the wait starts
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert inbox._waiter is None
        inbox.put_nowait("c")  # no waiter left to wake: queued for the next wait
        assert await inbox.wait(None) and inbox.get_nowait() == "c"

    asyncio.run(scenario())


def test_the_inbox_timer_outlives_a_wait_and_moves_on_to_a_later_deadline():
    from vllm_omni_voicechat.shell.aio import _Inbox

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inbox = _Inbox()
        first = loop.time() + 3600.0
        waiting = asyncio.ensure_future(inbox.wait(first))
        await asyncio.sleep(0)  # ok: one loop turn, so the wait starts
        inbox.put_nowait("a")  # an item ends the wait: its timer stays armed
        assert await waiting and inbox.get_nowait() == "a"
        armed = inbox._timer
        assert armed is not None and inbox._timer_at == first
        later = first + 60.0
        waiting = asyncio.ensure_future(inbox.wait(later))
        await asyncio.sleep(0)  # ok: one loop turn, so the wait starts
        assert inbox._timer is armed  # a later deadline keeps the armed timer
        inbox._expire(loop)  # the armed timer fires, before this wait's deadline
        await asyncio.sleep(0)  # ok: one loop turn, in which an ended wait would return
        assert not waiting.done() and inbox._timer_at == later  # moved on to the wait's own deadline
        inbox.put_nowait("b")
        assert await waiting and inbox.get_nowait() == "b"
        earlier = loop.time() + 1800.0
        waiting = asyncio.ensure_future(inbox.wait(earlier))
        await asyncio.sleep(0)  # ok: one loop turn, so the wait starts
        assert inbox._timer_at == earlier  # an earlier deadline re-arms
        inbox.put_nowait("c")
        assert await waiting and inbox.get_nowait() == "c"
        timer = inbox._timer
        inbox.close()
        assert inbox._timer is None and timer is not None and timer.cancelled()

    asyncio.run(scenario())


def test_the_inbox_deadline_ends_a_wait_no_earlier_than_the_timers_resolution():
    from vllm_omni_voicechat.shell.aio import EARLY_WAKE_S, _Inbox

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inbox = _Inbox()
        assert not await inbox.wait(loop.time() + 0.001)
        later = loop.time() + 0.02
        assert not await inbox.wait(later)
        assert loop.time() >= later - EARLY_WAKE_S and inbox._timer is None

    asyncio.run(scenario())


def test_a_deadline_on_the_shells_clock_is_never_woken_early_on_uvloop():
    """uvloop's timers keep whole milliseconds: the inbox arms its timer late enough that the wait ends at or after
    the deadline by the precise clock, so a paced position finds itself due at its first wake-up."""
    uvloop = pytest.importorskip("uvloop")
    from vllm_omni_voicechat.shell.aio import _Inbox

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        inbox = _Inbox()
        early: list[float] = []
        for i in range(40):
            due = time.monotonic() + 0.002 + i * 0.00037  # deadlines at every offset within a millisecond
            while True:  # the loop's clock against the precise one, read within 0.1 ms (no preemption between)
                before, at, after = time.monotonic(), loop.time(), time.monotonic()
                if after - before < 0.0001:
                    break
            assert not await inbox.wait(at + (due - after))  # the shell's own mapping (SessionShell._loop_deadline)
            woke = time.monotonic()
            if woke < due:
                early.append(due - woke)
        return early

    assert uvloop.run(scenario()) == []


def backlogs(slice_s: float, step_s: float) -> list[str]:
    """Two sessions with a 12-frame backlog each, queued before either runs; the order their inline positions ran
    in. Each step advances the shells' clock by ``step_s``."""
    from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES

    order: list[str] = []
    now = [100.0]

    class Named(SimulatorModel):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def step(self, position):
            order.append(self.name)
            now[0] += step_s
            return super().step(position)

    async def main():
        shells, recs, tasks = [], [], []
        for name in "AB":
            rec = Recorder()
            shell = SessionShell(SessionCore(SessionConfig(session_id=name, settlement_blank_frames=3)), Named(name),
                                 rec, clock=lambda: now[0], backlog_slice_s=slice_s)
            assert shell._inline_steps
            shells.append(shell)
            recs.append(rec)
            tasks.append(asyncio.create_task(shell.run()))
            shell.submit(Configure(SessionPrompt()))
        for rec in recs:
            await rec.wait_for(SessionConfigured)
        for shell in shells:  # both backlogs queued before either runs
            shell.submit(StartTurn(1, "s1"))
            shell.submit(AppendAudio(bytes(INPUT_FRAME_BYTES * 12)))
        while order.count("A") < 12 or order.count("B") < 12:
            await asyncio.sleep(0)  # ok: the loop turns the test is about
        for shell in shells:
            shell.submit(Stop())
        await asyncio.wait_for(asyncio.gather(*tasks), 10)

    asyncio.run(main())
    return order


def runs(order: list[str]) -> list[tuple[str, int]]:
    return [(k, len(list(g))) for k, g in itertools.groupby(order)]


def test_sessions_with_positions_back_to_back_take_turns_on_the_loop():
    """Inline steps: a session whose backlog has held the loop for its slice yields before the next position, so
    two such sessions interleave instead of one running its whole backlog first. Slice 0: a yield a position."""
    assert runs(backlogs(0.0, 0.001)[:24]) == [("A", 1), ("B", 1)] * 12


def test_a_backlog_runs_back_to_back_for_its_slice_before_it_yields():
    """A yield costs a position a whole turn of a busy loop, so a backlog runs without one until its slice (here 2.5
    steps' time) is spent: three positions a turn, never more."""
    assert runs(backlogs(0.0025, 0.001)[:24]) == [("A", 3), ("B", 3)] * 4
    assert runs(backlogs(0.0025, 0.0)[:24]) == [("A", 12), ("B", 12)]  # steps that take no time never yield


def test_a_client_message_read_40_ms_or_more_after_it_arrived_is_counted_late():
    """Loop lag: the shell stamps each offered message and counts one read half a frame after it arrived, in its
    own counter and in the session's tally (``/v1/usage`` ``late_inbox_messages``)."""
    from vllm_omni_voicechat.ops.tally import SessionTally

    async def main():
        now = [0.5]
        wire = WireStub(SessionTally("v3", 0.0))
        shell = SessionShell(wire, SimulatorModel(), lambda e: None, clock=lambda: now[0])
        task = asyncio.create_task(shell.run())

        async def read(message: str, waited: float) -> None:
            # The loop is woken for something else first, so the message waits in the inbox (one offered while the
            # loop waits with nothing queued is handled in the offering call: never late).
            shell.wake()
            assert shell.offer_nowait(message)
            now[0] += waited  # the loop gets to the session this much later
            while not wire.read or wire.read[-1][0] != message:
                await asyncio.sleep(0)  # ok: the loop turns the test is about

        await read("a", 0.039)
        assert (shell.late_messages, wire.tally.late_inbox) == (0, 0)
        await read("b", 0.0405)
        assert (shell.late_messages, wire.tally.late_inbox) == (1, 1)
        assert wire.tally.summary()["late_inbox_messages"] == 1
        await read("c", 0.0)
        assert shell.late_messages == 1
        # each message is handed over with when it was read: its audio was ready from then
        assert wire.read == [("a", 0.539), ("b", pytest.approx(0.5795)), ("c", pytest.approx(0.5795))]
        assert wire.arrived == [0.5, 0.539, pytest.approx(0.5795)]
        shell.disconnect()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


def floods(slice_s: float, handle_s: float) -> list[str]:
    """Two sessions with 12 client frames each in their inboxes, offered before either runs; the order the frames
    were handled in. Each frame advances the shells' clock by ``handle_s``."""
    order: list[str] = []
    now = [100.0]

    class Named(WireStub):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def receive(self, message, now_, arrived=None):
            order.append(self.name)
            now[0] += handle_s
            return super().receive(message, now_)

    async def main():
        shells = [SessionShell(Named(name), SimulatorModel(), lambda e: None, clock=lambda: now[0],
                               backlog_slice_s=slice_s) for name in "AB"]
        for shell in shells:
            for k in range(12):
                assert shell.offer_nowait(f"m{k}")
        tasks = [asyncio.create_task(shell.run()) for shell in shells]
        while len(order) < 24:
            await asyncio.sleep(0)  # ok: the loop turns the test is about
        for shell in shells:
            shell.disconnect()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)

    asyncio.run(main())
    return order


def test_a_flooding_client_holds_the_loop_for_a_slice_then_takes_turns():
    """Client frames back to back share the inline positions' slice: a session whose inbox is full yields once it
    has held the loop for its slice, so a flood costs the other sessions at most a slice a turn."""
    assert runs(floods(0.0025, 0.001)) == [("A", 3), ("B", 3)] * 4
    assert runs(floods(0.0, 0.001)) == [("A", 1), ("B", 1)] * 12
    assert runs(floods(0.0025, 0.0)) == [("A", 12), ("B", 12)]  # frames that take no time never yield


def test_typed_requests_replaced_as_fast_as_they_come_run_one_synthesis_at_a_time():
    """A client replacing its typed request before the model was touched: a synthesis not started for a replaced
    job never runs, so the shared executor holds at most one of this session's syntheses (30,000 requests queued
    30,000 of them before)."""
    from vllm_omni_voicechat.session.commands import RequestTypedInput
    from vllm_omni_voicechat.session.events import TypedInjectionStarted

    class HeldSynthesizer(SimulatorSynthesizer):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []
            self.release = threading.Event()
            self.running = 0
            self.most_running = 0

        def synthesize(self, text):
            self.texts.append(text)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.release.wait(10)
            self.running -= 1
            return super().synthesize(text)

    async def main():
        rec, synth = Recorder(), HeldSynthesizer()
        shell = SessionShell(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)), SimulatorModel(),
                             rec, synthesizer=synth)
        task = asyncio.create_task(shell.run())
        shell.submit(Configure(SessionPrompt()))
        await rec.wait_for(SessionConfigured)
        for k in range(50):
            shell.submit(RequestTypedInput(f"j{k}", f"text {k}"))
        await shell.settled()
        synth.release.set()
        started = await rec.wait_for(TypedInjectionStarted)
        shell.submit(Stop())
        await asyncio.wait_for(task, 10)
        return started, synth

    started, synth = asyncio.run(main())
    assert started.job_id == "j49"
    # The one running when the rest came (which one depends on when the loop let the synthesis start), then the last.
    assert synth.texts[-1] == "text 49" and len(synth.texts) <= 2 and synth.most_running == 1


LOUD = bytes([0x00, 0x40] * (INPUT_FRAME_BYTES // 2))


def v3_append(pcm: bytes, event_id: str) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "event_id": event_id, "encoding": "pcm16",
                       "sample_rate": 16000, "channels": 1, "audio": base64.b64encode(pcm).decode()})


def v3_turn_start(event_id: str) -> str:
    return json.dumps({"type": "input_audio_buffer.turn_start", "event_id": event_id, "client_turn_id": 1})


async def configured_v3_shell(now: list[float], out: list, model: SimulatorModel | None = None,
                              **kw) -> tuple[SessionShell, V3Session, asyncio.Task]:
    """A v3 session on the shell, configured, with its loop waiting for the client (nothing queued)."""
    session = V3Session(SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3)), V3Options())
    shell = SessionShell(session, model or SimulatorModel(SimBehaviour(tail_positions=0)), out.append,
                         synthesizer=SimulatorSynthesizer(), clock=lambda: now[0], **kw)
    out.extend(session.start(now[0]))
    task = asyncio.create_task(shell.run())
    assert shell.offer_nowait(json.dumps({"type": "session.update", "event_id": "u",
                                          "session": {"protocol_version": 3}}))
    while not (session.core.configured and shell._inbox.parked):
        await asyncio.sleep(0)  # ok: the prefill runs in the executor; the awaited condition is the loop's wait
    return shell, session, task


def wire_types(out: list) -> list[tuple[str, int | None]]:
    return [(e["type"], e.get("transport_frame")) for e in (json.loads(o.text) for o in out)]


def test_a_frame_offered_while_the_loop_waits_is_handled_in_the_offering_call():
    """No wake-up, no turn of the event loop: the frame is read, its position runs and its events reach the sink
    before ``offer_nowait`` returns; nothing is queued, so nothing is late."""

    async def main():
        out: list = []
        shell, session, task = await configured_v3_shell([10.0], out)
        del out[:]
        assert shell.offer_nowait(v3_turn_start("s1"))
        assert wire_types(out) == [("input_audio_buffer.speech_started", None),
                                   ("input_audio_buffer.turn_started", None)]
        for k in range(3):
            del out[:]
            assert shell.offer_nowait(v3_append(LOUD, f"a{k}"))
            assert wire_types(out) == [("voicechat.metrics", k)]
        assert (shell.inbox_messages, shell.positions, shell.late_messages) == (0, 3, 0)
        shell.disconnect()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_frames_handled_in_the_offering_calls_share_a_slice_then_wait_for_the_loop_in_order():
    """A burst read in one turn of the event loop (a flood in one socket read) is handled in the offering calls only
    until their work has held the loop for a slice; the rest waits in the inbox, counted against its bounds, and the
    loop hands it over in order in its turns."""
    now = [10.0]

    class Slow(SimulatorModel):
        def step(self, position):
            now[0] += 0.001  # each position takes a millisecond of the shell's clock
            return super().step(position)

    async def main():
        out: list = []
        shell, session, task = await configured_v3_shell(now, out, Slow(SimBehaviour(tail_positions=0)),
                                                         backlog_slice_s=0.0025)
        assert shell.offer_nowait(v3_turn_start("s1"))
        del out[:]
        queued = []
        for k in range(6):
            assert shell.offer_nowait(v3_append(LOUD, f"a{k}"))
            queued.append(shell.inbox_messages)
        assert queued == [0, 0, 0, 1, 2, 3]  # three positions within the slice (2.5 ms), then the inbox
        assert wire_types(out) == [("voicechat.metrics", k) for k in range(3)]
        while len(out) < 6:
            await asyncio.sleep(0)  # ok: the loop turns the test is about
        assert wire_types(out) == [("voicechat.metrics", k) for k in range(6)]
        assert shell.inbox_messages == 0
        await asyncio.sleep(0)  # ok: a new turn of the event loop, so a new slice
        del out[:]
        assert shell.offer_nowait(v3_append(LOUD, "a6")) and shell.inbox_messages == 0
        assert wire_types(out) == [("voicechat.metrics", 6)]
        shell.disconnect()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_a_frame_handled_in_the_offering_call_moves_the_loops_deadline():
    """The wire session's next deadline after a frame handled in the offering call becomes the waiting loop's: the
    loop polls again when it comes."""

    class Deadlines(WireStub):
        def __init__(self) -> None:
            super().__init__()
            self.polls: list[float] = []
            self.wake_at: float | None = None

        def poll(self, now):
            self.polls.append(now)
            return Tick([], None, self.wake_at)

        def receive(self, message, now, arrived=None):
            self.wake_at = now + 0.01  # e.g. a response's silence position is due 10 ms from now
            return super().receive(message, now, arrived)

    async def main():
        wire = Deadlines()
        shell = SessionShell(wire, SimulatorModel(), lambda e: None)
        task = asyncio.create_task(shell.run())
        while not shell._inbox.parked:
            await asyncio.sleep(0)  # ok: the loop starts waiting (no deadline yet)
        assert shell.offer_nowait("m") and wire.read and len(wire.polls) == 2  # the frame's poll, in the call
        while len(wire.polls) < 3:
            await asyncio.sleep(0.002)  # ok: awaited condition (the loop's timer), bounded by the task's timeout
        assert wire.polls[2] >= wire.read[0][1] + 0.01 - 0.001  # not before the deadline (timers' resolution)
        shell.disconnect()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_an_error_raised_on_a_frame_handled_in_the_offering_call_ends_the_loop_with_it():
    """The offering call (the socket reader) never sees the protocol object's error: the loop raises it, as if it
    had handled the frame itself, and tears the session down."""

    class Broken(WireStub):
        def receive(self, message, now, arrived=None):
            raise RuntimeError("broken")

    async def main():
        shell = SessionShell(Broken(), SimulatorModel(), lambda e: None)
        task = asyncio.create_task(shell.run())
        while not shell._inbox.parked:
            await asyncio.sleep(0)  # ok: the loop starts waiting
        assert shell.offer_nowait("m")
        with pytest.raises(RuntimeError, match="broken"):
            await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_what_the_sink_queues_stops_the_offering_call_and_the_loop_takes_it_before_any_further_position():
    """A sink may queue for the shell as it takes an event (an overflowing outbox disconnects the session, a detach
    wakes it): the offering call stops there, and the loop handles what was queued before any further position, as
    it would have itself. Here a commit's settlement positions would all run in the offering call."""

    class Disconnecting(list):
        shell: SessionShell | None = None  # armed: the first metrics event disconnects

        def append(self, item) -> None:
            super().append(item)
            if self.shell is not None and json.loads(item.text)["type"] == "voicechat.metrics":
                self.shell.disconnect()

    async def main():
        out = Disconnecting()
        shell, session, task = await configured_v3_shell([10.0], out)
        assert shell.offer_nowait(v3_turn_start("s1")) and shell.offer_nowait(v3_append(LOUD, "a0"))
        positions = shell.positions
        del out[:]
        out.shell = shell
        commit = json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1})
        assert shell.offer_nowait(commit)
        assert wire_types(out) == [("voicechat.metrics", None)] and shell.positions == positions + 1
        await asyncio.wait_for(task, 10)
        assert session.core.closed and shell.positions == positions + 1
        assert wire_types(out) == [("voicechat.metrics", None)]  # a disconnect publishes nothing

    asyncio.run(main())


def test_an_effect_made_in_the_offering_call_is_left_to_the_loop_which_runs_it_in_order():
    """A prefill cannot run in the offering call (it runs in the executor, awaited): the outputs that hold it go to
    the loop, which dispatches them in order and publishes what the prefill's completion makes."""

    async def main():
        out: list = []
        shell, session, task = await configured_v3_shell([10.0], out)
        del out[:]
        update = json.dumps({"type": "session.update", "event_id": "u2",
                             "session": {"protocol_version": 3, "instructions": "Be brief."}})
        assert shell.offer_nowait(update)
        assert out == [] and not shell._inbox.empty()  # nothing published yet; the loop is woken for the prefill
        while not out:
            await asyncio.sleep(0.001)  # ok: awaited condition (the prefill runs in the executor)
        assert [(e["type"], e["session"]["instructions"]) for e in (json.loads(o.text) for o in out)] == [
            ("session.updated", "Be brief.")]
        shell.disconnect()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
