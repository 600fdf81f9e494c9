"""V3Client function calls and its outbound arbiter: against the real server (simulator model), on a scripted
fake server, and the arbiter's ordering on its own.

Synchronisation is by events only: tool handlers await ``asyncio.Event`` s the test controls, and the test waits
on client state (``wait_for`` / ``wait_until``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from websockets.asyncio.server import serve

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.client import (
    TOOL_TIMEOUT_OUTPUT,
    ArbiterCapacityError,
    WireText,
    OutboundArbiter,
    ProtocolError,
    SessionEnded,
    V3Client,
)
from vllm_omni_voicechat.client.v3 import APPEND_BYTES
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour

from .server_fixture import running_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = 'call get_weather {"city": "Paris"}'
APPLIED = "conversation.item.function_call_output.applied"


def sim_config(**kw) -> ServerConfig:
    return ServerConfig.simulator(
        settlement_blank_frames=3, prefill_delay_s=0.005, behaviour=SimBehaviour(tail_positions=3), **kw
    )


@pytest.fixture(scope="module")
def url():
    with running_server(sim_config()) as base:
        yield f"{base}/v1/realtime"


def run(coro, limit: float = 25):
    """One scenario on a fresh event loop, bounded so a hang fails the test instead of the suite."""
    return asyncio.run(asyncio.wait_for(coro, limit))


async def configured(url: str, **kw) -> V3Client:
    model_output = kw.pop("model_output", False)
    client = await V3Client.connect(url, **kw)
    await client.configure(instructions="Keep answers short.", tools=[WEATHER], model_output=model_output)
    return client


async def spoken(client: V3Client, k: int, text: str) -> str:
    await client.start_turn(k)
    await client.send_audio(render_speech(text), paced=False)
    return await client.commit(k)


def index(client: V3Client, predicate) -> int:
    return next(i for i, e in enumerate(client.events) if predicate(e))


def sent(client: V3Client, type_: str, **fields):
    """The client events of ``type_`` (whose event has ``fields``), in wire order."""
    return [s for s in client.sent if s.type == type_ and all(s.event.get(k) == v for k, v in fields.items())]


# ==================================================================== against the real server


def test_tool_handler_runs_and_the_result_is_spoken(url):
    seen: list[dict] = []

    async def get_weather(arguments: dict) -> str:
        seen.append(arguments)
        return f"sunny in {arguments['city']}"

    async def scenario():
        async with await configured(url, tools={"get_weather": get_weather}) as client:
            turn_id = await spoken(client, 1, CALL)
            call = await client.wait_for("response.function_call_arguments.done")
            assert (call["turn_id"], call["name"], call["arguments"]) == (turn_id, "get_weather", '{"city":"Paris"}')
            run_ = await client.tool_run_done(call["call_id"])
            assert seen == [{"city": "Paris"}]
            assert (run_.outcome, run_.output, run_.timed_out, run_.error) == ("applied", "sunny in Paris", False, None)
            assert client.function_epoch is None
            # the result went out exactly once, as a function_call_output for this call
            (result,) = sent(client, "conversation.item.create")
            assert result.event["item"] == {
                "type": "function_call_output", "call_id": call["call_id"], "output": "sunny in Paris"
            }
            assert result.after > client.events.index(call)
            response = await client.response_done(call["response_id"])
            assert response.turn_id == turn_id
            assert (response.status, response.text) == ("completed", "The result is sunny in Paris.")
            assert decode_speech(bytes(response.audio), 22_050) == response.text
            assert client.turns[turn_id].transcript == CALL

    run(scenario())


def test_tool_handler_model_output_is_sent_when_negotiated(url):
    async def get_weather(arguments: dict) -> tuple[str, str]:
        return json.dumps({"city": arguments["city"], "sky": "clear", "celsius": 21}), "clear and 21 degrees"

    async def scenario():
        async with await configured(url, tools={"get_weather": get_weather}, model_output=True) as client:
            await spoken(client, 1, CALL)
            call = await client.wait_for("response.function_call_arguments.done")
            run_ = await client.tool_run_done(call["call_id"])
            assert run_.outcome == "applied" and run_.model_output == "clear and 21 degrees"
            (result,) = sent(client, "conversation.item.create")
            assert result.event["item"]["model_output"] == "clear and 21 degrees"
            response = await client.response_done(call["response_id"])
            assert response.text == "The result is clear and 21 degrees."  # the model heard model_output

    run(scenario())


def test_tool_handler_timeout_sends_the_timeout_result(url):
    never = asyncio.Event()
    cancelled: list[bool] = []

    async def get_weather(arguments: dict) -> str:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "unreachable"

    async def scenario():
        async with await configured(url, tools={"get_weather": get_weather}, tool_timeout=0.2) as client:
            await spoken(client, 1, CALL)
            call = await client.wait_for("response.function_call_arguments.done")
            run_ = await client.tool_run_done(call["call_id"])
            assert cancelled == [True] and run_.timed_out
            assert (run_.outcome, run_.output) == ("applied", TOOL_TIMEOUT_OUTPUT)
            outputs = [s.event["item"]["output"] for s in sent(client, "conversation.item.create")]
            assert outputs == [TOOL_TIMEOUT_OUTPUT]  # sent once
            response = await client.response_done(call["response_id"])
            assert (response.status, response.text) == ("completed", f"The result is {TOOL_TIMEOUT_OUTPUT}.")

    run(scenario())


def test_server_tool_timeout_fails_the_call_and_closes_the_epoch():
    """The server gives up first (function_call.failed): the epoch closes, the handler is cancelled and no result
    is ever sent; the typed request and microphone turn held during the epoch are released afterwards, typed
    first.

    Note: the server keeps its cycle open through the post-timeout recovery that follows ``failed`` (it injects
    the timeout error first), so a typed request released on ``failed`` -- as the contract tells clients to do --
    is rejected ``function_cycle_active``; microphone input is deferred server-side and replayed.
    """
    release = asyncio.Event()
    cancelled: list[bool] = []

    async def get_weather(arguments: dict) -> str:
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "too late"

    async def scenario(url):
        async with await configured(url, tools={"get_weather": get_weather}, tool_timeout=10) as client:
            await spoken(client, 1, CALL)
            call = await client.wait_for("response.function_call_arguments.done")
            turn = asyncio.create_task(spoken(client, 2, "Are you still there"))
            typed = asyncio.create_task(client.request_typed("typed-1", "Hello again"))
            await client.wait_until(lambda: [op.kind for op in client.arbiter.pending()] == ["turn_start", "typed"])
            failed = await client.wait_for("response.function_call.failed")
            assert failed["call_id"] == call["call_id"] and failed["reason"] == "function_call_output_timeout"
            run_ = await client.tool_run_done(call["call_id"])
            assert (run_.outcome, run_.output) == ("failed", None) and client.function_epoch is None
            job = await typed
            assert job.accepted or job.reason == "function_cycle_active"  # see the docstring
            second = await turn
            assert cancelled == [True] and not sent(client, "conversation.item.create")
            (request,) = sent(client, "input_text.request")
            (turn_start,) = sent(client, "input_audio_buffer.turn_start", client_turn_id=2)
            failed_at = client.events.index(failed)
            assert request.held and request.after > failed_at and turn_start.held and turn_start.index > request.index
            response = await client.response_done((await client.response_for(second)).response_id)
            assert (client.turns[second].transcript, response.text) == (
                "Are you still there", "You said: Are you still there."
            )
            assert client.responses[call["response_id"]].status in ("completed", "cancelled")

    with running_server(sim_config(function_call_timeout_s=0.5)) as base:
        run(scenario(f"{base}/v1/realtime"))


def test_typed_request_is_admitted_before_a_held_microphone_turn(url):
    """While a function epoch is open a microphone turn (start + audio + commit) and then a typed request are
    queued: nothing of them is sent during the epoch; after ``applied`` the typed request goes first, and the
    microphone turn's ``turn_start`` only after that typed job's ``injection_finished``; both turns are intact."""
    release = asyncio.Event()
    mic_text, typed_text = "Will it rain tomorrow", "What is the weather like?"

    async def get_weather(arguments: dict) -> str:
        await release.wait()
        return "sunny"

    async def scenario():
        async with await configured(url, tools={"get_weather": get_weather}) as client:
            first = await spoken(client, 1, CALL)
            call = await client.wait_for("response.function_call_arguments.done")
            assert client.function_epoch == call["call_id"]

            pcm = render_speech(mic_text)
            appends = -(-len(pcm) // APPEND_BYTES)
            # Tasks run their synchronous prefix in creation order: start, audio, commit, typed are offered in
            # this order while the epoch holds everything.
            start = asyncio.create_task(client.start_turn(2))
            audio = asyncio.create_task(client.send_audio(pcm, paced=False))
            commit = asyncio.create_task(client.commit(2))
            typed = asyncio.create_task(client.request_typed("typed-1", typed_text))
            expected = ["turn_start", *["append"] * appends, "commit", "typed"]
            await client.wait_until(lambda: [op.kind for op in client.arbiter.pending()] == expected)
            assert all(op.held for op in client.arbiter.pending())
            assert client.arbiter.hold_reason() == f"function epoch {call['call_id']}"
            before = len(client.sent)
            assert not sent(client, "input_text.request")
            assert not sent(client, "input_audio_buffer.turn_start", client_turn_id=2)

            release.set()  # the handler returns: result -> applied -> the epoch closes
            job = await typed
            second = await start
            await audio
            assert await commit == second

            applied = index(client, lambda e: e["type"] == APPLIED)
            finished = index(
                client, lambda e: e["type"] == "input_text.injection_finished" and e["job_id"] == "typed-1"
            )
            result = sent(client, "conversation.item.create")[0]
            (request,) = sent(client, "input_text.request")
            (turn_start,) = sent(client, "input_audio_buffer.turn_start", client_turn_id=2)
            (commit2,) = sent(client, "input_audio_buffer.commit", client_turn_id=2)
            mic = [s for s in client.sent[before:] if s.type == "input_audio_buffer.append"]
            # nothing of them during the epoch; the typed request first, right after applied
            assert result.index < request.index < turn_start.index
            assert request.after > applied and request.held
            assert client.sent[request.index - 1] is result
            # the microphone turn only after the typed injection finished, then intact and in order
            assert turn_start.after > finished and turn_start.held
            assert len(mic) == appends and all(turn_start.index < s.index < commit2.index for s in mic)
            assert b"".join(base64.b64decode(s.event["audio"]) for s in mic) == pcm

            # the function response was cut by the typed barge-in (or had finished)
            function_response = client.responses[call["response_id"]]
            await client.response_done(function_response.response_id)
            assert function_response.turn_id == first
            assert "The result is sunny.".startswith(function_response.text)
            if function_response.status == "cancelled":
                assert function_response.reason == "typed_input"
            else:
                assert function_response.status == "completed"

            # the typed turn: full transcript, its response created (maybe cancelled by the microphone turn)
            assert (job.accepted, job.disposition) == (True, "completed")
            typed_turn = client.turns[job.turn_id]
            assert (typed_turn.source, typed_turn.transcript) == ("typed", typed_text)
            typed_response = await client.response_done((await client.response_for(job.turn_id)).response_id)
            assert f"You said: {typed_text}.".startswith(typed_response.text)
            if typed_response.status == "cancelled":
                assert typed_response.reason == "client_vad"
            else:
                assert typed_response.status == "completed"

            # the microphone turn: full transcript and a complete response
            mic_turn = client.turns[second]
            assert (mic_turn.source, mic_turn.client_turn_id, mic_turn.transcript) == ("microphone", 2, mic_text)
            mic_response = await client.response_done((await client.response_for(second)).response_id)
            assert (mic_response.status, mic_response.text) == ("completed", f"You said: {mic_text}.")
            assert client.failure is None and not client.errors

    run(scenario())


def test_a_typed_job_holds_microphone_turns_until_it_finishes(url):
    async def scenario():
        async with await configured(url) as client:
            typed = asyncio.create_task(client.request_typed("typed-1", "Hello there"))
            turn = asyncio.create_task(spoken(client, 1, "And now me"))
            job = await typed
            second = await turn
            finished = index(client, lambda e: e["type"] == "input_text.injection_finished")
            (turn_start,) = sent(client, "input_audio_buffer.turn_start")
            assert job.disposition == "completed" and turn_start.held and turn_start.after > finished
            response = await client.response_done((await client.response_for(second)).response_id)
            assert (client.turns[second].transcript, response.text) == ("And now me", "You said: And now me.")

    run(scenario())


# ==================================================================== the arbiter on its own


def _op(kind: str, k: int | None = None, *, job: str | None = None, size: int = 0) -> WireText:
    return WireText(kind, {"type": kind}, client_turn_id=k, job_id=job, audio_bytes=size)


def _drain(arbiter: OutboundArbiter) -> list[str]:
    out = []
    while (op := arbiter.pop_ready()) is not None:
        out.append(op.kind if op.kind != "typed" else f"typed:{op.job_id}")
    return out


def test_arbiter_admits_typed_first_then_the_held_turn_after_injection():
    arbiter = OutboundArbiter()
    arbiter.open_epoch("call_1")
    for op in (_op("turn_start", 2), _op("append", 2, size=2560), _op("append", 2, size=2560), _op("commit", 2)):
        assert arbiter.offer(op) == [] and op.held
    arbiter.offer(_op("typed", job="j1"))
    assert _drain(arbiter) == [] and arbiter.held_bytes == 5120
    arbiter.close_epoch("call_other")  # not the open call: still held
    assert _drain(arbiter) == []
    arbiter.close_epoch("call_1")
    assert _drain(arbiter) == ["typed:j1"]  # typed first; the microphone turn waits for the job's terminal
    assert arbiter.typed_in_flight == ["j1"] and arbiter.hold_reason() == "typed job j1 in flight"
    arbiter.typed_finished("j1")
    assert _drain(arbiter) == ["turn_start", "append", "append", "commit"]
    assert arbiter.wire_turn is None and arbiter.pending() == []


def test_arbiter_lets_a_turn_on_the_wire_finish_before_a_typed_request():
    arbiter = OutboundArbiter()
    arbiter.offer(_op("turn_start", 1))
    assert _drain(arbiter) == ["turn_start"] and arbiter.wire_turn == 1
    arbiter.offer(_op("typed", job="j1"))  # the server would reject it while the turn is open
    arbiter.offer(_op("append", 1, size=100))
    assert _drain(arbiter) == ["append"]
    arbiter.open_epoch("call_1")  # a call published while the turn_start was in flight
    arbiter.offer(_op("commit", 1))
    arbiter.offer(_op("turn_start", 2))
    assert _drain(arbiter) == []
    arbiter.close_epoch("call_1")
    assert _drain(arbiter) == ["commit", "typed:j1"]
    arbiter.typed_finished("j1")
    assert _drain(arbiter) == ["turn_start"]


def test_arbiter_rejected_typed_request_releases_microphone_input():
    arbiter = OutboundArbiter()
    arbiter.offer(_op("typed", job="j1"))
    arbiter.offer(_op("turn_start", 1))
    assert _drain(arbiter) == ["typed:j1"]
    arbiter.typed_finished("j1")  # input_text.rejected
    assert _drain(arbiter) == ["turn_start"]


def test_arbiter_capacity_overflow_drops_the_held_turn():
    arbiter = OutboundArbiter(max_held_bytes=3 * 2560)
    arbiter.open_epoch("call_1")
    ops = [_op("turn_start", 1)] + [_op("append", 1, size=2560) for _ in range(3)]
    for op in ops:
        arbiter.offer(op)
    arbiter.offer(_op("typed", job="j1"))
    with pytest.raises(ArbiterCapacityError) as raised:
        arbiter.offer(_op("append", 1, size=2560))
    error = raised.value
    assert (error.code, error.client_turn_id, error.fatal) == ("arbiter_capacity", 1, False)
    assert error.dropped == ops and not error.needs_commit and error.closing_commit is None
    assert arbiter.dropped_turns == {1: error} and arbiter.held_bytes == 0
    assert [op.kind for op in arbiter.pending()] == ["typed"]  # other held input is untouched
    arbiter.close_epoch()
    assert _drain(arbiter) == ["typed:j1"]


def test_arbiter_capacity_overflow_of_a_turn_on_the_wire_keeps_its_commit():
    arbiter = OutboundArbiter(max_held_bytes=2560)
    arbiter.offer(_op("turn_start", 1))
    assert _drain(arbiter) == ["turn_start"]
    arbiter.open_epoch("call_1")
    arbiter.offer(_op("append", 1, size=2560))
    with pytest.raises(ArbiterCapacityError) as raised:
        arbiter.offer(_op("append", 1, size=2560))
    assert raised.value.needs_commit  # the client queues a closing commit for the server's open turn


def test_arbiter_keeps_a_rolling_preroll_of_held_audio_outside_turns():
    arbiter = OutboundArbiter(preroll_bytes=2 * 2560)
    arbiter.offer(_op("typed", job="j1"))
    assert _drain(arbiter) == ["typed:j1"]
    free = [_op("append", None, size=2560) for _ in range(5)]
    trimmed = [t for op in free for t in arbiter.offer(op)]
    assert trimmed == free[:3] and arbiter.pending() == free[3:] and arbiter.trimmed_preroll_bytes == 3 * 2560
    arbiter.offer(_op("turn_start", 1))
    arbiter.typed_finished("j1")
    assert _drain(arbiter) == ["append", "append", "turn_start"]


def test_arbiter_passes_everything_through_when_nothing_holds():
    arbiter = OutboundArbiter()
    for op in (_op("append", None, size=2), _op("turn_start", 1), _op("append", 1, size=2), _op("commit", 1)):
        arbiter.offer(op)
        assert not op.held
    assert _drain(arbiter) == ["append", "turn_start", "append", "commit"]


# ==================================================================== the client's function-call checks, on a fake


class Fake:
    """A scripted server: ``emit`` stamps the v3 envelope (session ``S``, unique event ids)."""

    def __init__(self, ws) -> None:
        self.ws, self.n = ws, 0

    async def emit(self, type_: str, **fields) -> None:
        self.n += 1
        await self.ws.send(json.dumps({"type": type_, "event_id": f"e{self.n}", "session_id": "S", **fields}))

    async def recv(self) -> dict:
        return json.loads(await self.ws.recv())

    async def call(self, call_id: str, **fields) -> None:
        await self.emit("response.function_call_arguments.done", turn_id="T1", response_id="R1", call_id=call_id,
                        name="get_weather", arguments='{"city":"Paris"}', **fields)

    async def open_call_response(self) -> None:
        """Greet, run turn 1 to an open response R1 for the client."""
        await self.emit("session.created", protocol={"name": "voicechat.realtime", "version": 3},
                        capabilities={"input_turn_detection": "client_smart_turn_v1"}, session={"id": "S"})
        start = await self.recv()
        await self.emit("input_audio_buffer.speech_started", turn_id="T1", source="microphone", job_id=None,
                        correlation=1)
        await self.emit("input_audio_buffer.turn_started", turn_id="T1", client_turn_id=1,
                        client_event_id=start["event_id"])
        commit = await self.recv()
        await self.emit("input_audio_buffer.committed", turn_id="T1", client_turn_id=1,
                        client_event_id=commit["event_id"])
        await self.emit("conversation.item.input_audio_transcription.completed", turn_id="T1", transcript="",
                        empty=True, source="microphone", job_id=None)
        await self.emit("response.created", turn_id="T1", response_id="R1")


async def with_fake(script, scenario) -> None:
    async def handler(ws):
        try:
            await script(Fake(ws))
            await ws.wait_closed()
        except Exception:
            pass

    async with serve(handler, "127.0.0.1", 0, ping_interval=None) as server:
        port = server.sockets[0].getsockname()[1]
        await scenario(f"ws://127.0.0.1:{port}/v1/realtime")


async def opened(url: str, handler) -> V3Client:
    client = await V3Client.connect(url, tools={"get_weather": handler})
    await client.start_turn(1)
    await client.commit(1)
    return client


def test_a_second_call_while_the_epoch_is_open_is_a_protocol_error():
    gate = asyncio.Event()

    async def handler(arguments):
        await gate.wait()
        return "x"

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        await fake.call("call_1")  # a duplicate: ignored
        await fake.call("call_2")

    async def scenario(url):
        client = await opened(url, handler)
        with pytest.raises(ProtocolError, match="while call_1 is open"):
            await client.wait_for("never.sent", timeout=5)
        assert list(client.tool_runs) == ["call_1"] and not sent(client, "conversation.item.create")
        with pytest.raises(ProtocolError):  # held and later input fails with the session
            await client.request_typed("j1", "hello")
        await client.close()

    run(with_fake(script, scenario))


def test_an_applied_ack_for_another_call_is_a_protocol_error():
    async def handler(arguments):
        return "x"

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        result = await fake.recv()
        assert result["item"]["call_id"] == "call_1"
        await fake.emit(APPLIED, call_id="call_9")

    async def scenario(url):
        client = await opened(url, handler)
        with pytest.raises(ProtocolError, match="call_9"):
            await client.wait_for("never.sent", timeout=5)
        await client.close()

    run(with_fake(script, scenario))


def test_a_missing_applied_ack_is_a_protocol_error_and_held_input_is_never_sent():
    async def handler(arguments):
        return "x"

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        await fake.recv()  # the result; never acknowledged

    async def scenario(url):
        client = await V3Client.connect(url, tools={"get_weather": handler}, function_output_ack_timeout=0.3)
        await client.start_turn(1)
        await client.commit(1)
        await client.wait_for("response.function_call_arguments.done")
        typed = asyncio.create_task(client.request_typed("j1", "hello"))
        with pytest.raises(ProtocolError, match="within 0.3 s"):
            await typed
        assert isinstance(client.failure, ProtocolError)
        assert not sent(client, "input_text.request")
        await client.close()

    run(with_fake(script, scenario))


def test_held_input_fails_with_session_ended_on_stop():
    gate = asyncio.Event()

    async def handler(arguments):
        await gate.wait()
        return "x"

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        assert (await fake.recv())["type"] == "session.stop"
        await fake.emit("session.closed", status="completed", reason="client_stop")

    async def scenario(url):
        client = await opened(url, handler)
        await client.wait_for("response.function_call_arguments.done")
        start = asyncio.create_task(client.start_turn(2))
        await client.wait_until(lambda: client.arbiter.pending())
        await client.stop()
        with pytest.raises(SessionEnded):
            await start
        assert not sent(client, "input_audio_buffer.turn_start", client_turn_id=2)

    run(with_fake(script, scenario))


def test_a_failing_handler_reports_the_failure_to_the_model():
    async def handler(arguments):
        raise LookupError("no weather service")

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        result = await fake.recv()
        assert result["type"] == "conversation.item.create" and result["item"]["call_id"] == "call_1"
        await fake.emit(APPLIED, call_id="call_1")

    async def scenario(url):
        client = await opened(url, handler)
        run_ = await client.tool_run_done("call_1", timeout=5)
        assert run_.outcome == "applied" and isinstance(run_.error, LookupError)
        assert json.loads(run_.output) == {"error": "tool_handler_failed", "type": "LookupError"}
        assert client.failure is None and client.function_epoch is None
        await client.close()

    run(with_fake(script, scenario))


def test_held_turn_overflow_drops_the_turn_with_arbiter_capacity():
    gate = asyncio.Event()

    async def handler(arguments):
        await gate.wait()
        return "x"

    async def script(fake: Fake):
        await fake.open_call_response()
        await fake.call("call_1")
        assert (await fake.recv())["type"] == "conversation.item.create"
        await fake.emit(APPLIED, call_id="call_1")
        start = await fake.recv()  # the first input after the epoch: turn 3 (turn 2 was dropped)
        assert (start["type"], start["client_turn_id"]) == ("input_audio_buffer.turn_start", 3)
        for done in ("response.output_text.done", "response.output_audio.done"):  # barge-in: cancel R1 first
            await fake.emit(done, turn_id="T1", response_id="R1", text="", empty=True)
        await fake.emit("response.done", turn_id="T1", response_id="R1", status="cancelled", reason="client_vad")
        await fake.emit("input_audio_buffer.speech_started", turn_id="T2", source="microphone", job_id=None,
                        correlation=3)
        await fake.emit("input_audio_buffer.turn_started", turn_id="T2", client_turn_id=3,
                        client_event_id=start["event_id"])

    async def scenario(url):
        client = await V3Client.connect(url, tools={"get_weather": handler}, max_held_bytes=3 * APPEND_BYTES)
        await client.start_turn(1)
        await client.commit(1)
        await client.wait_for("response.function_call_arguments.done")
        start = asyncio.create_task(client.start_turn(2))
        await client.wait_until(lambda: client.arbiter.pending())  # turn 2's turn_start is held
        with pytest.raises(ArbiterCapacityError) as raised:
            await client.send_audio(bytes(5 * APPEND_BYTES), paced=False)  # 4 chunks > 3 chunks of room
        error = raised.value
        assert (error.code, error.client_turn_id) == ("arbiter_capacity", 2) and client.client_errors == [error]
        assert [op.kind for op in error.dropped] == ["turn_start", "append", "append", "append"]
        with pytest.raises(ArbiterCapacityError):
            await start
        with pytest.raises(ArbiterCapacityError):
            await client.commit(2)
        assert client.arbiter.pending() == [] and client.failure is None
        third = asyncio.create_task(client.start_turn(3))  # the session goes on: held until the epoch closes
        gate.set()
        assert await third == "T2"
        assert not sent(client, "input_audio_buffer.turn_start", client_turn_id=2)
        assert not sent(client, "input_audio_buffer.append")
        await client.close()

    run(with_fake(script, scenario))
