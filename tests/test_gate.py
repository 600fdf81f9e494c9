"""The leading-silence gate and onset pre-roll selection."""

from __future__ import annotations

from vllm_omni_voicechat.session.gate import InputGate, MicFrame

from .helpers import LOUD_NOISE_FRAME, SILENCE_FRAME


def frames(pattern: str, gate: InputGate) -> list[MicFrame]:
    return [gate.classify(LOUD_NOISE_FRAME if c == "L" else SILENCE_FRAME, i) for i, c in enumerate(pattern)]


def test_turn_start_releases_onset_minus_two_context_frames():
    g = InputGate()
    for f in frames("QQQQQQQQQQLL", g):
        assert g.offer(f) is None
    assert [f.transport_frame for f in g.force_open()] == [8, 9, 10, 11]
    assert g.is_open


def test_all_quiet_preroll_is_released_whole_and_bounded():
    g = InputGate(preroll_frames=12)
    for f in frames("Q" * 20, g):
        g.offer(f)
    assert [f.transport_frame for f in g.force_open()] == list(range(8, 20))


def test_gate_opens_by_itself_after_consecutive_loud_frames():
    g = InputGate(open_after=3)
    fs = frames("QQQLQLLL", g)
    released = None
    for f in fs:
        released = g.offer(f) or released
    assert g.is_open
    # onset = first loud frame in the pre-roll (3) minus 2 context frames
    assert [f.transport_frame for f in released] == [1, 2, 3, 4, 5, 6, 7]
    assert g.offer(fs[0]) == [fs[0]]  # once open, frames pass straight through


def test_clear_drops_the_preroll():
    g = InputGate()
    for f in frames("LL", g):
        g.offer(f)
    g.clear()
    assert g.force_open() == []


def test_a_frame_is_ready_when_it_arrives_and_a_released_preroll_when_it_is_released():
    g = InputGate(open_after=3)
    held = [g.classify(SILENCE_FRAME, i, 1.0 + i) for i in range(3)]
    assert [f.ready for f in held] == [1.0, 2.0, 3.0]
    for f in held:
        assert g.offer(f) is None
    # The pre-roll could not run before the gate let it go: it is ready from the release, not from its arrival.
    assert [(f.transport_frame, f.ready) for f in g.force_open(9.5)] == [(0, 9.5), (1, 9.5), (2, 9.5)]
    loud = [g.classify(LOUD_NOISE_FRAME, i, 20.0 + i) for i in range(3, 6)]
    assert g.offer(loud[0]) == [loud[0]]  # open: a frame is ready from its arrival

    h = InputGate(open_after=2)
    assert h.offer(h.classify(LOUD_NOISE_FRAME, 0, 4.0)) is None
    opened = h.offer(h.classify(LOUD_NOISE_FRAME, 1, 4.08))  # the gate opens on its own at the second frame
    assert [(f.transport_frame, f.ready) for f in opened] == [(0, 4.08), (1, 4.08)]
