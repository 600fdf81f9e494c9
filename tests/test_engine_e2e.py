"""The real engine on CPU, end to end: ``vllm-omni serve <tiny checkpoint> --omni --deploy-config
deploy/voicechat-cpu.yaml`` (vLLM's CPU build, our CPU OmniPlatform, vLLM-Omni's three Nemotron VoiceChat stages with
our thinker, plugin and routes) driven by our v3 client and by vLLM-Omni's own ``DuplexClient``.

The tiny checkpoint's weights follow ``omni/tiny/script.py``: the model listens (PAD, silent audio; its RNNT says
"hello" once per utterance), answers the runtime's forced BOS with twelve words and its own EOS, and calls ``get_time`` when the prompt offers tools.
So the assertions are exact: the words prove that a forced control entered the next real forward pass (the text
and function channels are fed back by the engine), and the per-position telemetry shows one Stage-0 token and one
Stage-2 packet per position. Runs in the engine venv (scripts/install_omni_cpu.sh VENV --engine); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from vllm_omni_voicechat.omni.local_server import engine_available, engine_server, get_json

_skip = engine_available()
pytestmark = [pytest.mark.engine, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

SAMPLES_PER_POSITION_OUT = 1764  # 22.05 kHz x 80 ms
TOOLS = [{"type": "function", "name": "get_time", "description": "The local time",
          "parameters": {"type": "object", "properties": {}}}]


def run(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint"), seed=0)


@pytest.fixture(scope="module")
def engine(checkpoint, tmp_path_factory):
    with engine_server(checkpoint, tmp_path_factory.mktemp("engine-log")) as srv:
        yield srv


@pytest.fixture
def server(engine):
    """The module's server once the previous test's sessions have left (their slots free, /health says so)."""
    import time

    deadline = time.monotonic() + 60
    while get_json(engine.http + "/health")[1].get("active_sessions", 0) and time.monotonic() < deadline:
        time.sleep(0.2)  # ok: polling another process's own account of its sessions, bounded
    return engine


def script():
    from vllm_omni_voicechat.omni.tiny import script as s

    return s


def speech(text: str) -> bytes:
    from vllm_omni_voicechat.audio.speech import render_speech

    return render_speech(text)


def of_type(events, kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def metrics(events) -> list[dict]:
    return of_type(events, "voicechat.metrics")


def assert_one_packet_per_position(events) -> None:
    """Every position ran once, in order, on the thinker's own frame counter, with one Stage-2 packet."""
    ms = [m for m in metrics(events) if m["frame"] is not None]
    assert [m["frame"] for m in ms] == list(range(len(ms)))
    assert [m["turn_state"]["model"]["thinker_frame"] for m in ms] == [m["frame"] for m in ms]
    assert all(m["output_audio"] for m in ms)
    deltas = of_type(events, "response.output_audio.delta")
    assert len(deltas) == sum(m["audio_delivered"] for m in ms)
    import base64

    assert {len(base64.b64decode(d["delta"])) for d in deltas} == {2 * SAMPLES_PER_POSITION_OUT}


async def v3_turn(client, turn: int, text: str = "what time is it"):
    turn_id = await client.start_turn(turn)
    await client.send_audio(speech(text), paced=False)
    await client.commit(turn)
    return turn_id


def test_health_reports_the_engine_and_its_warmup(server):
    status, body = get_json(server.http + "/health")
    assert status == 200
    assert body["status"] == "ready" and body["model_kind"] == "vllm-omni" and body["host_runtime"] == "vllm-omni"
    assert body["max_sessions"] == 4 and body["active_sessions"] == 0
    assert body["warmup"]["positions"] == 2  # two silent positions through all three stages before the first client
    assert body["typed_input"] == {"ready": False, "synthesizer": None}
    # vLLM's serve_http turns uvicorn's WebSocket keepalive on; the v3 contract wants no pings (omni/mount.py)
    assert "WebSocket keepalive pings off" in server.log_path.read_text(errors="replace")
    metrics = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()  # vLLM's route
    assert 'voicechat_sessions{state="active"} 0.0' in metrics  # our collector, in the registry vLLM serves
    status, models = get_json(server.http + "/v1/models")  # vLLM-Omni's own route, next to ours
    assert status == 200 and models["data"][0]["id"] == str(server.checkpoint)


def test_v3_spoken_turn_answered_by_the_forced_bos(server):
    from vllm_omni_voicechat.client import V3Client

    s = script()

    async def main():
        async with await V3Client.connect(server.ws + "/v1/voicechat") as c:
            await c.configure("You are helpful.")
            turn_id = await v3_turn(c, 1)
            response = await c.response_for(turn_id, timeout=60)
            done = await c.response_done(response.response_id, timeout=60)
            await c.stop()
            return list(c.events), done, c.errors

    events, done, errors = run(main())
    assert errors == []
    assert [e["delta"] for e in of_type(events, "response.output_text.delta")] == list(s.RESPONSE_WORDS)
    final = of_type(events, "response.done")[0]
    assert final["status"] == "completed"
    # The tiny RNNT says "hello" once per utterance (loudness), through the thinker's streaming perception.
    assert of_type(events, "conversation.item.input_audio_transcription.completed")[0]["transcript"] == "hello"
    assert_one_packet_per_position(events)
    ms = [m for m in metrics(events) if m["frame"] is not None]
    # The forced EOU (agent BOS at the settlement fence) took effect in the forward pass: the words follow it.
    eou = [m for m in ms if m["turn_state"]["model"]["agent_bos_forced"] == 1]
    bos_frame = eou[0]["turn_state"]["model"]["last_eou_frame"]
    first_word = next(m for m in ms if m["response_id"] and m["turn_state"]["agent_control"] == "text")
    assert first_word["frame"] == bos_frame + 1
    # Settlement: zero-input positions until the RNNT blank fence (10), each PAD and blank (the runtime checks every
    # one; any activity would be fatal); the fence position itself is the forced BOS (fused, no tools).
    settling = [m for m in ms if m["turn_state"]["kind"] == "settlement" and m["frame"] < bos_frame]
    assert settling and all(m["turn_state"]["agent_control"] == "pad" for m in settling)
    counts = [m["turn_state"]["blank_count"] for m in settling]
    assert counts == list(range(counts[0], counts[0] + len(counts)))
    assert eou[0]["turn_state"]["blank_count"] >= 9


def test_v3_barge_in_forces_eos_and_the_next_turn_is_answered(server):
    from vllm_omni_voicechat.client import V3Client

    s = script()

    async def main():
        async with await V3Client.connect(server.ws + "/v1/voicechat") as c:
            await c.configure("You are helpful.")
            first_turn = await c.start_turn(1)
            await c.send_audio(speech("what time is it"), paced=False)
            # turn_start written right behind the commit: the session core runs it after the commit's settlement
            # and forced BOS, so it always meets the open response (a barge-in that never races the 80 ms clock).
            _, second_turn = await asyncio.gather(c.commit(1), c.start_turn(2))
            first = await c.response_for(first_turn, timeout=60)
            cancelled = await c.response_done(first.response_id, timeout=60)
            await c.send_audio(speech("and now"), paced=False)
            await c.commit(2)
            second = await c.response_for(second_turn, timeout=60)
            await c.response_done(second.response_id, timeout=60)
            await c.stop()
            return list(c.events), first.response_id, second.response_id, cancelled, c.errors

    events, first_id, second_id, cancelled, errors = run(main())
    assert errors == []
    done = {e["response_id"]: e for e in of_type(events, "response.done")}
    assert done[first_id]["status"] == "cancelled"
    assert done[second_id]["status"] == "completed"
    second_words = [e["delta"] for e in of_type(events, "response.output_text.delta") if e["response_id"] == second_id]
    assert second_words == list(s.RESPONSE_WORDS)
    first_words = [e["delta"] for e in of_type(events, "response.output_text.delta") if e["response_id"] == first_id]
    assert len(first_words) < len(s.RESPONSE_WORDS)  # cut short
    ms = [m for m in metrics(events) if m["frame"] is not None]
    assert ms[-1]["turn_state"]["model"]["agent_eos_forced"] >= 1
    # The forced EOS entered the forward pass: the next position is PAD, not the script's next word.
    eos = next(i for i, m in enumerate(ms) if m["turn_state"]["agent_control"] == "agent_eos")
    assert ms[eos]["response_id"] == first_id and ms[eos + 1]["turn_state"]["agent_control"] == "pad"
    assert_one_packet_per_position(events)


def test_v3_typed_input_is_rejected_without_a_synthesizer(server):
    from vllm_omni_voicechat.client import V3Client

    async def main():
        async with await V3Client.connect(server.ws + "/v1/voicechat") as c:
            caps = dict(c.capabilities)
            await c.configure("You are helpful.")
            job = await c.request_typed("job-1", "what time is it")
            await c.stop()
            return caps, job, list(c.events)

    caps, job, events = run(main())
    assert caps["typed_input"] is False
    assert job.accepted is False
    rejected = [e for e in events if e["type"].startswith("input_text.")]
    assert [e["type"] for e in rejected] == ["input_text.rejected"]
    assert rejected[0]["reason"] == "typed_input_unavailable"


def test_v3_tool_call_round_trip_through_the_real_forward_pass(server):
    from vllm_omni_voicechat.client import V3Client

    s = script()
    calls = []

    async def get_time(arguments):
        calls.append(arguments)
        return json.dumps({"time": "12:00"})

    async def main():
        async with await V3Client.connect(server.ws + "/v1/voicechat", tools={"get_time": get_time}) as c:
            await c.configure("You are helpful.", tools=TOOLS)
            turn_id = await v3_turn(c, 1)
            try:
                response = await c.response_for(turn_id, timeout=60)
                await c.response_done(response.response_id, timeout=90)
            except Exception:
                prev = None
                for e in c.events:
                    if e["type"] == "voicechat.metrics":
                        ts = e["turn_state"]
                        key = (ts["kind"], ts["agent_control"], ts["boundary"], str(ts.get("function_cycle"))[:60])
                        if key != prev:
                            print("M", e["frame"], key)
                            prev = key
                    elif "delta" not in e["type"]:
                        print(json.dumps(e)[:300])
                raise
            await c.stop()
            return list(c.events), c.errors

    events, errors = run(main(), timeout=180)
    assert errors == []
    assert calls == [{}]
    call = of_type(events, "response.function_call_arguments.done")[0]
    assert (call["name"], json.loads(call["arguments"])) == (s.TOOL_NAME, {})
    assert of_type(events, "conversation.item.function_call_output.applied")[0]["call_id"] == call["call_id"]
    # Before the call the text channel held PAD; the injected result ended with EOTR, after which the model spoke.
    assert [e["delta"] for e in of_type(events, "response.output_text.delta")] == list(s.RESPONSE_WORDS)
    assert of_type(events, "response.done")[0]["status"] == "completed"
    model = [m for m in metrics(events) if m["frame"] is not None][-1]["turn_state"]["model"]
    from vllm_omni_voicechat.model.prompt import wrap_tool_result

    result_tokens = wrap_tool_result(json.dumps({"time": "12:00"}))
    assert model["tool_tokens_injected"] >= 1 and model["last_injection_frame"] is not None
    assert result_tokens.startswith("<TOOL_RESPONSE>")
    assert_one_packet_per_position(events)


def test_duplex_client_turn_on_the_tiered_route(server):
    from vllm_omni_voicechat.omni.client_preset import create_duplex_session_config, stream_pcm16

    from .compat import load_duplex_client_module

    dc = load_duplex_client_module()
    s = script()

    async def main():
        config = create_duplex_session_config(instructions="You are helpful.")
        async with dc.DuplexClient(server.ws + "/v1/realtime?duplex=1", model=str(server.checkpoint),
                                   config=config, reconnect=None, heartbeat_interval_s=None) as c:
            await stream_pcm16(c, speech("what time is it") + bytes(2 * 3200), realtime=False)
            await c.commit()
            async for handle in c.responses():
                if handle.response_id is None:
                    continue
                audio = b"".join([chunk async for chunk in handle.audio()])
                await handle.wait(60)
                return handle, audio

    handle, audio = run(main())
    assert handle.transcript == s.RESPONSE_TEXT
    assert handle.done_event.raw["response"]["status"] == "completed"
    assert len(audio) > 0 and len(audio) % (2 * SAMPLES_PER_POSITION_OUT) == 0


async def two_sessions(server) -> tuple[list, dict[int, list[float]]]:
    """Two v3 clients at once, one spoken turn each; also when each session's positions reached its client (their
    overlap is measured, not asserted: see docs/engine-on-cpu.md on two sessions)."""
    from vllm_omni_voicechat.client import V3Client

    spans: dict[int, list[float]] = {0: [], 1: []}

    async def one(index: int):
        loop = asyncio.get_running_loop()
        async with await V3Client.connect(server.ws + "/v1/voicechat") as c:

            async def stamp() -> None:
                async for event in c.iter_events():
                    if event["type"] == "voicechat.metrics" and event["frame"] is not None:
                        spans[index].append(loop.time())

            stamper = asyncio.create_task(stamp())
            await c.configure(f"Session {index}.")
            turn_id = await v3_turn(c, 1)
            response = await c.response_for(turn_id, timeout=90)
            await c.response_done(response.response_id, timeout=90)
            await c.stop()
            stamper.cancel()
            return c.session_id, list(c.events), c.errors

    return list(await asyncio.gather(one(0), one(1))), spans


def test_two_concurrent_sessions_each_get_their_answer(server):
    s = script()
    results, _ = run(two_sessions(server), timeout=240)
    assert len({sid for sid, _, _ in results}) == 2
    for _, events, errors in results:
        assert errors == []
        assert [e["delta"] for e in of_type(events, "response.output_text.delta")] == list(s.RESPONSE_WORDS)
        assert_one_packet_per_position(events)
    assert get_json(server.http + "/health")[1]["active_sessions"] == 0


def test_clean_shutdown(server):
    server.stop()
    assert server.exit_code == 0, server.log_tail()
    assert server.stop_s is not None and server.stop_s < 60
    assert server.leftover_pids == []  # no stage process outlives the server
