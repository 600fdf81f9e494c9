"""``TieredSession`` + ``SessionCore`` + the simulator on the synchronous shell (docs/tiered-dialect.md §11.1).

Every test builds its sessions through the ``tiered`` fixture; at teardown each session is run to idle and its
whole wire trace goes through :func:`check_invariants` (§3.3 pairing, §3.7 seq, §4 fencing and epochs).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from vllm_omni_voicechat.session.lifecycle import TurnState
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.wire.tiered import parser as P
from vllm_omni_voicechat.wire.tiered import projector as tiered_projector
from vllm_omni_voicechat.wire.tiered.connection import ResumeOutcome, TieredOptions
from vllm_omni_voicechat.wire.tiered.stamping import TIER3 as _TIER3
from vllm_omni_voicechat.wire.transport import CloseTransport, WireText

from .compat import validate_openai_server_event
from .helpers import SILENCE_FRAME
from .tiered_harness import SID, TieredDriver, types

OUTPUT_RATE = 24_000
AUDIO = "response.output_audio.delta"
TRANSCRIPT = "response.output_audio_transcript.delta"
DELTAS = "(audio.delta transcript.delta)+"
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_CALL = 'call get_weather {"city": "Paris"}'
USER_MESSAGE = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Good morning"}]}

# ==================================================================================================== invariants


def response_id_of(event: dict) -> str | None:
    rid = event.get("response_id")
    if rid is None and isinstance(event.get("response"), dict):
        rid = event["response"].get("id")
    return rid


def epochs_of(event: dict) -> list[int]:
    """Every epoch an event states (§4 "Where the epoch appears"), except a response's own creation epoch."""
    found = [event.get("epoch")] + [part.get("epoch") for part in (event.get("metadata"), event.get("event"))
                                    if isinstance(part, dict)]
    return [e for e in found if isinstance(e, int) and not isinstance(e, bool)]


def check_invariants(events: list[dict], *, tier3: bool = True) -> None:
    """§3.3/§3.7/§4 over one whole trace, run to idle (``tier3``: the full lane)."""
    seqs = [e["server_event_seq"] for e in events if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1)), "server_event_seq must run 1, 2, 3, ... over journaled events"

    created = [e["response_id"] for e in events if e["type"] == "response.created"]
    done = [e["response_id"] for e in events if e["type"] == "response.done"]
    assert len(created) == len(set(created)), f"a response id was created twice: {created}"
    assert len(done) == len(set(done)), f"a response got two response.done: {done}"
    assert set(done) == set(created), f"unpaired: {set(done) ^ set(created)}"

    ended: set[str] = set()
    last_epoch, floor = 0, 0
    for event in events:
        rid = response_id_of(event)
        # output_audio_buffer.cleared answers a client clear and names the last response even after its done (§4)
        if rid in ended and event["type"] != "output_audio_buffer.cleared":
            raise AssertionError(f"{event['type']} names {rid} after its response.done")
        for epoch in epochs_of(event):
            if event["type"] in ("response.created", "response.done"):
                continue  # metadata.epoch there is the response's creation epoch
            assert epoch >= last_epoch, f"epoch went back from {last_epoch} to {epoch} at {event['type']}"
            last_epoch = epoch
        if event["type"] == AUDIO:
            assert event["metadata"]["epoch"] >= floor, f"audio of epoch {event['metadata']['epoch']} after {floor}"
        if event["type"] == "response.done":
            ended.add(rid)
            epoch = event["response"]["metadata"].get("epoch")
            if event["response"]["status"] == "cancelled" and isinstance(epoch, int):  # int on the full lane
                floor = max(floor, epoch + 1)  # the cancel advanced past the response's epoch

    for rid in created:  # §3.3: one transcript delta per audio delta; transcript.done is their concatenation
        mine = [e for e in events if e.get("response_id") == rid]
        kinds = [e["type"] for e in mine if e["type"] in (AUDIO, TRANSCRIPT)]
        assert kinds == [AUDIO, TRANSCRIPT] * (len(kinds) // 2), f"{rid}: audio/transcript deltas not paired"
        finals = [e["transcript"] for e in mine if e["type"] == "response.output_audio_transcript.done"]
        if finals:
            assert finals == ["".join(e["delta"] for e in mine if e["type"] == TRANSCRIPT)], rid
        speak = [i for i, e in enumerate(mine) if e["type"] == "response.speak"]
        audio = [i for i, e in enumerate(mine) if e["type"] == AUDIO]
        if tier3 and audio:  # exactly one speak, right before the first audio delta
            assert speak == [audio[0] - 1], f"{rid}: response.speak at {speak}, first audio delta at {audio[0]}"
        else:
            assert speak == [], f"{rid}: response.speak without audio or on the OpenAI lane"


@pytest.fixture
def tiered():
    """A factory of started tiered sessions; every trace is run to idle and checked at teardown."""
    drivers: list[TieredDriver] = []

    def make(session: dict | None = None, *, lane: str = "full", **options: Any) -> TieredDriver:
        config: dict[str, Any] = {}
        if lane == "openai":
            options.setdefault("autostart", True)
            options.setdefault("model", "sim")
            config = {"session_id": "sess_0123456789abcdef0123456789", "call_id_hex": 27}  # as the server's
        d = TieredDriver(options=TieredOptions(lane=lane, **options), **config)
        drivers.append(d)
        if lane == "full":
            assert types(d.send({"type": "session.update", "session": session or {"instructions": "Be brief."}})) == [
                "session.created", "session.updated"]
        else:
            assert types(d.run()) == ["session.created"]
            if session:
                assert types(d.send({"type": "session.update", "session": session})) == ["session.updated"]
        d.run()
        return d

    yield make
    for d in drivers:
        if not d.session.closed:
            d.run()
        check_invariants(d.events, tier3=d.session.tier3)


# ==================================================================================================== helpers


def speak(d: TieredDriver, text: str = "Hello", silence: int = 12, **extra: Any) -> list[dict]:
    """Speech then ``silence`` frames of silence (12 make the model take the turn on its own)."""
    return d.append(render_speech(text) + SILENCE_FRAME * silence, **extra)


def run_until(d: TieredDriver, event_type: str, limit: int = 5_000) -> list[dict]:
    """Run one position at a time until ``event_type`` goes out; returns the events so far."""
    out: list[dict] = []
    for _ in range(limit):
        out += d.run(max_positions=1)
        if event_type in types(out):
            return out
    raise AssertionError(f"no {event_type} within {limit} positions: {types(out)}")


def mid_response(d: TieredDriver, text: str = "Hello", **extra: Any) -> list[dict]:
    """Speak and run until the response has sent a few audio deltas."""
    speak(d, text, **extra)
    out = run_until(d, AUDIO)
    return out + d.run(max_positions=3)


def collapse(names: Iterable[str]) -> list[str]:
    """Event types with runs of input transcription deltas and of (audio, transcript) delta pairs folded."""
    out: list[str] = []
    for name in names:
        if name == "conversation.item.input_audio_transcription.delta":
            name = "transcription.delta+"
        elif name in (AUDIO, TRANSCRIPT):
            name = DELTAS
        if not out or out[-1] != name:
            out.append(name)
    return out


def of_type(events: list[dict], event_type: str) -> list[dict]:
    return [e for e in events if e["type"] == event_type]


def one(events: list[dict], event_type: str) -> dict:
    found = of_type(events, event_type)
    assert len(found) == 1, f"{len(found)} × {event_type} in {types(events)}"
    return found[0]


def errors(events: list[dict]) -> list[tuple[str, str | None]]:
    return [(e["error"]["code"], e["error"].get("param")) for e in events if e["type"] == "error"]


def output_pcm(events: list[dict], response_id: str | None = None) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in of_type(events, AUDIO)
                    if response_id is None or e["response_id"] == response_id)


def transcript(events: list[dict], response_id: str) -> str:
    return "".join(e["delta"] for e in of_type(events, TRANSCRIPT) if e["response_id"] == response_id)


def after(events: list[dict], predicate: Callable[[dict], bool]) -> list[dict]:
    """The events after the first one matching ``predicate``."""
    i = next(i for i, e in enumerate(events) if predicate(e))
    return events[i + 1:]


def epoch_now(d: TieredDriver) -> int:
    """The wire epoch as the client can see it: the echo of an unknown turn signal (§2)."""
    return one(d.send({"type": "turn.signal", "event": "probe"}), "turn.event")["epoch"]


def token_of(d: TieredDriver) -> str:
    return one(d.events, "session.created")["resume_token"]


def resume(d: TieredDriver, token: str, cursor: int) -> ResumeOutcome:
    request = P.SessionResume(type="session.resume", session_id=SID, resume_token=token,
                              last_received_server_event_seq=cursor)
    return d.session.resume(request, d.clock.now)


def texts(outbound: list[WireText]) -> list[dict]:
    return [json.loads(o.text) for o in outbound]


def journaled_after(d: TieredDriver, cursor: int) -> list[str]:
    return [o.text for o in d.outputs if isinstance(o, WireText) and o.seq is not None and o.seq > cursor]


def detach(d: TieredDriver) -> list[Any]:
    return d.session.detach(d.clock.now)


USER_TURN = [
    "input_audio_buffer.speech_stopped",
    "conversation.item.added", "conversation.item.created",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.done",
]
RESPONSE_OPEN = [
    "response.created",
    "conversation.item.added", "conversation.item.created",
    "response.output_item.added",
    "response.content_part.added",
]
MESSAGE_CLOSE = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
]
RESPONSE_END = ["response.done", "rate_limits.updated"]
SPOKEN_RESPONSE = [*RESPONSE_OPEN, "response.speak", DELTAS, *MESSAGE_CLOSE, *RESPONSE_END]
CANCELLED_TERMINAL = [*MESSAGE_CLOSE, *RESPONSE_END]


def assert_spoken_reply(events: list[dict], rid: str, text: str) -> None:
    done = one(events, "response.done")
    assert done["response_id"] == rid and done["response"]["status"] == "completed"
    assert done["response"]["status_details"] is None
    assert one(events, "response.output_audio_transcript.done")["transcript"] == text == transcript(events, rid)
    assert done["response"]["output"] == [{"id": f"item_{rid}", "type": "message", "object": "realtime.item",
                                           "role": "assistant", "status": "completed",
                                           "content": [{"type": "output_audio", "transcript": text}]}]
    assert decode_speech(output_pcm(events, rid), OUTPUT_RATE) == text


# ==================================================================================================== 1. spoken turn


def test_model_owned_eou_turn_has_the_seed_fan_out_and_response_order(tiered):
    d = tiered()
    assert speak(d) == []  # nothing before the model has heard it
    events = d.run()
    assert collapse(types(events)) == [
        "input_audio_buffer.speech_started", "transcription.delta+", *USER_TURN, *SPOKEN_RESPONSE]

    user = "item_turn_S_1"
    for t in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
              "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed"):
        assert one(events, t)["item_id"] == user
    assert one(events, "conversation.item.input_audio_transcription.completed")["transcript"] == "Hello"
    user_item = {"id": user, "type": "message", "object": "realtime.item", "role": "user", "status": "completed",
                 "content": [{"type": "input_audio", "transcript": "Hello"}]}
    added = of_type(events, "conversation.item.added")
    assert added[0]["item"] == user_item and added[0]["previous_item_id"] is None
    assert added[1]["item"]["id"] == "item_resp_1" and added[1]["previous_item_id"] == user
    assert one(events, "input_audio_buffer.committed")["event"]["message"] == "Hello"

    created = one(events, "response.created")
    assert created["response_id"] == created["response"]["id"] == "resp_1"
    assert created["response"]["status"] == "in_progress" and created["response"]["output"] == []
    speak_event = one(events, "response.speak")
    assert speak_event["item_id"] == "item_resp_1"
    assert speak_event["metadata"] == {"session_id": SID, "epoch": 0, "model_speak": True}

    audio, text = of_type(events, AUDIO), of_type(events, TRANSCRIPT)
    assert len(audio) == len(text) > 1
    assert all(a["format"] == "pcm16" and a["sample_rate_hz"] == OUTPUT_RATE and a["metadata"]["epoch"] == 0
               for a in audio)
    sent = [a["metadata"]["audio_duration_ms"] for a in audio]
    assert sent == sorted(sent) and sent[-1] == audio[-1]["metadata"]["playback"]["sent_ms"]
    assert_spoken_reply(events, "resp_1", "You said: Hello.")
    assert one(events, "rate_limits.updated")["rate_limits"] == []


# ==================================================================================================== 2. commits


def test_a_client_commit_forces_the_eou(tiered):
    d = tiered()
    speak(d, silence=3)
    assert collapse(types(d.run())) == ["input_audio_buffer.speech_started", "transcription.delta+"]
    assert d.send({"type": "input_audio_buffer.commit", "event_id": "c1"}) == []
    events = d.run()
    assert collapse(types(events)) == [*USER_TURN, *SPOKEN_RESPONSE]
    assert_spoken_reply(events, "resp_1", "You said: Hello.")


def test_a_commit_with_nothing_appended_is_input_audio_buffer_empty(tiered):
    d = tiered()
    [error] = d.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert error["error"] == {"type": "invalid_request_error", "code": "input_audio_buffer_empty",
                              "message": "no audio to commit", "event_id": "c1"}


def test_a_redundant_commit_right_after_the_model_owned_eou_is_silent(tiered):
    d = tiered()
    speak(d)
    assert "response.done" in types(d.run())
    assert d.send({"type": "input_audio_buffer.commit"}) == []
    assert d.run() == []


def test_a_commit_of_pure_silence_is_a_listen_decision(tiered):
    d = tiered()
    d.append(SILENCE_FRAME * 5)
    assert d.run() == []
    assert d.send({"type": "input_audio_buffer.commit"}) == []
    [listen] = d.run()
    assert listen["type"] == "response.listen" and "response_id" not in listen
    assert listen["session_id"] == SID and listen["epoch"] == 0
    assert listen["response"] == {"object": "realtime.response", "status": "listening",
                                  "metadata": {"type": "listen", "session_id": SID, "epoch": 0,
                                               "reason": "silence_or_noise", "model_listen": False}}


def test_an_is_speech_false_commit_of_new_silence_after_an_answered_turn_listens(tiered):
    d = tiered()
    speak(d)
    assert "response.done" in types(d.run())
    d.append(SILENCE_FRAME * 5)
    assert d.run() == []
    events = d.send({"type": "input_audio_buffer.commit", "is_speech": False}) + d.run()
    assert [e["response"]["metadata"]["reason"] for e in of_type(events, "response.listen")] == ["silence_or_noise"]


def test_without_auto_response_the_commit_settles_and_response_create_answers(tiered):
    d = tiered({"instructions": "Be brief.", "extra_body": {"auto_response": False}})
    speak(d)
    assert collapse(types(d.run())) == ["input_audio_buffer.speech_started", "transcription.delta+"]
    assert d.send({"type": "input_audio_buffer.commit"}) == []
    assert types(d.run()) == USER_TURN
    assert d.send({"type": "response.create"}) == []
    events = d.run()
    assert collapse(types(events)) == SPOKEN_RESPONSE
    assert_spoken_reply(events, "resp_1", "You said: Hello.")


# ==================================================================================================== 3. typed text


def test_a_typed_user_item_is_answered_at_response_create(tiered):
    d = tiered()
    stored = {**USER_MESSAGE, "id": "item_text_1", "object": "realtime.item", "status": "completed"}
    added = d.send({"type": "conversation.item.create", "item": {**USER_MESSAGE, "id": "item_text_1"}})
    assert types(added) == ["conversation.item.added", "conversation.item.created", "conversation.item.done"]
    assert all(e["item"] == stored for e in added)
    assert d.send({"type": "response.create"}) == []
    events = d.run()
    assert collapse(types(events)) == SPOKEN_RESPONSE  # no speech events for a typed turn
    assert_spoken_reply(events, "resp_1", "You said: Good morning.")


@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_system_text_item_is_heard_as_typed_text_at_response_create(tiered, role):
    """The prompt is resident from the first position: a system message added later (Pipecat's appended messages)
    is what the model hears, as typed text is; an assistant item is only recorded."""
    d = tiered()
    d.send({"type": "conversation.item.create",
            "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]}})
    d.send({"type": "conversation.item.create",
            "item": {"type": "message", "role": role, "content": [{"type": "input_text", "text": "Greet Ada"}]}})
    assert d.send({"type": "response.create"}) == []
    events = d.run()
    assert collapse(types(events)) == SPOKEN_RESPONSE
    assert_spoken_reply(events, "resp_1", "You said: Greet Ada.")


@pytest.mark.parametrize("alias", ["input.text.append", "input_text.append", "push_text"])
def test_input_text_append_is_answered(tiered, alias):
    d = tiered()
    assert d.send({"type": alias, "text": "How are you"}) == []
    events = d.run()
    assert collapse(types(events)) == SPOKEN_RESPONSE
    assert_spoken_reply(events, "resp_1", "You said: How are you.")


def test_response_create_with_nothing_to_answer_is_an_error(tiered):
    d = tiered()
    assert errors(d.send({"type": "response.create", "event_id": "r1"})) == [("response_create_without_input", None)]


def test_per_response_instructions_are_refused_on_the_full_lane(tiered):
    d = tiered()
    out = d.send({"type": "response.create", "event_id": "r1", "response": {"instructions": "Say hello."}})
    assert errors(out) == [("unsupported_native_response_options", "response.instructions")]
    assert d.run() == []  # nothing started


def test_response_create_while_a_response_is_open_is_response_already_active(tiered):
    d = tiered()
    mid_response(d)
    assert errors(d.send({"type": "response.create"})) == [("response_already_active", None)]


# ==================================================================================================== 4. functions


def function_call_turn(d: TieredDriver) -> list[dict]:
    speak(d, WEATHER_CALL)
    return run_until(d, "rate_limits.updated")  # wire response A ends at its call


def test_ga_flat_tools_are_accepted_and_echoed(tiered):
    d = tiered({"instructions": "Be brief.", "tools": [TOOL]})
    assert one(d.events, "session.updated")["session"]["tools"] == [TOOL]


def test_a_function_call_ends_response_a_and_its_output_opens_response_b(tiered):
    d = tiered({"instructions": "Be brief.", "tools": [TOOL]})
    a = function_call_turn(d)
    call = one(a, "response.function_call_arguments.done")
    call_id = call["call_id"]
    item_id = f"item_fc_{call_id}"
    assert call_id.startswith("call_")
    assert {k: call[k] for k in ("response_id", "item_id", "name", "arguments")} == {
        "response_id": "resp_1", "item_id": item_id, "name": "get_weather", "arguments": '{"city":"Paris"}'}
    fc_added = [e for e in of_type(a, "response.output_item.added") if e["item"]["type"] == "function_call"]
    assert [e["item"]["status"] for e in fc_added] == ["in_progress"] and fc_added[0]["item"]["arguments"] == ""
    assert types(after(a, lambda e: e["type"] == "response.function_call_arguments.done")) == [
        "response.output_item.done", "conversation.item.done", *RESPONSE_END]
    done_a = one(a, "response.done")
    assert done_a["response_id"] == "resp_1" and done_a["response"]["status"] == "completed"
    assert done_a["response"]["output"][-1] == {
        "id": item_id, "type": "function_call", "object": "realtime.item", "status": "completed",
        "name": "get_weather", "call_id": call_id, "arguments": '{"city":"Paris"}'}

    output_item = {"type": "function_call_output", "call_id": call_id, "output": "sunny"}
    acked = d.send({"type": "conversation.item.create", "item": output_item})
    assert types(acked) == ["conversation.item.added", "conversation.item.created", "conversation.item.done"]
    assert acked[0]["item"]["call_id"] == call_id and acked[0]["previous_item_id"] == item_id
    assert d.send({"type": "response.create"}) == []  # absorbed by response B (§3.4)

    b = d.run()
    applied = b[0]
    assert applied["type"] == "turn.event" and applied["event"] == "function_call_output.applied"
    assert applied["call_id"] == call_id
    assert collapse(types(b[1:])) == SPOKEN_RESPONSE
    assert_spoken_reply(b, "resp_2", "The result is sunny.")
    assert errors(d.events) == []


def test_a_function_call_output_for_an_unknown_or_answered_call_is_rejected(tiered):
    d = tiered({"instructions": "Be brief.", "tools": [TOOL]})
    call_id = one(function_call_turn(d), "response.function_call_arguments.done")["call_id"]

    def submit(cid: str) -> list[dict]:
        return d.send({"type": "conversation.item.create", "event_id": "o1",
                       "item": {"type": "function_call_output", "call_id": cid, "output": "sunny"}})

    [error] = submit("call_nope")
    assert error["error"]["code"] == "invalid_function_call_output" and error["error"]["param"] == "item.call_id"
    assert error["error"]["event_id"] == "o1"
    assert "conversation.item.added" in types(submit(call_id))
    assert errors(submit(call_id)) == [("invalid_function_call_output", "item.call_id")]


# ==================================================================================================== 5. cancel, epoch


def assert_cancelled_terminal(events: list[dict], rid: str, reason: str, *, cleared: bool = False) -> None:
    expected = (["output_audio_buffer.cleared"] if cleared else []) + CANCELLED_TERMINAL
    assert types(events) == expected
    if cleared:
        assert events[0]["response_id"] == rid
    done = one(events, "response.done")
    assert done["response_id"] == rid and done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": reason}
    assert [o["status"] for o in done["response"]["output"]] == ["incomplete"]


def assert_next_response_is_at_epoch(d: TieredDriver, epoch: int) -> None:
    speak(d, "Again")
    events = d.run()
    created = one(events, "response.created")
    assert created["response"]["metadata"]["epoch"] == epoch
    assert one(events, "response.speak")["metadata"]["epoch"] == epoch
    assert {a["metadata"]["epoch"] for a in of_type(events, AUDIO)} == {epoch}
    assert_spoken_reply(events, created["response_id"], "You said: Again.")


CANCELS = {
    "response.cancel": ({"type": "response.cancel"}, "client_cancelled"),
    "response.cancel{id}": ({"type": "response.cancel", "response_id": "resp_1"}, "client_cancelled"),
    "barge_in": ({"type": "barge_in"}, "barge_in"),
    "turn.signal{barge_in}": ({"type": "turn.signal", "event": "barge_in"}, "barge_in"),
    "signal_turn{barge_in}": ({"type": "signal_turn", "event": "barge_in"}, "barge_in"),
    "turn.signal{response.cancel}": ({"type": "turn.signal", "event": "response.cancel"}, "client_cancelled"),
}


@pytest.mark.parametrize("name", list(CANCELS))
def test_a_cancel_mid_response_ends_it_once_and_advances_the_epoch(tiered, name):
    event, reason = CANCELS[name]
    d = tiered()
    mid_response(d)
    cancelled = d.send(event)
    assert_cancelled_terminal(cancelled, "resp_1", reason)
    assert d.run() == []  # the core's cancel tail is never shown
    assert epoch_now(d) == 1
    assert_next_response_is_at_epoch(d, 1)
    assert not any(response_id_of(e) == "resp_1" for e in after(d.events, lambda e: e["type"] == "response.done"))


def test_output_audio_buffer_clear_mid_response_clears_then_cancels(tiered):
    d = tiered()
    mid_response(d)
    assert_cancelled_terminal(d.send({"type": "output_audio_buffer.clear"}), "resp_1", "output_audio_buffer_clear",
                              cleared=True)
    assert d.run() == [] and epoch_now(d) == 1
    assert_next_response_is_at_epoch(d, 1)


def test_input_cancel_mid_response_clears_input_then_cancels(tiered):
    d = tiered()
    mid_response(d)
    events = d.send({"type": "input.cancel"})
    assert events[0]["type"] == "input_audio_buffer.cleared"
    assert_cancelled_terminal(events[1:], "resp_1", "input_cancel")
    assert d.run() == [] and epoch_now(d) == 1
    assert_next_response_is_at_epoch(d, 1)


def test_response_cancel_with_nothing_open_is_response_not_active(tiered):
    d = tiered()
    assert errors(d.send({"type": "response.cancel", "event_id": "x"})) == [("response_not_active", "response_id")]
    assert errors(d.send({"type": "response.cancel", "response_id": "resp_7"})) == [
        ("response_not_active", "response_id")]
    assert epoch_now(d) == 0


@pytest.mark.parametrize("ending", ["completed", "cancelled"])
def test_response_cancel_naming_a_finished_response_is_silent(tiered, ending):
    d = tiered()
    if ending == "completed":
        speak(d)
        d.run()
    else:
        mid_response(d)
        d.send({"type": "response.cancel"})
        d.run()
    before = epoch_now(d)
    assert d.send({"type": "response.cancel", "response_id": "resp_1"}) == []
    assert epoch_now(d) == before


def test_a_cancel_naming_a_finished_response_while_another_is_open_leaves_it_alone(tiered):
    d = tiered()
    speak(d)
    d.run()
    events = mid_response(d, "Again")
    assert d.send({"type": "response.cancel", "response_id": "resp_1"}) == []
    assert_spoken_reply(events + d.run(), "resp_2", "You said: Again.")


def test_a_user_turn_over_an_open_response_cancels_it_as_new_response(tiered):
    d = tiered()
    speak(d, "Good morning how are you today my dear friend")
    run_until(d, AUDIO)
    speak(d, "Stop")
    events = d.run()
    assert "overlap.decision" in types(events)  # the model listens through the overlap, then takes the turn
    end = types(events).index("response.output_audio.done")
    terminal, second = events[end:end + len(CANCELLED_TERMINAL)], events[end + len(CANCELLED_TERMINAL):]
    assert_cancelled_terminal(terminal, "resp_1", "new_response")
    assert collapse(types(second)) == [*USER_TURN, *SPOKEN_RESPONSE]
    assert_spoken_reply(second, "resp_2", "You said: Stop.")
    assert {a["metadata"]["epoch"] for a in of_type(second, AUDIO)} == {1}


@pytest.mark.parametrize("event", [{"type": "barge_in"}, {"type": "input.cancel"},
                                   {"type": "turn.signal", "event": "barge_in"},
                                   {"type": "turn.signal", "event": "input.cancel"}], ids=lambda e: json.dumps(e))
def test_barge_in_and_input_cancel_always_advance_the_epoch(tiered, event):
    d = tiered()
    expected = ["input_audio_buffer.cleared"] if "input.cancel" in json.dumps(event) else []
    assert types(d.send(event)) == expected
    assert epoch_now(d) == 1
    speak(d)
    d.run()
    assert types(d.send(event)) == expected
    assert epoch_now(d) == 2
    assert_next_response_is_at_epoch(d, 2)


def test_output_audio_buffer_clear_after_a_completed_response_only_clears(tiered):
    d = tiered()
    speak(d)
    d.run()
    [cleared] = d.send({"type": "output_audio_buffer.clear"})
    assert cleared["type"] == "output_audio_buffer.cleared" and cleared["response_id"] == "resp_1"
    assert epoch_now(d) == 0  # commit_all_on_done left nothing unplayed


@pytest.mark.parametrize("busy", [False, True])
def test_another_turn_signal_is_echoed_as_a_turn_event(tiered, busy):
    d = tiered()
    if busy:
        mid_response(d)
    [echo] = d.send({"type": "turn.signal", "event": "user_gesture", "payload": {"x": 1}})
    assert {k: echo[k] for k in ("type", "session_id", "event", "turn_state", "epoch")} == {
        "type": "turn.event", "session_id": SID, "event": "user_gesture",
        "turn_state": "speaking" if busy else "listening", "epoch": 0}


# ==================================================================================================== 6. ledger


def ack(d: TieredDriver, **fields: Any) -> list[dict]:
    return d.send({"type": "playback.ack", **fields})


def sent_ms(events: list[dict], rid: str = "resp_1") -> int:
    return [a for a in of_type(events, AUDIO) if a["response_id"] == rid][-1]["metadata"]["playback"]["sent_ms"]


def test_a_completed_response_is_committed_in_full(tiered):
    d = tiered()
    speak(d)
    events = d.run()
    metadata = one(events, "response.done")["response"]["metadata"]
    assert metadata["playback"]["committed_ms"] == metadata["playback"]["sent_ms"] == sent_ms(events)
    assert metadata["committed"] is True


def test_playback_ack_answers_with_the_ledger_snapshot(tiered):
    d = tiered()
    events = mid_response(d)
    sent = sent_ms(events)
    assert sent > 100
    [reply] = ack(d, played_ms=100)
    event = reply["event"]
    assert reply["type"] == "playback.acknowledged" and "stale" not in event
    assert {k: event[k] for k in ("type", "session_id", "epoch", "response_id", "item_id", "played_ms",
                                  "committed_ms", "truncate", "history_committed")} == {
        "type": "playback.acknowledged", "session_id": SID, "epoch": 0, "response_id": "resp_1",
        "item_id": "item_resp_1", "played_ms": 100, "committed_ms": 100, "truncate": False,
        "history_committed": False}
    assert event["playback"]["sent_ms"] == sent
    assert (event["playback"]["played_ms"], event["playback"]["committed_ms"]) == (100, 100)
    assert event["playback"]["generated_ms"] >= sent


def test_playback_ack_overshoot_clamps_to_sent_ms(tiered):
    d = tiered()
    sent = sent_ms(mid_response(d))
    for alias in ("playback.ack", "audio.playback_ack"):
        [reply] = d.send({"type": alias, "played_ms": 10**9, "response_id": "resp_1", "item_id": "item_resp_1"})
        playback = reply["event"]["playback"]
        assert reply["event"]["played_ms"] == reply["event"]["committed_ms"] == sent
        assert playback == {**playback, "sent_ms": sent, "played_ms": sent, "committed_ms": sent}


@pytest.mark.parametrize("fields, code, param", [
    ({"response_id": "resp_1", "item_id": "item_resp_2"}, "playback_item_mismatch", "item_id"),
    ({"response_id": "resp_9"}, "playback_item_not_found", "response_id"),
    ({"item_id": "item_resp_9"}, "playback_item_not_found", "item_id"),
])
def test_playback_ack_naming_the_wrong_target_is_an_error(tiered, fields, code, param):
    d = tiered()
    mid_response(d)
    assert errors(ack(d, played_ms=10, **fields)) == [(code, param)]


def test_playback_ack_on_a_cancelled_response_is_stale(tiered):
    d = tiered()
    mid_response(d)
    ack(d, played_ms=100)
    d.send({"type": "response.cancel"})
    [reply] = ack(d, played_ms=10**6, response_id="resp_1")
    event = reply["event"]
    assert event["stale"] is True and event["history_committed"] is False and event["epoch"] == 1
    assert (event["played_ms"], event["committed_ms"]) == (100, 100)  # nothing changed


def test_playback_ack_after_a_later_user_turn_was_committed_is_stale(tiered):
    d = tiered()
    speak(d)
    d.run()
    speak(d, "Again")
    run_until(d, "input_audio_buffer.committed")
    [reply] = ack(d, played_ms=100, response_id="resp_1", truncate=True)
    assert reply["event"].get("stale") is True and reply["event"]["history_committed"] is False
    [retrieved] = d.send({"type": "conversation.item.retrieve", "item_id": "item_resp_1"})
    assert retrieved["item"]["content"][0]["transcript"] == "You said: Hello."


@pytest.mark.parametrize("requested, heard", [(0, ""), (200, "You"), (10**7, "You said: Hello.")])
def test_truncate_clamps_and_cuts_the_retrieved_transcript(tiered, requested, heard):
    d = tiered()
    speak(d)
    sent = sent_ms(d.run())
    [truncated] = d.send({"type": "conversation.item.truncate", "item_id": "item_resp_1", "content_index": 0,
                          "audio_end_ms": requested})
    assert {k: truncated[k] for k in ("type", "item_id", "content_index", "audio_end_ms")} == {
        "type": "conversation.item.truncated", "item_id": "item_resp_1", "content_index": 0,
        "audio_end_ms": min(requested, sent)}
    assert truncated["event"]["requested_audio_end_ms"] == requested
    [retrieved] = d.send({"type": "conversation.item.retrieve", "item_id": "item_resp_1"})
    assert retrieved["type"] == "conversation.item.retrieved"
    assert retrieved["item"]["content"] == [{"type": "output_audio", "transcript": heard}]


@pytest.mark.parametrize("event_type", ["conversation.item.retrieve", "conversation.item.delete",
                                        "conversation.item.truncate"])
def test_unknown_items_are_item_not_found(tiered, event_type):
    d = tiered()
    assert errors(d.send({"type": event_type, "item_id": "item_nope", "audio_end_ms": 0})) == [
        ("item_not_found", "item_id")]


def test_a_deleted_item_is_gone(tiered):
    d = tiered()
    speak(d)
    d.run()
    assert d.send({"type": "conversation.item.delete", "item_id": "item_turn_S_1"})[0] == {
        **d.events[-1], "type": "conversation.item.deleted", "item_id": "item_turn_S_1"}
    assert errors(d.send({"type": "conversation.item.retrieve", "item_id": "item_turn_S_1"})) == [
        ("item_not_found", "item_id")]
    assert errors(d.send({"type": "conversation.item.delete", "item_id": "item_turn_S_1"})) == [
        ("item_not_found", "item_id")]


def test_only_assistant_audio_items_can_be_truncated(tiered):
    d = tiered()
    speak(d)
    d.run()
    assert errors(d.send({"type": "conversation.item.truncate", "item_id": "item_turn_S_1", "audio_end_ms": 5})) == [
        ("bad_event", "item_id")]


# ==================================================================================================== 7. journal, lease


def spoken_session(tiered, **options: Any) -> tuple[TieredDriver, str]:
    d = tiered(**options)
    token = token_of(d)
    speak(d)
    d.run()
    return d, token


def test_session_created_carries_the_first_token_and_no_seq(tiered):
    d = tiered()
    created, updated = d.events[:2]
    assert created["attachment_generation"] == 1 and created["resume_token"].startswith("rt_")
    assert "server_event_seq" not in created and updated["server_event_seq"] == 1


def test_resume_replays_after_the_cursor_byte_identical_and_rotates_the_token(tiered):
    d, token = spoken_session(tiered)
    head = d.events[-1]["server_event_seq"]
    outcome = resume(d, token, 5)
    assert outcome.ok
    resumed, *replay = outcome.outputs
    body = json.loads(resumed.text)
    assert body["type"] == "session.resumed" and resumed.seq is None and "server_event_seq" not in body
    assert body["session_id"] == SID and body["attachment_generation"] == 2 and body["session"]["id"] == SID
    assert body["resume_token"].startswith("rt_") and body["resume_token"] != token
    assert [o.text for o in replay] == journaled_after(d, 5)
    assert [o.seq for o in replay] == list(range(6, head + 1))
    # the old socket was still attached: it is told it was replaced
    assert outcome.replaced is not None and json.loads(outcome.replaced.text) == {
        "type": "session.replaced", "event_id": json.loads(outcome.replaced.text)["event_id"], "session_id": SID,
        "attachment_generation": 1}

    [refused] = texts(resume(d, token, head).outputs)
    assert refused["error"]["code"] == "invalid_resume_token" and "server_event_seq" not in refused
    again = resume(d, body["resume_token"], head)
    assert again.ok and json.loads(again.outputs[0].text)["attachment_generation"] == 3
    assert again.outputs[1:] == []


def test_resume_after_a_detach_replays_what_was_generated_meanwhile(tiered):
    d = tiered()
    token = token_of(d)
    mid_response(d)
    cursor = d.events[-1]["server_event_seq"]
    assert detach(d) == []
    d.run()  # the response keeps generating while detached; everything is journaled
    assert d.events[-1]["type"] == "rate_limits.updated"
    outcome = resume(d, token, cursor)
    assert outcome.ok and outcome.replaced is None
    replay = texts(outcome.outputs[1:])
    assert [e["server_event_seq"] for e in replay] == list(range(cursor + 1, d.events[-1]["server_event_seq"] + 1))
    assert replay == d.events[-len(replay):]
    assert d.advance(d.session.options.disconnect_grace_s + 1) == []  # re-attached: no grace expiry


def test_event_ack_trims_the_journal_and_an_older_cursor_needs_a_resync(tiered):
    d, token = spoken_session(tiered)
    assert d.send({"type": "session.event_ack", "server_event_seq": 20}) == []
    [resync] = texts(resume(d, token, 10).outputs)
    assert resync == {"type": "session.resync_required", "event_id": resync["event_id"], "session_id": SID,
                      "reason": "journal_gap"}
    outcome = resume(d, token, 20)
    assert outcome.ok and [o.seq for o in outcome.outputs[1:]][:1] == [21]


def test_session_resumed_carries_the_input_receipt(tiered):
    """§6.5: how much audio the session took in, and the last append it handled (an error answers one)."""
    d = tiered()
    token = token_of(d)
    assert d.session.capabilities["supports_input_receipt"] is True
    assert d.append(bytes(2560), event_id="a1") == [] and d.append(bytes(1000), event_id="a2") == []
    assert errors(d.append(bytes(3), event_id="odd")) == [("bad_event", "audio")]  # not whole samples: refused
    assert d.send({"type": "input_audio_buffer.append", "video_frames": ["AAAA"], "event_id": "v"}) == []
    detach(d)
    outcome = resume(d, token, d.events[-1]["server_event_seq"])
    body = json.loads(outcome.outputs[0].text)
    assert body["input_received"] == {"audio_bytes": 3560, "appends": 2, "last_append_event_id": "odd"}
    d.append(bytes(640))  # no event id
    outcome = resume(d, body["resume_token"], d.events[-1]["server_event_seq"])
    assert json.loads(outcome.outputs[0].text)["input_received"] == {
        "audio_bytes": 4200, "appends": 3, "last_append_event_id": None}


def test_held_audio_refused_before_the_prefill_is_not_received():
    d = TieredDriver(options=TieredOptions(max_pending_input_bytes=4000), defer_effects=True)
    assert types(d.send({"type": "session.update", "session": {"instructions": "Be brief."}})) == []
    assert d.append(bytes(2560), event_id="a1") == []
    assert errors(d.append(bytes(2560), event_id="a2")) == [("input_backpressure", None)]
    d.driver.complete_pending(every=True)
    token = token_of(d)
    outcome = resume(d, token, 0)
    receipt = json.loads(outcome.outputs[0].text)["input_received"]
    assert receipt == {"audio_bytes": 2560, "appends": 1, "last_append_event_id": "a2"}
    assert d.session.input_buffer.uncommitted == 2560  # the refused append is not in the buffer either


def test_the_openai_lane_has_no_input_receipt(tiered):
    assert tiered(lane="openai").session.capabilities["supports_input_receipt"] is False


def test_a_cursor_beyond_the_head_is_a_resume_conflict(tiered):
    d, token = spoken_session(tiered)
    [error] = texts(resume(d, token, d.events[-1]["server_event_seq"] + 1).outputs)
    assert error["error"]["code"] == "session_resume_conflict"


@pytest.mark.parametrize("seq", [10**6, -1, "3", True])
def test_an_event_ack_outside_the_journal_is_invalid_event_ack(tiered, seq):
    d = tiered()
    assert errors(d.send({"type": "session.event_ack", "server_event_seq": seq})) == [
        ("invalid_event_ack", "server_event_seq")]


def test_journal_overflow_is_announced_live_once_and_a_later_resume_must_resync(tiered):
    d, token = spoken_session(tiered, journal_max_bytes=3_000)
    notices = of_type(d.events, "session.resync_required")
    assert notices == [{"type": "session.resync_required", "event_id": notices[0]["event_id"], "session_id": SID,
                        "reason": "journal_overflow"}]
    assert d.events.index(notices[0]) > 2  # live, in the middle of the stream; seqs keep running (invariants)
    speak(d, "Again")
    d.run()
    assert len(of_type(d.events, "session.resync_required")) == 1
    [resync] = texts(resume(d, token, d.events[-1]["server_event_seq"]).outputs)
    assert resync["type"] == "session.resync_required" and resync["reason"] == "journal_overflow"


def test_detach_then_grace_expires_the_session(tiered):
    d = tiered()
    token = token_of(d)
    assert detach(d) == []
    grace = d.session.options.disconnect_grace_s
    assert d.advance(grace - 0.01) == []
    [expired] = d.advance(0.01)
    assert {k: expired[k] for k in ("type", "session_id", "reason")} == {
        "type": "session.expired", "session_id": SID, "reason": "disconnect_grace_expired"}
    assert d.outputs[-1] == CloseTransport(1000, "disconnect_grace_expired")
    assert d.session.closed
    assert d.send({"type": "session.heartbeat"}) == []
    assert texts(resume(d, token, 0).outputs)[0]["error"]["code"] == "session_resume_expired"


def test_the_idle_ttl_expires_a_quiet_session_and_activity_postpones_it(tiered):
    d = tiered({"instructions": "Be brief.", "idle_timeout_s": 5})
    assert one(d.events, "session.updated")["session"]["idle_timeout_s"] == 5.0
    assert d.advance(4.0) == []
    assert types(d.send({"type": "session.heartbeat"})) == ["session.heartbeat_ack"]  # a lease touch
    assert d.advance(4.9) == []
    [expired] = d.advance(0.2)
    assert expired["type"] == "session.expired" and expired["reason"] == "idle_ttl_expired"
    assert d.outputs[-1] == CloseTransport(1000, "idle_ttl_expired") and d.session.closed


def test_heartbeat_is_acknowledged_and_journaled(tiered):
    d = tiered()
    [reply] = d.send({"type": "session.heartbeat"})
    assert reply == {"type": "session.heartbeat_ack", "event_id": reply["event_id"], "session_id": SID,
                     "server_event_seq": 2}


@pytest.mark.parametrize("alias", ["session.close", "close", "close_session"])
def test_session_close_closes_with_1000(tiered, alias):
    d = tiered()
    assert d.send({"type": alias}) == []
    [closed] = d.run()
    assert {k: closed[k] for k in ("type", "session_id", "epoch", "reason", "event")} == {
        "type": "session.closed", "session_id": SID, "epoch": 0, "reason": "client_close",
        "event": {"type": "session.closed", "reason": "client_close"}}
    assert isinstance(d.outputs[-1], CloseTransport) and d.outputs[-1].code == 1000
    assert d.session.closed and d.send({"type": "session.heartbeat"}) == []


def test_the_openai_lane_does_not_resume(tiered):
    d = tiered(lane="openai")
    [refused] = texts(resume(d, "rt_anything", 0).outputs)
    assert refused["error"]["code"] == "unsupported_session_resume"
    assert errors(d.send({"type": "session.resume", "session_id": SID, "resume_token": "rt_x"})) == [
        ("unsupported_session_resume", None)]


def test_a_late_session_resume_on_the_full_lane_is_refused_without_closing(tiered):
    d = tiered()
    assert errors(d.send({"type": "session.resume", "session_id": SID, "resume_token": token_of(d)})) == [
        ("unsupported_session_resume", None)]
    assert not d.session.closed


# ==================================================================================================== 8. every event type

MINIMAL_BODIES: dict[type, dict] = {
    P.SessionUpdate: {"session": {}},
    P.SessionHeartbeat: {},
    P.SessionEventAck: {"server_event_seq": 0},
    P.SessionClose: {},
    P.SessionResume: {"session_id": SID, "resume_token": "rt_x"},
    P.InputAudioBufferAppend: {"audio": base64.b64encode(SILENCE_FRAME).decode()},
    P.InputAudioBufferCommit: {},
    P.InputAudioBufferClear: {},
    P.InputCancel: {},
    P.InputTextAppend: {"text": "Hi"},
    P.ConversationItemCreate: {"item": USER_MESSAGE},
    P.ConversationItemRetrieve: {"item_id": "item_resp_1"},
    P.ConversationItemDelete: {"item_id": "item_resp_1"},
    P.ConversationItemTruncate: {"item_id": "item_resp_1", "audio_end_ms": 0},
    P.ResponseCreate: {},
    P.ResponseCancel: {},
    P.OutputAudioBufferClear: {},
    P.BargeIn: {},
    P.TurnSignal: {"event": "probe"},
    P.PlaybackAck: {"played_ms": 0},
}
SHAPE_ERRORS = {"unknown_event", "bad_event", "invalid_json", "missing_item_id", "event_too_large"}


def test_every_parser_class_has_a_minimal_body():
    assert set(MINIMAL_BODIES) == set(P.EVENT_CLASSES)


@pytest.mark.parametrize("phase", ["idle", "speaking"])
@pytest.mark.parametrize("name", sorted(P.EVENT_TYPES))
def test_every_client_event_type_and_alias_is_accepted(tiered, name, phase):
    d = tiered()
    if phase == "speaking":
        mid_response(d)
    events = d.send({"type": name, "event_id": "e1", **MINIMAL_BODIES[P.EVENT_TYPES[name]]}) + d.run()
    assert not {code for code, _ in errors(events)} & SHAPE_ERRORS, errors(events)


@pytest.mark.parametrize("frame, code, event_id", [
    (json.dumps({"type": "push_chunk", "event_id": "e1"}), "unknown_event", "e1"),
    (json.dumps({"type": "input.audio.append", "audio": ""}), "unknown_event", None),
    (json.dumps({"type": "response.nonsense"}), "unknown_event", None),
    ("{not json", "invalid_json", None),
    ("[1, 2]", "bad_event", None),
    (json.dumps({"event_id": "e2"}), "bad_event", "e2"),
    (b"\x00\x01", "bad_event", None),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "***", "event_id": "e3"}), "bad_audio", "e3"),
    (json.dumps({"type": "turn.signal", "event": ""}), "bad_event", None),
])
def test_malformed_frames_give_typed_errors(tiered, frame, code, event_id):
    d = tiered()
    d.driver.dispatch(d.session.receive(frame, d.clock.now))
    [error] = d.new_events()
    assert error["type"] == "error" and error["error"]["code"] == code
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"].get("event_id") == event_id
    assert not d.session.closed


# ==================================================================================================== 9. OpenAI lane


def _ids(value: Any, key: str = "") -> list[str]:
    if isinstance(value, dict):
        return [i for k, v in value.items() for i in _ids(v, k)]
    if isinstance(value, list):
        return [i for v in value for i in _ids(v, key)]
    return [value] if isinstance(value, str) and (key == "id" or key.endswith("_id")) else []


def assert_openai_compatible(events: list[dict]) -> None:
    assert not set(types(events)) & _TIER3
    for event in events:
        validate_openai_server_event(event)
        # every id the lane mints within OpenAI's 32 characters (LiveKit rewrites a longer call id)
        assert all(len(i) <= 32 for i in _ids(event)), (event["type"], _ids(event))


def test_the_openai_lane_speaks_cancels_calls_tools_and_errors_in_ga_events_only(tiered):
    d = tiered({"type": "realtime", "tools": [TOOL]}, lane="openai")
    hz = {"sample_rate_hz": 16_000}  # the OpenAI lane's default pcm16 input rate is 24 kHz

    speak(d, **hz)
    turn = d.run()
    assert collapse(types(turn)) == ["input_audio_buffer.speech_started", "transcription.delta+", *USER_TURN,
                                     *RESPONSE_OPEN, DELTAS, *MESSAGE_CLOSE, *RESPONSE_END]
    assert_spoken_reply(turn, "resp_1", "You said: Hello.")

    mid_response(d, "Again", **hz)
    assert_cancelled_terminal(d.send({"type": "response.cancel"}), "resp_2", "client_cancelled")
    mid_response(d, "Once more", **hz)
    barge = d.send({"type": "barge_in"})
    assert one(barge, "response.done")["response"]["status_details"] == {"type": "cancelled",
                                                                         "reason": "turn_detected"}
    assert one(barge, "response.done")["response"]["metadata"] == {"epoch": "1"}  # GA metadata: strings
    d.run()

    speak(d, WEATHER_CALL, **hz)
    a = run_until(d, "rate_limits.updated")
    call = one(a, "response.function_call_arguments.done")
    # response A is the call alone: its silence before the call is no message (Pipecat plays any as speech)
    assert [o["type"] for o in one(a, "response.done")["response"]["output"]] == ["function_call"]
    assert AUDIO not in types(a) and "response.content_part.added" not in types(a)
    d.send({"type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}})
    assert d.send({"type": "response.create"}) == []
    b = d.run()
    assert_spoken_reply(b, one(b, "response.created")["response_id"], "The result is sunny.")

    assert errors(d.send({"type": "response.cancel"})) == [("response_cancel_not_active", "response_id")]
    assert errors(d.send({"type": "nope"})) == [("unknown_event", "type")]
    assert d.send({"type": "session.heartbeat"}) == [] and d.send({"type": "turn.signal", "event": "x"}) == []
    d.send({"type": "session.close"})
    d.run()
    assert d.outputs[-1] == CloseTransport(1000, "client_close", "client_close")  # its reason, and its label
    assert_openai_compatible(d.events)


MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
HZ16 = {"sample_rate_hz": 16_000}  # the OpenAI lane's default pcm16 input rate is 24 kHz
OPENAI_RESPONSE = [*RESPONSE_OPEN, DELTAS, *MESSAGE_CLOSE, *RESPONSE_END]
OPENAI_COMMIT = USER_TURN[1:]  # client-owned turns show no speech events


def test_openai_manual_turns_the_commit_seals_and_settles_and_only_response_create_answers(tiered):
    d = tiered(MANUAL, lane="openai")
    assert d.session.settings.client_turns and not d.session.core.auto_eou
    speak(d, "Hello there", **HZ16)  # speech then silence: the model's own EOU would have answered by now
    assert d.run() == []  # no speech events, no transcription deltas, no answer
    assert d.send({"type": "input_audio_buffer.commit"}) == []
    committed = d.run()
    assert types(committed) == OPENAI_COMMIT
    assert one(committed, "conversation.item.input_audio_transcription.completed")["transcript"] == "Hello there"
    assert d.run() == [] and d.session.core.turn_state is TurnState.HELD  # settled, and nothing answers until response.create
    assert d.send({"type": "response.create", "event_id": "r1"}) == []
    events = d.run()
    assert collapse(types(events)) == OPENAI_RESPONSE
    assert_spoken_reply(events, "resp_1", "You said: Hello there.")
    assert_openai_compatible(d.events)


def test_openai_response_metadata_is_echoed_on_the_response_it_opens_and_tool_choice_auto_is_no_override(tiered):
    """LiveKit matches a ``generate_reply`` to its response by ``metadata.client_event_id`` and asks for the reply
    after a tool with ``tool_choice: "auto"`` (the session's own): both served, on the response each opens."""
    d = tiered({"type": "realtime", "tools": [TOOL], "audio": {"input": {"turn_detection": None}}}, lane="openai")
    speak(d, "Hello there", **HZ16)
    d.run()
    d.send({"type": "input_audio_buffer.commit"})
    d.run()
    assert d.send({"type": "response.create", "event_id": "r1",
                   "response": {"metadata": {"client_event_id": "r1"}, "instructions": None}}) == []
    events = d.run()
    created, done = one(events, "response.created"), one(events, "response.done")
    assert created["response"]["metadata"] == done["response"]["metadata"] == {"client_event_id": "r1"}
    # a tool turn: the reply after the output is asked for with tool_choice auto
    speak(d, WEATHER_CALL, **HZ16)
    d.run()
    d.send({"type": "input_audio_buffer.commit"})
    d.run()
    d.send({"type": "response.create", "event_id": "r2", "response": {"metadata": {"client_event_id": "r2"}}})
    call = one(run_until(d, "rate_limits.updated"), "response.function_call_arguments.done")
    assert len(call["call_id"]) <= 32
    d.send({"type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}})
    assert d.send({"type": "response.create", "event_id": "r3",
                   "response": {"tool_choice": "auto", "metadata": {"client_event_id": "r3"}}}) == []
    b = d.run()
    assert one(b, "response.created")["response"]["metadata"] == {"client_event_id": "r3"}
    assert_spoken_reply(b, one(b, "response.created")["response_id"], "The result is sunny.")
    # without metadata: the lane's own
    speak(d, "Again", **HZ16)
    d.run()
    d.send({"type": "input_audio_buffer.commit"})
    d.run()
    d.send({"type": "response.create"})
    assert one(d.run(), "response.created")["response"]["metadata"] == {"epoch": "0"}
    assert_openai_compatible(d.events)


@pytest.mark.parametrize("interrupt", [None, True, False])
def test_openai_semantic_vad_honours_interrupt_response(tiered, interrupt):
    """GA: interrupt_response (default true) cancels the response when the user's speech starts, so nothing of it
    follows speech_started (Pipecat truncates there, and late deltas would restart its playback); false: the
    model keeps the floor and the answer plays on."""
    td = {"type": "semantic_vad"} if interrupt is None else {"type": "semantic_vad", "interrupt_response": interrupt}
    d = tiered({"type": "realtime", "audio": {"input": {"turn_detection": td}}}, lane="openai")
    first = mid_response(d, "Tell me a long story", **HZ16)
    rid = one(first, "response.created")["response_id"]
    d.append(render_speech("wait"), **HZ16)
    later = run_until(d, "input_audio_buffer.speech_started")
    later += d.run(max_positions=6)
    started = next(i for i, e in enumerate(later) if e["type"] == "input_audio_buffer.speech_started")
    old_audio_after = [e for e in later[started:] if e["type"] == AUDIO and e["response_id"] == rid]
    if interrupt is False:
        assert old_audio_after and not [e for e in later if e["type"] == "response.done"]
    else:
        done = [e for e in later if e["type"] == "response.done" and e["response"]["id"] == rid]
        assert done and done[0]["response"]["status"] == "cancelled"
        assert old_audio_after == []
    d.run()
    assert_openai_compatible(d.events)


def test_openai_manual_commit_and_response_create_at_once_before_the_prefill(tiered):
    """A push-to-talk client that does not wait: appends, commit and response.create all before the prefill is
    done; the response.create waits behind the commit (it overtook it and found nothing held)."""
    d = TieredDriver(options=TieredOptions(lane="openai", autostart=True, model="sim"), defer_effects=True)
    d.driver.dispatch(d.session.poll(d.clock.now).outputs)  # the first poll issues the default prompt's prefill
    assert types(d.new_events()) == ["session.created"] and len(d.driver.pending) == 1
    assert types(d.send({"type": "session.update", "session": MANUAL})) == ["session.updated"]  # same prompt
    assert not d.session.core.configured
    speak(d, "Hello there", silence=0, **HZ16)
    assert d.send({"type": "input_audio_buffer.commit"}) + d.send({"type": "response.create"}) == []
    assert d.driver.complete_pending()
    events = d.run()
    assert collapse(types(events)) == [*OPENAI_COMMIT, *OPENAI_RESPONSE]
    assert one(events, "conversation.item.input_audio_transcription.completed")["transcript"] == "Hello there"
    assert_spoken_reply(events, "resp_1", "You said: Hello there.")
    check_invariants(d.events, tier3=False)


def test_openai_manual_commit_of_silence_is_refused_with_its_response_create():
    d = TieredDriver(options=TieredOptions(lane="openai", autostart=True, model="sim"))
    d.run()
    d.send({"type": "session.update", "session": MANUAL})
    d.append(SILENCE_FRAME * 12, **HZ16)
    d.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    d.send({"type": "response.create", "event_id": "r1"})
    assert [(e["error"]["code"], e["error"]["event_id"]) for e in d.run()] == [
        ("input_audio_buffer_empty", "c1"), ("response_create_without_input", "r1")]


def test_openai_manual_commit_during_an_answer_supersedes_it(tiered):
    d = tiered(MANUAL, lane="openai")
    speak(d, "Hello", **HZ16)
    d.send({"type": "input_audio_buffer.commit"})
    d.send({"type": "response.create"})
    run_until(d, AUDIO)
    speak(d, "Stop", silence=0, **HZ16)  # the user talks over the answer and commits
    d.send({"type": "input_audio_buffer.commit"})
    events = d.run()
    done = one(events, "response.done")
    assert (done["response_id"], done["response"]["status"]) == ("resp_1", "cancelled")
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert types(events)[types(events).index("response.done") + 2:] == OPENAI_COMMIT  # after rate_limits.updated
    assert one(events, "conversation.item.input_audio_transcription.completed")["transcript"] == "Stop"
    d.send({"type": "response.create"})
    assert_spoken_reply(d.run(), "resp_2", "You said: Stop.")


def test_openai_model_turns_absorb_a_response_create_while_the_answer_opens_or_plays(tiered):
    d = tiered(lane="openai")
    assert d.session.settings.turn_detection == {"type": "semantic_vad"} and d.session.settings.model_eou
    speak(d, "Hello", **HZ16)
    turn = run_until(d, "input_audio_buffer.committed")
    assert d.send({"type": "response.create"}) == []  # being opened
    turn += run_until(d, AUDIO)
    assert d.send({"type": "response.create"}) == []  # open
    turn += d.run()
    assert collapse(types(turn)) == ["input_audio_buffer.speech_started", "transcription.delta+", *USER_TURN,
                                     *OPENAI_RESPONSE]
    assert_spoken_reply(turn, "resp_1", "You said: Hello.")
    # once it is done there is nothing to answer: the model speaks first (the simulator greets)
    assert d.send({"type": "response.create"}) == []
    assert_spoken_reply(d.run(), "resp_2", "Hello! How can I help?")


def test_the_full_lane_keeps_null_turn_detection_model_owned_and_errors_on_a_second_create(tiered):
    d = tiered()  # DuplexClient's session: turn_detection null
    assert not d.session.settings.client_turns and d.session.core.auto_eou
    speak(d)
    turn = run_until(d, AUDIO)
    assert "input_audio_buffer.speech_started" in types(turn)
    assert errors(d.send({"type": "response.create"})) == [("response_already_active", None)]
    d.run()


@pytest.mark.parametrize("response, param", [
    ({"conversation": "none"}, "response.conversation"),
    ({"input": []}, "response.input"),
    ({"prompt": {"id": "p"}}, "response.prompt"),
    ({"output_modalities": ["text"]}, "response.output_modalities"),
    ({"modalities": ["audio", "text"]}, "response.modalities"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}}},
     "response.audio.output.voice"),
    ({"audio": {"output": {"format": {"type": "audio/pcma"}}}}, "response.audio.output.format"),
])
def test_openai_lane_per_response_overrides_the_model_cannot_honour(tiered, response, param):
    d = tiered(MANUAL, lane="openai")
    d.send({"type": "conversation.item.create", "item": USER_MESSAGE})
    assert errors(d.send({"type": "response.create", "response": response})) == [
        ("unsupported_native_response_options", param)]
    # the staged text is still there: an override-free response.create answers it
    assert d.send({"type": "response.create", "response": {"output_modalities": ["audio"], "metadata": {"k": "v"},
                                                           "conversation": "auto"}}) == []
    assert_spoken_reply(d.run(), "resp_1", "You said: Good morning.")


def test_the_openai_lane_clear_before_any_response_stays_ga_valid(tiered):
    d = tiered(lane="openai")
    assert_openai_compatible(d.send({"type": "output_audio_buffer.clear"}))


def test_a_second_commit_after_a_client_commit_is_input_audio_buffer_empty():
    d = TieredDriver()
    d.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    d.run()
    d.append(render_speech("hello"))
    d.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    assert types(d.run())[-1] == "rate_limits.updated"
    again = d.send({"type": "input_audio_buffer.commit", "event_id": "c2"})
    assert [(e["type"], e["error"]["code"], e["error"]["event_id"]) for e in again] == [
        ("error", "input_audio_buffer_empty", "c2")
    ]


# Tier 2 events carry the seed's additive extras in the full lane (dict metadata, nested echoes); Tier 1 events
# have exactly the GA shape in both lanes.
_TIER2 = {"session.created", "session.updated", "response.created", "response.done", "response.output_audio.delta",
          "input_audio_buffer.committed", "conversation.item.added", "conversation.item.created",
          "conversation.item.done", "conversation.item.retrieved", "conversation.item.truncated", "error"}


def test_the_full_lane_tier1_events_validate_with_the_openai_types(tiered):
    from .compat import is_ga_event_type

    d = tiered({"tools": [TOOL]})
    speak(d)
    d.run()
    mid_response(d, "Again")
    d.send({"type": "response.cancel"})
    d.run()
    speak(d, WEATHER_CALL)
    call = one(run_until(d, "rate_limits.updated"), "response.function_call_arguments.done")
    d.send({"type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}})
    d.send({"type": "response.create"})
    d.run()
    tier1 = [e for e in d.events if is_ga_event_type(e["type"]) and e["type"] not in _TIER2]
    assert {e["type"] for e in tier1} >= {"input_audio_buffer.speech_started", "response.output_item.added",
                                           "response.output_audio_transcript.delta", "rate_limits.updated",
                                           "response.function_call_arguments.done"}
    for event in tier1:
        validate_openai_server_event(event)


def test_a_text_only_session_gets_output_text_events_and_a_text_part(tiered):
    d = tiered({"output_modalities": ["text"]})
    speak(d)
    turn = d.run()
    assert not of_type(turn, AUDIO) and not of_type(turn, "response.speak")
    deltas = of_type(turn, "response.output_text.delta")
    assert "".join(e["delta"] for e in deltas) == one(turn, "response.output_text.done")["text"] == "You said: Hello."
    assert one(turn, "response.content_part.added")["part"] == {"type": "text", "text": ""}
    assert one(turn, "response.content_part.done")["part"] == {"type": "text", "text": "You said: Hello."}
    item = one(turn, "response.output_item.done")["item"]
    assert item["content"] == [{"type": "output_text", "text": "You said: Hello."}]


def test_g711_output_is_encoded_at_8_khz(tiered):
    from vllm_omni_voicechat.audio.g711 import ulaw_decode

    d = tiered({"output_audio_format": "g711_ulaw"})
    speak(d)
    turn = d.run()
    deltas = of_type(turn, AUDIO)
    assert {(e["format"], e["sample_rate_hz"]) for e in deltas} == {("g711_ulaw", 8_000)}
    pcm = ulaw_decode(output_pcm(turn))
    ledger = one(turn, "response.done")["response"]["metadata"]["playback"]
    assert abs(len(pcm) / 8 - ledger["sent_ms"]) <= 1  # one byte per sample; sent_ms counts what went out


def test_a_commit_sent_while_the_first_prefill_runs_waits_for_it_and_gets_its_response():
    """An OpenAI client that streams and commits before the autostart prefill is done (its session.update left the
    prompt as it was, so session.updated came at once): the commit waits with the audio instead of failing with
    session_not_configured and leaving the held audio without a turn."""
    from vllm_omni_voicechat.session.core import SessionCore
    from vllm_omni_voicechat.session.events import Prefill
    from vllm_omni_voicechat.sim.model import SimulatorModel
    from vllm_omni_voicechat.wire.tiered.connection import TieredSession

    from .tiered_harness import tiered_core_config

    s = TieredSession(SessionCore(tiered_core_config()), TieredOptions(lane="openai", model="sim", autostart=True))
    model = SimulatorModel()
    wire: list[dict] = [o.json() for o in s.start(0.0) if isinstance(o, WireText)]
    tick = s.poll(0.0)
    prefills = [o for o in tick.outputs if isinstance(o, Prefill)]
    assert len(prefills) == 1 and tick.position is None

    def send(event: dict, now: float) -> None:
        out = s.receive(json.dumps(event), now)
        wire.extend(o.json() for o in out if isinstance(o, WireText))

    send({"type": "session.update", "session": {"type": "realtime"}}, 0.01)
    pcm = render_speech("hello") + SILENCE_FRAME * 3
    for i in range(0, len(pcm), 2560):
        audio = base64.b64encode(pcm[i:i + 2560]).decode()
        send({"type": "input_audio_buffer.append", "audio": audio, "sample_rate_hz": 16_000}, 0.02)
    send({"type": "input_audio_buffer.commit", "event_id": "c1"}, 0.03)
    assert [e for e in wire if e["type"] == "error"] == []

    model.prefill(prefills[0].prompt)
    now = 0.5
    wire.extend(o.json() for o in s.prefilled(now) if isinstance(o, WireText))
    for _ in range(2000):
        tick = s.poll(now)
        wire.extend(o.json() for o in tick.outputs if isinstance(o, WireText))
        if any(e["type"] == "response.done" for e in wire):
            break
        if tick.position is not None:
            result = model.step(tick.position.input)
            now += 0.01
            wire.extend(o.json() for o in s.complete(tick.position, result, now) if isinstance(o, WireText))
        elif tick.wake_at is not None:
            now = max(now, tick.wake_at)
    kinds = types(wire)
    assert "error" not in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created") < kinds.index(
        "response.done")
    transcript = "".join(e["delta"] for e in wire if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == "You said: hello."


def test_after_the_fatal_position_limit_mid_response_only_terminals_follow():
    """The resampler's unsent tail of a response failed by a fatal error is dropped, not flushed as more deltas."""
    from vllm_omni_voicechat.sim.model import SimBehaviour
    from vllm_omni_voicechat.trace import TraceChecker

    d = TieredDriver(behaviour=SimBehaviour(endless_response=True), max_session_model_frames=120)
    d.send({"type": "session.update", "session": {}})
    d.run()
    d.append(render_speech("hello"))
    d.send({"type": "input_audio_buffer.commit"})
    d.run()
    kinds = types(d.events)
    after = kinds[kinds.index("error"):]
    assert after == ["error", "response.output_audio.done", "response.output_audio_transcript.done",
                     "response.content_part.done", "response.output_item.done", "conversation.item.done",
                     "response.done", "rate_limits.updated", "session.closed"]
    assert d.events[kinds.index("error")]["error"]["code"] == "session_position_limit"
    checker = TraceChecker(dialect="tiered")
    for event in d.events:
        checker.server_event(event)
    checker.transport_closed(d.outputs[-1].code)
    checker.check()


def test_response_done_carries_usage_in_80_ms_positions_and_model_text_tokens(tiered):
    """OpenAI clients read ``response.usage``; here a token is one 80 ms position of audio (heard since the previous
    response opened; sent in this one) or one model text token."""
    from vllm_omni_voicechat.session import events as ev

    class Recorder:  # sees the core's native events, as a tally does
        def __init__(self) -> None:
            self.native: list = []

        def observe_all(self, outputs: list, now: float) -> None:
            self.native += outputs

        def wire_error(self, code: str) -> None:
            pass

    for lane in ("full", "openai"):
        d = tiered(lane=lane)
        d.session.tally = recorder = Recorder()
        speak(d, **({"sample_rate_hz": 16_000} if lane == "openai" else {}))
        events = d.run()
        native = recorder.native
        (done,) = [e for e in events if e["type"] == "response.done"]
        created_at = next(i for i, o in enumerate(native) if isinstance(o, ev.ResponseCreated))
        heard = sum(1 for o in native[:created_at]
                    if isinstance(o, ev.PositionMetrics) and o.frame is not None and o.input_audio)
        text = sum(1 for o in native if isinstance(o, ev.TextDelta))
        audio_ms = sum(len(o.pcm) for o in native if isinstance(o, ev.AudioDelta)) * 1000 // (2 * 22_050)
        usage = done["response"]["usage"]
        assert usage["input_token_details"] == {"text_tokens": 0, "audio_tokens": heard, "cached_tokens": 0}
        assert heard > 10 and text > 0
        assert usage["output_token_details"] == {"text_tokens": text, "audio_tokens": -(-audio_ms // 80)}
        assert usage["output_tokens"] == text + -(-audio_ms // 80)
        assert usage["input_tokens"] == heard
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        if lane == "openai":  # the full lane's metadata is Tier 3's own
            validate_openai_server_event(done)


def test_one_resampler_serves_the_session_and_ended_responses_keep_none(tiered, monkeypatch):
    """A resampler per response cost a soxr init each, and its C memory lived as long as the response's record
    (the whole session): one per session, drained at every terminal; a rate change makes the next one anew."""
    made: list[Any] = []

    class Counted(tiered_projector.OutputEncoder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(tiered_projector, "OutputEncoder", Counted)
    d = tiered()
    speak(d, "Hello")
    assert_spoken_reply(d.run(), "resp_1", "You said: Hello.")
    mid_response(d, "Wait")
    assert_cancelled_terminal(d.send({"type": "response.cancel"}), "resp_2", "client_cancelled")
    d.run()
    assert_next_response_is_at_epoch(d, 1)  # resp_3 speaks clean audio through the cleared resampler
    projector = d.session.projector
    assert len(made) == 1 and made[0].sample_rate == 24_000
    assert [r.encoder for r in projector.responses.values()] == [None, None, None]

    d.send({"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/pcm",
                                                                                   "rate": 16000}}}}})
    speak(d, "Hi")
    events = d.run()
    assert {a["sample_rate_hz"] for a in of_type(events, AUDIO)} == {16_000}
    assert [e.sample_rate for e in made] == [24_000, 16_000]
    assert all(r.encoder is None for r in projector.responses.values())
