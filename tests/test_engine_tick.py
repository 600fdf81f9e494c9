"""The engine tick (runner/tick.py): which positions go to the engine together, and when."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.errors import StateError
from vllm_omni_voicechat.runner.tick import EngineTick, Member, ReleaseReason

SLOT = 0.04
FRAME = 0.08


def tick_with(*keys: str, slot: float = SLOT) -> EngineTick:
    tick = EngineTick(slot)
    for key in keys:
        tick.enter(key)
    return tick


def in_step(tick: EngineTick, keys: list[str], at: float) -> float:
    """One round at ``at`` (nobody expected: each alone), then one at ``at`` + a frame (all together); returns the
    time of the next round."""
    for key in keys:
        release = tick.join(key, at, at)
        assert release is not None and release.size == 1
    at += FRAME
    for key in keys[:-1]:
        assert tick.join(key, at, at) is None
    release = tick.join(keys[-1], at, at)
    assert release is not None and [m.key for m in release.members] == keys
    return at + FRAME


def test_a_lone_session_is_released_at_once_and_on_time():
    tick = tick_with("a")
    for frame in range(3):
        at = frame * FRAME
        release = tick.join("a", ready=at, now=at)
        assert release is not None
        assert (release.tick, release.size, release.at, release.due, release.reason) == (
            frame, 1, at, at, ReleaseReason.COMPLETE)
        member = release.members[0]
        assert member == Member("a", at, at)
        assert release.held_ms(member) == 0.0
        assert release.late_ms(member) == 0.0
    assert tick.ticks == 3
    assert tick.deadline is None


def test_a_position_that_waited_behind_its_own_session_is_late_by_that_wait():
    tick = tick_with("a")
    release = tick.join("a", ready=1.0, now=1.05)
    assert release is not None
    assert release.late_ms(release.members[0]) == pytest.approx(50.0)
    assert release.held_ms(release.members[0]) == 0.0


def test_a_backlogged_position_in_a_tick_with_sessions_on_time_is_late_by_its_own_wait():
    """Sharing a tick with a fresh frame does not excuse a frame that waited 300 ms behind its own session."""
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    # a's frame was ready at `at` but its session's previous position ran until 0.31 s later
    assert tick.join("b", ready=at + 0.3, now=at + 0.3) is None  # a is expected: b waits for it
    release = tick.join("a", ready=at, now=at + 0.31)
    assert release is not None and release.size == 2
    b, a = release.members
    assert release.due == pytest.approx(at + 0.3)
    # b waited 10 ms for a position that was ready: the engine's 10 ms (as before this case was measured)
    assert release.late_ms(b) == pytest.approx(10.0) and release.held_ms(b) == pytest.approx(10.0)
    # the policy would have held a's position at most a slot from when it was ready
    assert release.late_ms(a) == pytest.approx(310.0 - SLOT * 1000.0)
    assert release.held_ms(a) == 0.0


def test_a_frame_that_arrived_before_it_was_handed_over_is_late_from_its_arrival_but_paced_from_its_ready_time():
    """The host hands a frame to its session only after the position in flight: its audio arrived earlier than the
    position was ready. The tick paces by ``ready`` (the session is expected a frame after it); lateness counts from
    the arrival, whatever tick the position shares."""
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    assert tick.join("b", at, at) is None  # a is expected
    # a's frame arrived 100 ms before it was handed over (at `at`); a joins 10 ms later
    release = tick.join("a", ready=at, now=at + 0.01, arrived=at - 0.1)
    assert release is not None and release.size == 2
    b, a = release.members
    assert a.late_from == pytest.approx(at - 0.1)
    assert release.late_ms(a) == pytest.approx(110.0 - SLOT * 1000.0)  # a slot of it the policy could have held
    assert release.late_ms(b) == pytest.approx(10.0)
    # the pace follows `ready`: both are expected a frame after `at`
    assert tick.join("a", at + FRAME, at + FRAME) is None and tick.waiting_for == {"b"}


def test_sessions_expected_within_the_slot_are_waited_for_then_released_together():
    tick = tick_with("a", "b")
    tick.join("a", 0.0, 0.0)
    tick.join("b", 0.03, 0.03)  # a is expected at 0.08, past b's slot (0.07): b goes alone
    assert tick.join("a", 0.08, 0.08) is None  # b is expected at 0.11, within a's slot (0.12)
    assert tick.waiting_for == {"b"}
    assert tick.deadline == pytest.approx(0.12)
    release = tick.join("b", 0.11, 0.11)
    assert release is not None and release.reason is ReleaseReason.COMPLETE
    assert [m.key for m in release.members] == ["a", "b"]
    assert release.due == pytest.approx(0.11)
    a, b = release.members
    assert release.held_ms(a) == pytest.approx(30.0)
    assert release.held_ms(b) == 0.0
    assert release.late_ms(a) == release.late_ms(b) == 0.0
    # both are expected a frame after their ready times: whoever comes first waits for the other
    assert tick.join("b", 0.19, 0.19) is None
    release = tick.join("a", 0.16, 0.20)  # a's frame was ready at 0.16 but its previous position ran until 0.20
    assert release is not None and release.size == 2
    assert release.due == pytest.approx(0.19)
    assert release.late_ms(release.members[1]) == pytest.approx(10.0)  # 10 ms after the policy meant to


def test_the_shorter_pairing_is_chosen_whichever_session_came_first():
    """Frames 79 ms apart pair across the frame boundary (a 1 ms hold), never within it (a 79 ms hold)."""
    tick = tick_with("a", "b")
    tick.join("a", 0.0, 0.0)
    tick.join("b", 0.079, 0.079)  # a expected at 0.08: within b's slot
    assert tick.waiting_for == {"a"}
    release = tick.join("a", 0.08, 0.08)
    assert release is not None and [m.key for m in release.members] == ["b", "a"]
    assert release.held_ms(release.members[0]) == pytest.approx(1.0)


def test_a_missing_session_costs_one_slot_then_is_no_longer_expected():
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    assert tick.join("a", at, at) is None
    assert tick.poll(at + 0.03) is None
    release = tick.poll(at + SLOT)
    assert release is not None and release.reason is ReleaseReason.SLOT
    assert release.due == pytest.approx(at + SLOT)
    member = release.members[0]
    assert release.held_ms(member) == pytest.approx(40.0)
    assert release.late_ms(member) == 0.0
    # b did not come: the next tick does not wait for it
    assert tick.join("a", at + FRAME, at + FRAME) is not None
    # until it joins again
    assert tick.join("b", at + FRAME + 0.01, at + FRAME + 0.01) is not None  # (a expected past b's slot)
    assert tick.join("a", at + 2 * FRAME, at + 2 * FRAME) is None


def test_a_slot_of_zero_releases_every_position_at_once():
    tick = tick_with("a", "b", slot=0.0)
    for t in range(5):
        for key in ("a", "b"):
            release = tick.join(key, t * FRAME, t * FRAME)
            assert release is not None and release.size == 1
    assert tick.ticks == 10


def test_leaving_completes_the_open_tick():
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    assert tick.join("a", at, at) is None
    release = tick.leave("b", at + 0.01)
    assert release is not None and [m.key for m in release.members] == ["a"]
    assert release.reason is ReleaseReason.COMPLETE
    assert tick.live == 1


def test_a_new_session_joins_the_open_tick_and_is_expected_from_then_on():
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    assert tick.join("b", at, at) is None
    tick.enter("c")
    assert tick.join("c", at + 0.01, at + 0.01) is None
    release = tick.join("a", at + 0.02, at + 0.02)
    assert release is not None and [m.key for m in release.members] == ["b", "c", "a"]
    at += FRAME
    assert tick.join("a", at, at) is None
    assert tick.join("b", at, at) is None
    assert tick.waiting_for == {"c"}
    assert tick.join("c", at + 0.01, at + 0.01) is not None


def test_a_backlog_nobody_else_is_due_to_join_runs_at_once():
    """A session catching up (positions ready back to back) waits only for sessions expected within its slot."""
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)  # both expected at `at`
    assert tick.join("b", at, at) is None
    assert tick.join("a", at, at) is not None
    # a's next position (a settlement one, say) is ready 20 ms later: b is expected 60 ms later, past the slot
    assert tick.join("a", at + 0.02, at + 0.02) is not None
    # 50 ms later: b is expected in 10 ms, within the slot: a waits for it
    assert tick.join("a", at + 0.07, at + 0.07) is None
    assert tick.waiting_for == {"b"}


def test_positions_that_queued_behind_a_busy_engine_still_share_a_forward_and_count_as_late():
    tick = tick_with("a", "b")
    at = in_step(tick, ["a", "b"], 0.0)
    # both frames were ready at `at`, but the engine was busy until 120 ms later
    assert tick.join("a", ready=at, now=at + 0.12) is None
    assert tick.deadline == pytest.approx(at + 0.12 + SLOT)  # the slot runs from when the tick opened
    release = tick.join("b", ready=at, now=at + 0.125)
    assert release is not None and release.size == 2 and release.reason is ReleaseReason.COMPLETE
    a, b = release.members
    assert release.late_ms(a) == pytest.approx(125.0)
    assert release.late_ms(b) == pytest.approx(125.0)
    assert release.held_ms(a) == pytest.approx(5.0)


@pytest.mark.parametrize(
    "moves",
    [
        [("join", "x")],  # never entered
        [("enter", "a"), ("enter", "a")],
        [("enter", "a"), ("enter", "b"), ("step", None), ("join", "a"), ("join", "a")],
        [("enter", "a"), ("enter", "b"), ("step", None), ("join", "a"), ("leave", "a")],
    ],
)
def test_illegal_moves_raise_the_state_error(moves):
    tick = EngineTick(SLOT)
    at = 0.0
    with pytest.raises(StateError):
        for verb, key in moves:
            if verb == "enter":
                tick.enter(key)
            elif verb == "step":
                at = in_step(tick, ["a", "b"], 0.0)
            elif verb == "join":
                tick.join(key, at, at)
            else:
                tick.leave(key, at)


@pytest.mark.parametrize("slot", [-0.01, 0.041, float("nan")])
def test_a_slot_outside_zero_to_half_a_frame_is_refused(slot):
    with pytest.raises(ValueError):
        EngineTick(slot)


@settings(max_examples=300, deadline=None)
@given(
    slot=st.sampled_from([0.0, 0.01, 0.02, 0.04]),
    phases=st.lists(st.integers(min_value=0, max_value=79), min_size=1, max_size=5),
    frames=st.integers(min_value=1, max_value=12),
)
def test_real_time_sessions_are_never_late_nor_held_past_the_slot_when_the_engine_keeps_up(slot, phases, frames):
    """Sessions streaming one frame per 80 ms at arbitrary phases (whole milliseconds), an engine that answers at
    once, the host polling at every deadline: no position is late, none is held longer than the slot, a tick holds a
    session at most once, and sessions whose phases lie within the slot of each other share every tick from their
    second frame on."""
    tick = EngineTick(slot)
    keys = list(range(len(phases)))
    for key in keys:
        tick.enter(key)
    arrivals = sorted((frame * 80 + phases[key], key) for key in keys for frame in range(frames))
    releases = []
    waiting: set[int] = set()
    queued: dict[int, list[float]] = {key: [] for key in keys}

    def settle(release):
        releases.append(release)
        waiting.difference_update(m.key for m in release.members)

    def drain(now: float) -> None:
        for key in keys:
            if key not in waiting and queued[key]:
                waiting.add(key)
                release = tick.join(key, queued[key].pop(0), now)
                if release is not None:
                    settle(release)

    for ms, key in arrivals:
        at = ms / 1000.0
        while tick.deadline is not None and tick.deadline < at - 1e-9:  # (a tie may go either way)
            deadline = tick.deadline
            settle(tick.poll(deadline))
            drain(deadline)
        queued[key].append(at)
        drain(at)
    while tick.deadline is not None:
        deadline = tick.deadline
        settle(tick.poll(deadline))
        drain(deadline)
    assert not waiting and not any(queued.values())
    assert sum(r.size for r in releases) == len(arrivals)
    for release in releases:
        assert len({m.key for m in release.members}) == release.size
        for member in release.members:
            assert release.late_ms(member) == pytest.approx(0.0, abs=1e-6)
            assert release.held_ms(member) <= slot * 1000.0 + 1e-6
    if max(phases) - min(phases) < slot * 1000.0 and frames >= 3:
        start, end = (80 + max(phases)) / 1000.0, ((frames - 1) * 80 + min(phases)) / 1000.0
        assert all(r.size == len(keys) for r in releases if start <= r.at <= end)
