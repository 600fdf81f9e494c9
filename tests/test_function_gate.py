"""FunctionGate: PAD forcing on pre-EOU positions and the one-token SOTC latch (contract §7), model-independent.

Property-based tests run the gate over random position sequences that respect the protocol (per turn: free
positions, then client-owned settlement (pre-EOU) positions, then at most one EOU-consuming position, then
post-EOU positions; the position right after an EOU is never a settlement position) and compare every
effective token and every telemetry counter with a declarative reference model. Example-based tests use int
token ids, as the vLLM-Omni adapter does, to show the gate is generic over the token type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.model.function_gate import FunctionGate

# ---------------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Pos:
    raw: Any
    frame: int
    pre_eou: bool = False
    eou_position: bool = False


@dataclass(frozen=True)
class Flavour:
    """A token vocabulary: the simulator's strings (PAD is None), strings with an explicit PAD, vLLM-Omni ids."""

    name: str
    sotc: Any
    pad: Any
    others: tuple


FLAVOURS = (
    Flavour("sim-strings", "<SPECIAL_20>", None, ("<SPECIAL_21>", "<SPECIAL_22>", "<TOO", "LCAL", "x")),
    Flavour("strings-with-pad", "<SPECIAL_20>", "<SPECIAL_12>", ("<SPECIAL_21>", "<TOO", "]</T")),
    Flavour("int-ids", 20, 12, (21, 22, 1000, 1001, 0)),
)

FRESH_TELEMETRY = {
    "pre_eou_suppressed_tokens": 0,
    "pre_eou_last_raw_token": None,
    "pre_eou_suppressed_frame": None,
    "client_eou_sotc_staged_count": 0,
    "client_eou_sotc_staged_frame": None,
    "client_eou_sotc_committed_count": 0,
    "client_eou_sotc_committed_frame": None,
    "latch_pending": False,
}


def is_pad(flavour: Flavour, token: Any) -> bool:
    return token is None or token == flavour.pad


def reference(flavour: Flavour, positions: list[Pos]) -> tuple[list[Any], list[dict[str, Any]]]:
    """What the gate must do, stated per position rather than as a state machine.

    Roles: a *replay* position is the one right after an EOU position whose raw prediction was SOTC; a
    *staging* position is such an EOU position. Effective token: SOTC on a replay position (its raw token is
    dropped); PAD on a staging position; PAD on any other pre-EOU position; the raw token otherwise. Every
    non-PAD raw token forced to PAD on a pre-EOU, non-staging position is counted as suppressed.
    Returns the effective tokens and the expected telemetry after each position.
    """
    sotc, pad = flavour.sotc, flavour.pad
    staging = [p.eou_position and p.raw == sotc for p in positions]
    replay = [i > 0 and staging[i - 1] for i in range(len(positions))]
    effective: list[Any] = []
    snapshots: list[dict[str, Any]] = []
    t = dict(FRESH_TELEMETRY)
    for i, p in enumerate(positions):
        if replay[i]:
            effective.append(sotc)
            t["client_eou_sotc_committed_count"] += 1
            t["client_eou_sotc_committed_frame"] = p.frame
        elif staging[i]:
            effective.append(pad)
            t["client_eou_sotc_staged_count"] += 1
            t["client_eou_sotc_staged_frame"] = p.frame
        elif p.pre_eou:
            effective.append(pad)
            if not is_pad(flavour, p.raw):
                t["pre_eou_suppressed_tokens"] += 1
                t["pre_eou_last_raw_token"] = p.raw
                t["pre_eou_suppressed_frame"] = p.frame
        else:
            effective.append(p.raw)
        t["latch_pending"] = staging[i]
        snapshots.append(dict(t))
    return effective, snapshots


def run_gate(gate: FunctionGate, positions: list[Pos]) -> tuple[list[Any], list[dict[str, Any]]]:
    effective, snapshots = [], []
    for p in positions:
        effective.append(gate.admit(p.raw, frame=p.frame, pre_eou=p.pre_eou, eou_position=p.eou_position))
        snapshots.append(gate.telemetry())
    return effective, snapshots


# ---------------------------------------------------------------------------------------------- strategies


# A raw prediction is drawn as a role, mapped onto the flavour's vocabulary when positions are built: SOTC is
# drawn often so that staging, replays and settlement SOTCs all show up.
ROLE = st.integers(0, 6)  # 0, 1: SOTC; 2: None; 3: PAD; 4..6: other tokens
TURN = st.tuples(
    st.lists(ROLE, max_size=4),  # listening / responding positions
    st.lists(ROLE, max_size=6),  # client-owned settlement positions
    st.one_of(st.none(), st.tuples(ROLE, st.booleans())),  # the EOU position: (raw, fused i.e. also pre-EOU)
    st.lists(ROLE, min_size=1, max_size=4),  # post-EOU positions (the first is the replay position)
    st.booleans(),  # for the last turn: stop right at the EOU position (latch still pending)
)


def _token(flavour: Flavour, role: int) -> Any:
    if role <= 1:
        return flavour.sotc
    if role == 2:
        return None
    if role == 3:
        return flavour.pad
    return flavour.others[(role - 4) % len(flavour.others)]


def _build(flavour: Flavour, turns: list, start: int, gaps: list[int]) -> list[Pos]:
    positions: list[Pos] = []
    frame = start

    def add(role: int, **flags) -> None:
        nonlocal frame
        positions.append(Pos(_token(flavour, role), frame, **flags))
        frame += gaps[len(positions) % len(gaps)]  # absolute frame numbers, strictly increasing

    for k, (free, pre, eou, post, stop_at_eou) in enumerate(turns):
        for role in free:
            add(role)
        for role in pre:
            add(role, pre_eou=True)
        if eou is not None:
            add(eou[0], eou_position=True, pre_eou=eou[1])
            if k == len(turns) - 1 and stop_at_eou:
                break
            # The first post-BOS position is never a settlement position.
            for role in post:
                add(role)
    return positions


scenarios = st.builds(
    lambda flavour, turns, start, gaps: (flavour, _build(flavour, turns, start, gaps)),
    st.sampled_from(FLAVOURS),
    st.lists(TURN, min_size=1, max_size=5),
    st.integers(0, 10_000),
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
)
"""A flavour and a protocol-respecting position sequence with random raw predictions and flags."""


def new_gate(flavour: Flavour) -> FunctionGate:
    return FunctionGate(flavour.sotc) if flavour.pad is None else FunctionGate(flavour.sotc, flavour.pad)


# ------------------------------------------------------------------------------------------ property tests

PROPS = settings(max_examples=200, deadline=None)


@PROPS
@given(scenarios)
def test_gate_matches_the_reference_model_position_by_position(scenario):
    flavour, positions = scenario
    gate = new_gate(flavour)
    effective, snapshots = run_gate(gate, positions)
    want_effective, want_snapshots = reference(flavour, positions)
    assert effective == want_effective
    assert snapshots == want_snapshots
    # the attribute view agrees with the telemetry view
    assert gate.latch_pending == (snapshots[-1]["latch_pending"] if positions else False)
    assert gate.staged_count == gate.telemetry()["client_eou_sotc_staged_count"]
    assert gate.replayed_count == gate.telemetry()["client_eou_sotc_committed_count"]


@PROPS
@given(scenarios)
def test_pre_eou_positions_are_always_pad_and_every_non_pad_raw_is_counted_once(scenario):
    flavour, positions = scenario
    gate = new_gate(flavour)
    for p in positions:
        before = gate.telemetry()
        out = gate.admit(p.raw, frame=p.frame, pre_eou=p.pre_eou, eou_position=p.eou_position)
        after = gate.telemetry()
        if p.pre_eou:
            assert is_pad(flavour, out) and out == flavour.pad  # the gate's own PAD, never a raw token
        counted = after["pre_eou_suppressed_tokens"] - before["pre_eou_suppressed_tokens"]
        latched_here = p.eou_position and p.raw == flavour.sotc
        if p.pre_eou and not latched_here and not is_pad(flavour, p.raw):
            assert counted == 1
            assert after["pre_eou_last_raw_token"] == p.raw
            assert after["pre_eou_suppressed_frame"] == p.frame
        else:
            assert counted == 0
            assert after["pre_eou_last_raw_token"] == before["pre_eou_last_raw_token"]
            assert after["pre_eou_suppressed_frame"] == before["pre_eou_suppressed_frame"]


@PROPS
@given(scenarios)
def test_eou_sotc_is_staged_and_replayed_exactly_once_on_the_very_next_position(scenario):
    flavour, positions = scenario
    gate = new_gate(flavour)
    effective, _ = run_gate(gate, positions)
    for i, p in enumerate(positions):
        if not (p.eou_position and p.raw == flavour.sotc):
            continue
        assert effective[i] == flavour.pad  # never effective on the EOU position itself
        if i + 1 < len(positions):
            assert effective[i + 1] == flavour.sotc  # the replay, whatever the raw prediction there
            assert not positions[i + 1].pre_eou  # (protocol of the generator)
        else:
            assert gate.latch_pending  # nothing followed yet: still staged, not lost
    # Each staged SOTC is replayed once: replays == staged SOTCs followed by a position.
    staged = sum(1 for p in positions if p.eou_position and p.raw == flavour.sotc)
    assert gate.staged_count == staged
    assert gate.replayed_count == staged - int(gate.latch_pending)


@PROPS
@given(scenarios, st.data())
def test_the_replay_position_drops_its_own_raw_prediction(scenario, data):
    flavour, positions = scenario
    replay_at = [i + 1 for i, p in enumerate(positions[:-1]) if p.eou_position and p.raw == flavour.sotc]
    if not replay_at:
        return
    # Whatever the model predicts on the replay positions, the effective stream and the counters are the same.
    token = st.sampled_from((flavour.sotc, None, flavour.pad, *flavour.others))
    changed = list(positions)
    for i in replay_at:
        changed[i] = Pos(data.draw(token), positions[i].frame, positions[i].pre_eou, positions[i].eou_position)
    assert run_gate(new_gate(flavour), positions) == run_gate(new_gate(flavour), changed)


@PROPS
@given(scenarios)
def test_settlement_sotcs_are_discarded_never_replayed(scenario):
    flavour, positions = scenario
    effective, _ = run_gate(new_gate(flavour), positions)
    for i, p in enumerate(positions):
        if p.pre_eou and not p.eou_position and p.raw == flavour.sotc:
            assert effective[i] == flavour.pad
            nxt = i + 1
            if nxt < len(positions) and not positions[nxt].eou_position:
                # The next position is the identity (or PAD on settlement): a discarded SOTC leaves no trace.
                want = flavour.pad if positions[nxt].pre_eou else positions[nxt].raw
                assert effective[nxt] == want
    # Only EOU-position SOTCs ever become replays.
    gate = new_gate(flavour)
    run_gate(gate, [p for p in positions if not p.eou_position])
    assert gate.staged_count == gate.replayed_count == 0 and not gate.latch_pending


@PROPS
@given(scenarios)
def test_non_sotc_on_the_eou_position_passes_unless_pre_eou(scenario):
    flavour, positions = scenario
    effective, _ = run_gate(new_gate(flavour), positions)
    for i, p in enumerate(positions):
        if p.eou_position and p.raw != flavour.sotc:
            assert effective[i] == (flavour.pad if p.pre_eou else p.raw)


@PROPS
@given(scenarios)
def test_outside_pre_eou_and_without_a_pending_latch_the_gate_is_the_identity(scenario):
    flavour, positions = scenario
    gate = new_gate(flavour)
    for p in positions:
        pending = gate.latch_pending
        before = gate.telemetry()
        out = gate.admit(p.raw, frame=p.frame, pre_eou=p.pre_eou, eou_position=p.eou_position)
        if not pending and not p.pre_eou and not (p.eou_position and p.raw == flavour.sotc):
            assert out is p.raw or out == p.raw
            assert gate.telemetry() == before  # identity positions touch no counter


@settings(max_examples=100, deadline=None)
@given(scenarios, scenarios)
def test_reset_clears_everything(first, second):
    flavour, positions = first
    gate = new_gate(flavour)
    run_gate(gate, positions)
    gate.reset()
    assert gate.telemetry() == FRESH_TELEMETRY
    assert (gate.sotc, gate.pad) == (flavour.sotc, flavour.pad)
    # After a reset the gate behaves exactly like a new one (a pending latch is gone too).
    _, positions2 = second
    positions2 = [Pos(_translate(flavour, second[0], p.raw), p.frame, p.pre_eou, p.eou_position) for p in positions2]
    assert run_gate(gate, positions2) == run_gate(new_gate(flavour), positions2)


def _translate(to: Flavour, frm: Flavour, raw: Any) -> Any:
    """Map a token of one flavour onto another (same role)."""
    if raw is None:
        return None
    if raw == frm.sotc:
        return to.sotc
    if raw == frm.pad:
        return to.pad
    return to.others[frm.others.index(raw) % len(to.others)]


# ----------------------------------------------------------------------------------------- example tests


def test_int_ids_settlement_eou_latch_and_replay():
    gate = FunctionGate(20, pad=12)  # vLLM-Omni: <SPECIAL_20> = SOTC, <SPECIAL_12> = PAD
    # settlement: every non-PAD prediction is recorded and forced to PAD
    assert gate.admit(20, frame=100, pre_eou=True) == 12
    assert gate.admit(12, frame=101, pre_eou=True) == 12  # PAD itself is not counted
    assert gate.admit(1234, frame=102, pre_eou=True) == 12
    assert gate.admit(None, frame=103, pre_eou=True) == 12
    t = gate.telemetry()
    assert (t["pre_eou_suppressed_tokens"], t["pre_eou_last_raw_token"], t["pre_eou_suppressed_frame"]) == (2, 1234, 102)
    assert t["client_eou_sotc_staged_count"] == 0 and not t["latch_pending"]  # the settlement SOTC is discarded
    # the separate EOU position: SOTC staged, effective PAD
    assert gate.admit(20, frame=104, eou_position=True) == 12
    assert gate.latch_pending and (gate.staged_count, gate.staged_frame) == (1, 104)
    # first post-BOS position: the staged SOTC replaces this position's own prediction (21 is dropped)
    assert gate.admit(21, frame=105) == 20
    assert not gate.latch_pending and (gate.replayed_count, gate.replayed_frame) == (1, 105)
    # afterwards: identity, no second replay
    assert [gate.admit(x, frame=106 + i) for i, x in enumerate((21, 20, 12, 7))] == [21, 20, 12, 7]
    assert gate.telemetry() == {
        "pre_eou_suppressed_tokens": 2,
        "pre_eou_last_raw_token": 1234,
        "pre_eou_suppressed_frame": 102,
        "client_eou_sotc_staged_count": 1,
        "client_eou_sotc_staged_frame": 104,
        "client_eou_sotc_committed_count": 1,
        "client_eou_sotc_committed_frame": 105,
        "latch_pending": False,
    }


def test_int_ids_fused_eou_position_is_pre_eou_and_still_latches_sotc():
    gate = FunctionGate(20, 12)
    # Without tools the fence position is the EOU position and a settlement position at once.
    assert gate.admit(21, frame=7, pre_eou=True, eou_position=True) == 12  # non-SOTC: forced, counted
    assert gate.pre_eou_suppressed_tokens == 1 and gate.pre_eou_last_raw_token == 21
    assert gate.admit(12, frame=8) == 12
    assert gate.admit(20, frame=9, pre_eou=True, eou_position=True) == 12  # SOTC: staged, not counted
    assert gate.pre_eou_suppressed_tokens == 1 and gate.staged_count == 1
    assert gate.admit(12, frame=10) == 20


def test_int_ids_separate_eou_non_sotc_passes_through():
    gate = FunctionGate(20, 12)
    assert gate.admit(1000, frame=3, eou_position=True) == 1000
    assert gate.admit(12, frame=4, eou_position=True) == 12
    assert gate.telemetry() == FRESH_TELEMETRY


def test_numpy_token_ids_compare_by_value():
    gate = FunctionGate(20, 12)
    assert gate.admit(np.int64(20), frame=0, eou_position=True) == 12
    assert gate.latch_pending
    out = gate.admit(np.int64(5), frame=1)
    assert out == 20 and type(out) is int  # the replay is the gate's own SOTC id
    assert gate.admit(np.int64(12), frame=2, pre_eou=True) == 12
    assert gate.pre_eou_suppressed_tokens == 0  # numpy PAD equals PAD


def test_reset_drops_a_pending_latch():
    gate = FunctionGate(20, 12)
    gate.admit(7, frame=0, pre_eou=True)
    gate.admit(20, frame=1, eou_position=True)
    assert gate.latch_pending
    gate.reset()
    assert gate.telemetry() == FRESH_TELEMETRY
    assert gate.admit(21, frame=2) == 21  # no replay after a reset
