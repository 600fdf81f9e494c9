"""The epoch fence (docs/tiered-dialect.md §4): advancing, fencing native response ids, filtering native events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.session.events import (
    AudioDelta,
    AudioDone,
    Error,
    FunctionCallFailed,
    FunctionCallPublished,
    FunctionOutputApplied,
    PositionMetrics,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptCompleted,
    TranscriptDelta,
    TurnStarted,
    TypedAccepted,
)
from vllm_omni_voicechat.wire.tiered.epoch import EpochFence

PCM = b"\x00\x01" * 8


def metrics(response_id: str | None) -> PositionMetrics:
    return PositionMetrics(
        frame=1, transport_frame=1, kind="model", inference_ms=1.0, server_step_ms=1.0, budget_ms=80.0,
        over_budget=False, input_audio=False, output_audio=response_id is not None, audio_delivered=False,
        turn_id="turn_1", response_id=response_id,
    )


def response_events(rid: str, turn: str = "turn_1") -> list:
    """One of each native event that carries a response id."""
    return [
        ResponseCreated(turn, rid),
        TextDelta(turn, rid, "hi ", "hi "),
        AudioDelta(turn, rid, PCM),
        TextDone(turn, rid, "hi "),
        AudioDone(turn, rid, False),
        FunctionCallPublished(turn, rid, "call_1", "get_weather", "{}"),
        FunctionCallFailed(turn, rid, "call_1", "bad_arguments"),
        ResponseDone(turn, rid, "cancelled", "client_cancelled"),
        metrics(rid),
    ]


UNOWNED = [
    SpeechStarted("turn_2", "microphone", None, 7),
    TurnStarted("turn_2", 1, "evt_1"),
    TranscriptDelta("turn_2", "he", "he", "microphone", None),
    SpeechStopped("turn_2", "microphone", None),
    TranscriptCompleted("turn_2", "hello", "microphone", None),
    FunctionOutputApplied("call_1"),
    TypedAccepted("job_1"),
    Error("internal", "boom", False),
    SessionClosed("completed", "client_close"),
    metrics(None),
]


def test_a_fresh_fence_admits_everything():
    fence = EpochFence()
    assert fence.epoch == 0
    assert all(fence.admits(e) for e in response_events("resp_1") + UNOWNED)
    assert fence.fenced("resp_1") is False
    assert fence.fenced(None) is False


def test_advance_increments_and_fences_the_given_id():
    fence = EpochFence()
    assert fence.advance("resp_1") == 1 == fence.epoch
    assert fence.fenced("resp_1") is True
    assert fence.fenced("resp_2") is False
    assert fence.fenced(None) is False
    assert fence.advance("resp_2") == 2
    assert fence.fenced("resp_1") and fence.fenced("resp_2")


def test_advance_without_an_id_fences_nothing():
    fence = EpochFence()
    assert fence.advance() == 1
    assert fence.advance(None) == 2
    assert all(fence.admits(e) for e in response_events("resp_1") + UNOWNED)


def test_fencing_the_same_id_twice_still_advances():
    fence = EpochFence()
    fence.advance("resp_1")
    assert fence.advance("resp_1") == 2
    assert fence.fenced("resp_1")


@pytest.mark.parametrize("event", response_events("resp_1"), ids=lambda e: type(e).__name__)
def test_admits_drops_every_event_of_a_fenced_response(event):
    fence = EpochFence()
    fence.advance("resp_1")
    assert fence.admits(event) is False


@pytest.mark.parametrize("event", response_events("resp_2"), ids=lambda e: type(e).__name__)
def test_admits_keeps_events_of_other_responses(event):
    fence = EpochFence()
    fence.advance("resp_1")
    assert fence.admits(event) is True


@pytest.mark.parametrize("event", UNOWNED, ids=lambda e: type(e).__name__)
def test_events_without_a_response_id_are_always_admitted(event):
    fence = EpochFence()
    for rid in ("resp_1", "resp_2", "resp_3"):
        fence.advance(rid)
    assert fence.admits(event) is True


def test_the_fence_survives_later_epochs():
    fence = EpochFence()
    fence.advance("resp_1")
    for _ in range(5):
        fence.advance()
    assert fence.epoch == 6
    assert not fence.admits(AudioDelta("turn_1", "resp_1", PCM))
    assert not fence.admits(ResponseDone("turn_1", "resp_1", "cancelled", "barge_in"))


def test_objects_that_are_not_native_events_are_admitted():
    fence = EpochFence()
    fence.advance("resp_1")
    assert fence.admits(object())
    assert fence.admits({"response_id": "resp_1"})  # a dict has no response_id attribute


# --- property: random interleavings of native events and cancels ------------------------------------------

RIDS = ["resp_a", "resp_b", "resp_c", "resp_d"]


def native_for(kind: str, rid: str):
    turn = "turn_" + rid
    return {
        "created": lambda: ResponseCreated(turn, rid),
        "text": lambda: TextDelta(turn, rid, "x", "x"),
        "audio": lambda: AudioDelta(turn, rid, PCM),
        "text_done": lambda: TextDone(turn, rid, "x"),
        "audio_done": lambda: AudioDone(turn, rid, False),
        "call": lambda: FunctionCallPublished(turn, rid, "call_" + rid, "f", "{}"),
        "done": lambda: ResponseDone(turn, rid, "completed", ""),
        "metrics": lambda: metrics(rid),
    }[kind]()


OPS = st.one_of(
    st.tuples(
        st.just("emit"),
        st.sampled_from(RIDS),
        st.sampled_from(["created", "text", "audio", "text_done", "audio_done", "call", "done", "metrics"]),
    ),
    st.tuples(st.just("unowned"), st.integers(0, len(UNOWNED) - 1)),
    st.tuples(st.just("cancel"), st.one_of(st.none(), st.sampled_from(RIDS))),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=60))
def test_no_admitted_event_carries_a_fenced_id_and_epochs_never_decrease(ops):
    fence = EpochFence()
    fenced: set[str] = set()
    delivered: list[tuple[int, object]] = []  # (epoch at delivery, event)
    epochs = [fence.epoch]
    advances = 0
    for op in ops:
        if op[0] == "cancel":
            new = fence.advance(op[1])
            advances += 1
            assert new == fence.epoch == advances
            if op[1] is not None:
                fenced.add(op[1])
        else:
            event = UNOWNED[op[1]] if op[0] == "unowned" else native_for(op[2], op[1])
            rid = getattr(event, "response_id", None)
            admitted = fence.admits(event)
            # Exactly the events of fenced responses are dropped: nothing else is filtered.
            assert admitted is (rid is None or rid not in fenced)
            if admitted:
                delivered.append((fence.epoch, event))
        assert epochs[-1] <= fence.epoch
        epochs.append(fence.epoch)
        for rid in RIDS:
            assert fence.fenced(rid) is (rid in fenced)

    # After the cancel that fenced R, nothing admitted names R.
    for rid in fenced:
        fence_epoch = next(
            i + 1 for i, op in enumerate(o for o in ops if o[0] == "cancel") if op[1] == rid
        )
        assert not any(
            getattr(e, "response_id", None) == rid for at, e in delivered if at >= fence_epoch
        )
    assert [at for at, _ in delivered] == sorted(at for at, _ in delivered)
