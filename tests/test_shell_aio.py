"""The asyncio shell: the model runs off the event loop, commands are ordered with positions, teardown is clean."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, StartTurn, Stop
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import NativeEvent, ResponseDone, SessionClosed, SessionConfigured
from vllm_omni_voicechat.shell.aio import SessionShell
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

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
    inline_steps = True  # microsecond steps (the simulator): no thread hop per position (issue 18)


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
