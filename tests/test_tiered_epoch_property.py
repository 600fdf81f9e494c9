"""Property: random interleavings of speech, silence, positions and cancels keep the §4 invariants on the wire.

One tiered session on the simulator per example. Besides the trace invariants of ``test_tiered_session``, the epoch
is checked around each cancel-type client event (white-box, through the projector): ``barge_in`` and
``input.cancel`` always advance it by one, ``response.cancel`` only when a response is open, and
``output_audio_buffer.clear`` when one is open or the last one has unplayed audio; no audio delta of an epoch the
session has moved past is ever sent afterwards.
"""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.speech import render_speech

from .helpers import SILENCE_FRAME
from .test_tiered_session import AUDIO, check_invariants
from .tiered_harness import TieredDriver

WORDS = ("Hello", "Good morning", "What time is it")
CANCELS = ("response.cancel", "output_audio_buffer.clear", "barge_in", "input.cancel")

actions = st.lists(
    st.one_of(
        st.tuples(st.just("speech"), st.sampled_from(WORDS)),
        st.tuples(st.just("silence"), st.integers(1, 14)),
        st.tuples(st.just("run"), st.integers(1, 25)),
        st.tuples(st.just("cancel"), st.sampled_from(CANCELS)),
    ),
    min_size=1,
    max_size=14,
)


@functools.cache
def speech(text: str) -> bytes:
    return render_speech(text)


def expected_advance(d: TieredDriver, cancel: str) -> int:
    proj = d.session.projector
    if cancel in ("barge_in", "input.cancel"):
        return 1
    if cancel == "response.cancel":
        return int(proj.active is not None)
    return int(proj.active is not None or (proj.last is not None and proj.last.ledger.unplayed))


def step(d: TieredDriver, action: tuple) -> None:
    kind, arg = action
    if kind == "speech":
        d.append(speech(arg))
    elif kind == "silence":
        d.append(SILENCE_FRAME * arg)
    elif kind == "run":
        d.run(max_positions=arg)
    else:
        before, advance = d.session.projector.epoch, expected_advance(d, arg)
        d.send({"type": arg})
        assert d.session.projector.epoch == before + advance, f"{arg}: epoch {before} -> {d.session.projector.epoch}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_random_interleavings_keep_the_epoch_invariants(script):
    d = TieredDriver()
    d.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    d.run()
    for action in script:
        floor, seen = d.session.projector.epoch, len(d.events)
        step(d, action)
        for event in d.events[seen:]:
            if event["type"] == AUDIO:  # never audio of an epoch the session had already left
                assert event["metadata"]["epoch"] >= floor
    d.append(SILENCE_FRAME * 14)  # let any pending turn end, then drain
    d.run()
    assert not d.session.closed
    check_invariants(d.events)
