"""The engine-side Stage 0 runner: our session core drives vLLM-Omni's real orchestrator through
``OmniStage0Port`` over fake stage engines whose Stage 0 is played by the simulator (CPU, no weights)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm_omni") is None,
    reason="vllm_omni is not installed (create an omni venv with scripts/install_omni_cpu.sh)",
)


@pytest.fixture(scope="module")
def engine():
    from .omni_fake_engine import ApiLoop, build_fake_engine, simulator_respond, voicechat_plugin

    plugin = voicechat_plugin()
    respond = simulator_respond()
    built = build_fake_engine(plugin, max_sessions=4, respond=respond, audio_delay_s=0.004)
    built.plugin, built.respond, built.api = plugin, respond, ApiLoop()
    yield built
    built.api.close()


def port_for(engine, **kw):
    from vllm_omni_voicechat.omni.port import OmniStage0Port

    return OmniStage0Port(engine.omni, engine.api.loop, engine.plugin.bus, **kw)


def session(engine, audio_lag: int = 0, **config):
    from vllm_omni_voicechat.model.port import SessionPrompt
    from vllm_omni_voicechat.session.commands import Configure
    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver

    config.setdefault("session_id", "S")
    config.setdefault("settlement_blank_frames", 3)
    driver = SyncDriver(SessionCore(SessionConfig(**config)), port_for(engine, audio_lag=audio_lag))
    driver.send(Configure(SessionPrompt("Be brief.")))
    return driver


def test_a_client_turn_runs_through_the_real_orchestrator_one_submit_per_position(engine):
    from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
    from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, StartTurn, Stop
    from vllm_omni_voicechat.session.events import AudioDelta, PositionMetrics, TextDone

    before = len(engine.clients[0].requests)
    d = session(engine)
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("hello")))
    d.send(CommitTurn(1, "c1"))
    d.run()
    texts = [e.text for e in d.events if isinstance(e, TextDone)]
    audio = b"".join(e.pcm for e in d.events if isinstance(e, AudioDelta))
    assert texts == ["You said: hello."]
    assert decode_speech(audio, 22_050) == "You said: hello."
    positions = [e for e in d.events if isinstance(e, PositionMetrics) and e.frame is not None]
    requests = engine.clients[0].requests[before:]
    assert len(requests) == len(positions)  # one Stage-0 submit per model position
    assert [r.model_intermediate_buffer["duplex"]["vc"]["position"] for r in requests] == list(range(len(requests)))
    assert len({r.request_id for r in requests}) == 1 and all(r.resumable for r in requests)
    # the settlement's fused EOU control reached Stage 0 through the envelope
    assert any(r.model_intermediate_buffer["duplex"]["vc"]["eou_at_fence"] == 3 for r in requests)
    d.send(Stop("stop"))
    d.run()
    d.model.abort()  # what the asyncio shell does when a session ends
    stage0_id = requests[0].request_id
    from .omni_fake_engine import wait_until

    wait_until(lambda: stage0_id in engine.clients[0].aborted and not engine.orchestrator.request_states)
    assert len(engine.plugin.bus) == 0


def test_two_sessions_share_the_engine_with_their_own_requests(engine):
    from vllm_omni_voicechat.audio.speech import render_speech
    from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, StartTurn
    from vllm_omni_voicechat.session.events import TextDone

    a, b = session(engine, session_id="A"), session(engine, session_id="B")
    for d, word in ((a, "one"), (b, "two")):
        d.send(StartTurn(1, "s1"))
        d.send(AppendAudio(render_speech(word)))
        d.send(CommitTurn(1, "c1"))
    a.run()
    b.run()
    assert [e.text for e in a.events if isinstance(e, TextDone)] == ["You said: one."]
    assert [e.text for e in b.events if isinstance(e, TextDone)] == ["You said: two."]
    assert a.model.handle.session_id != b.model.handle.session_id
    a.model.abort()
    b.model.abort()


def test_a_thinker_without_voicechat_evidence_is_a_model_error():
    from vllm_omni_voicechat.model.port import ModelError, PositionInput, SessionPrompt
    from vllm_omni_voicechat.omni.port import OmniStage0Port

    from .omni_fake_engine import ApiLoop, build_fake_engine, constant_response, voicechat_plugin

    plugin = voicechat_plugin()
    built = build_fake_engine(plugin, respond=constant_response)  # vLLM-Omni's thinker: a token, no evidence
    api = ApiLoop()
    try:
        port = OmniStage0Port(built.omni, api.loop, plugin.bus, step_timeout_s=10)
        port.prefill(SessionPrompt("Be brief."))
        with pytest.raises(ModelError, match="no voicechat evidence"):
            port.step(PositionInput(bytes(2560)))
        port.abort()
        with pytest.raises(ModelError, match="no open session"):
            port.step(PositionInput(bytes(2560)))
        # the failing session took nothing else down: the orchestrator still admits and runs sessions
        assert built.thread.is_alive()
        again = OmniStage0Port(built.omni, api.loop, plugin.bus, step_timeout_s=10)
        again.prefill(SessionPrompt("Be brief."))
        with pytest.raises(ModelError, match="no voicechat evidence"):
            again.step(PositionInput(bytes(2560)))
        again.abort()
    finally:
        api.close()


class _SlowOmni:
    """An engine whose open never answers in time: records what the port does with the pending open."""

    def __init__(self) -> None:
        import asyncio

        self.opened = asyncio.Event()
        self.cancelled = False
        self.timeouts: list[float] = []

    async def open_session(self, config, *, timeout=None):
        import asyncio

        self.timeouts.append(timeout)
        try:
            await asyncio.sleep(3600)  # ok: an open that never answers (cancelled by the port)
        except asyncio.CancelledError:
            self.cancelled = True  # vLLM-Omni's open_session sends its compensating close here
            raise


def test_an_open_that_outlives_the_port_s_wait_is_cancelled_not_orphaned(engine, monkeypatch):
    """A timed-out open used to keep running on the API loop (the port's wait was shorter than vLLM-Omni's own
    control timeout and never cancelled it): a late admission then held a session slot forever."""
    from vllm_omni_voicechat.model.port import ModelError, SessionPrompt
    from vllm_omni_voicechat.omni import port as port_module
    from vllm_omni_voicechat.omni.port import OmniStage0Port

    from .omni_fake_engine import wait_until

    assert port_module.CONTROL_TIMEOUT_S >= 10.0  # vLLM-Omni's own control timeout (duplex_omni.py)
    monkeypatch.setattr(port_module, "CONTROL_TIMEOUT_S", 0.05)
    monkeypatch.setattr(port_module, "CONTROL_GRACE_S", 0.05)
    slow = _SlowOmni()
    port = OmniStage0Port(slow, engine.api.loop, engine.plugin.bus, step_timeout_s=0.01)
    with pytest.raises(ModelError, match="refused the session"):
        port.prefill(SessionPrompt("Be brief."))
    assert slow.timeouts == [0.05]  # the RPC got its own timeout, shorter than the port's wait (0.1 s)
    wait_until(lambda: slow.cancelled)
    assert port.handle is None and len(engine.plugin.bus) == 0


def test_with_an_audio_lag_the_response_ends_on_its_last_packet_and_keeps_all_its_audio(engine):
    """At lag L step N returns the audio of N - L: the response ends L positions after its tokens did (on the
    packet of its acoustic terminal), so its audio is L primed/earlier packets + all of the lag-0 response's."""
    from vllm_omni_voicechat.audio.frames import SILENT_OUTPUT_FRAME
    from vllm_omni_voicechat.audio.speech import render_speech
    from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, StartTurn
    from vllm_omni_voicechat.session.events import AudioDelta, PositionMetrics, ResponseDone, TextDone

    runs = {}
    for lag in (0, 2):
        d = session(engine, audio_lag=lag, session_id=f"lag{lag}")
        d.send(StartTurn(1, "s1"))
        d.send(AppendAudio(render_speech("hello")))
        d.send(CommitTurn(1, "c1"))
        d.run()
        d.model.abort()
        done = [e for e in d.events if isinstance(e, ResponseDone)]
        positions = [e for e in d.events if isinstance(e, PositionMetrics) and e.response_id is not None]
        runs[lag] = (b"".join(e.pcm for e in d.events if isinstance(e, AudioDelta)),
                     [e.text for e in d.events if isinstance(e, TextDone)], [e.status for e in done], len(positions))
    (audio0, text0, status0, n0), (audio2, text2, status2, n2) = runs[0], runs[2]
    assert text0 == text2 == ["You said: hello."] and status0 == status2 == ["completed"]
    assert n2 == n0 + 2  # the response stayed open two positions longer: its last packets were delivered
    assert audio2 == 2 * SILENT_OUTPUT_FRAME + audio0


class _EndingHandle:
    """A session the engine closes by itself (a dead stage's request cleanup, the engine's shutdown): its events end,
    and its error never reaches the handle."""

    session_id = "duplex-ending"

    def __init__(self) -> None:
        import asyncio

        self.ended = asyncio.Event()
        self.closed = False
        self.close_reason = None

    async def events(self):
        await self.ended.wait()
        self.closed, self.close_reason = True, "request_cleanup"
        return
        yield  # an async generator

    async def submit(self, command) -> None:
        pass

    async def close(self, *, reason, timeout=None) -> None:
        pass


class _EndingOmni:
    def __init__(self) -> None:
        self.handle = _EndingHandle()

    async def open_session(self, config, *, timeout=None):
        return self.handle


def test_a_session_the_engine_ends_fails_its_position_at_once_not_at_the_step_timeout(engine):
    """A killed stage: vLLM-Omni evicts the replica and closes the session (its request-scoped error is dropped as
    "unknown req"), so the position used to wait out the whole step timeout (30 s deployed)."""
    import time

    from vllm_omni_voicechat.model.port import ModelError, ModelTimeout, PositionInput, SessionPrompt

    omni = _EndingOmni()
    port = port_for(engine, step_timeout_s=30.0)
    port.omni = omni
    port.prefill(SessionPrompt("Be brief."))
    engine.api.loop.call_soon_threadsafe(lambda: engine.api.loop.call_later(0.2, omni.handle.ended.set))
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"position 0: vLLM-Omni ended the session \(request_cleanup\)") as caught:
        port.step(PositionInput(bytes(2560)))
    assert time.monotonic() - started < 5.0 and not isinstance(caught.value, ModelTimeout)
    port.abort()
    assert len(engine.plugin.bus) == 0


def test_a_position_without_an_answer_is_a_model_timeout(engine):
    from vllm_omni_voicechat.model.port import ModelTimeout, PositionInput, SessionPrompt

    omni = _EndingOmni()  # never ended: nothing ever answers
    port = port_for(engine, step_timeout_s=0.2)
    port.omni = omni
    port.prefill(SessionPrompt("Be brief."))
    with pytest.raises(ModelTimeout, match=r"position 0: no Stage-0 output within 0.2 s"):
        port.step(PositionInput(bytes(2560)))
    port.abort()
    engine.api.loop.call_soon_threadsafe(omni.handle.ended.set)  # let the port's watcher finish


def test_a_batched_position_says_how_many_positions_its_tick_released_together(engine):
    """The tick's stamp reaches the position's timings: ``batched_with`` (what the session core's settlement wait reads,
    ``settlement_await_s``), the hold and the lateness, beside the telemetry."""
    import asyncio

    from vllm_omni_voicechat.audio.speech import render_speech
    from vllm_omni_voicechat.model.port import SessionPrompt
    from vllm_omni_voicechat.omni.batching import TickStamp
    from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, StartTurn
    from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
    from vllm_omni_voicechat.shell.sync import SyncDriver

    class ThreeOthers:
        """A tick that releases each position at once, as if three other sessions' positions went with it."""

        def enter(self, key):
            pass

        def leave(self, key):
            pass

        def submit(self, key, ready, submit, *, arrived=None):
            stamp = TickStamp(tick=7, size=4, held_ms=1.5, late_ms=0.25)
            asyncio.run_coroutine_threadsafe(submit(stamp), engine.api.loop).result(30)
            return stamp

    class Recording:
        def __init__(self, port):
            self.port, self.results = port, []

        def step(self, position):
            result = self.port.step(position)
            self.results.append(result)
            return result

        def __getattr__(self, name):
            return getattr(self.port, name)

    model = Recording(port_for(engine, batcher=ThreeOthers()))
    d = SyncDriver(SessionCore(SessionConfig(session_id="T", settlement_blank_frames=3)), model)
    d.send(Configure(SessionPrompt("Be brief.")))
    d.send(StartTurn(1, "s1"))
    d.send(AppendAudio(render_speech("hi")))
    d.send(CommitTurn(1, "c1"))
    d.run()
    assert model.results
    assert {(r.timings.batched_with, r.timings.held_ms, r.timings.late_ms) for r in model.results} == {(4, 1.5, 0.25)}
    assert {(r.telemetry["tick"], r.telemetry["tick_size"]) for r in model.results} == {(7, 4)}
    model.port.abort()
