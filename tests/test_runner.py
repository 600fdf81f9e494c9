"""The Stage 0 runner: pacing policy, position guard and step metrics, on injected times."""

from __future__ import annotations

import pytest

from vllm_omni_voicechat.audio.frames import SILENT_INPUT_FRAME, SILENT_OUTPUT_FRAME
from vllm_omni_voicechat.model.port import NO_CONTROLS, StepResult, StepTimings
from vllm_omni_voicechat.runner.stage0 import PositionKind, PositionLimitReached, Stage0Runner

K = PositionKind
RESULT = StepResult(audio=SILENT_OUTPUT_FRAME, timings=StepTimings(inference_ms=12.5))


def run(runner: Stage0Runner, kind: PositionKind, now: float, took: float = 0.01, due: float | None = None):
    p = runner.begin(kind, SILENT_INPUT_FRAME, NO_CONTROLS, None, now, due)
    return p, runner.finish(p, RESULT, now + took)


@pytest.mark.parametrize("kind", [K.REAL, K.TYPED, K.SETTLEMENT, K.EOU, K.CANCEL_TAIL, K.COMMIT_PADDING, K.FINAL])
def test_unpaced_kinds_are_due_at_once(kind):
    r = Stage0Runner()
    run(r, kind, 1.0)
    assert r.due_at(kind, 1.011) == 1.011


def test_response_silence_follows_an_80ms_grid_without_drift():
    r = Stage0Runner(silence_grace=0.0)
    run(r, K.SETTLEMENT, 10.0)  # the BOS position starts at 10.0
    due = r.due_at(K.RESPONSE_SILENCE, 10.02)
    assert due == pytest.approx(10.08)
    # Each silent position started late and took long: the grid stays at 10.08 + k * 0.08.
    for k in range(1, 6):
        run(r, K.RESPONSE_SILENCE, due + 0.03, took=0.07, due=due)
        due = r.due_at(K.RESPONSE_SILENCE, due + 0.1)
        assert due == pytest.approx(10.08 + k * 0.08)


def test_response_silence_after_a_real_frame_waits_half_a_frame_grace():
    r = Stage0Runner()
    run(r, K.REAL, 5.0)
    assert r.due_at(K.RESPONSE_SILENCE, 5.01) == pytest.approx(5.12)
    p, _ = run(r, K.RESPONSE_SILENCE, 5.12, due=5.12)
    assert r.due_at(K.RESPONSE_SILENCE, 5.13) == pytest.approx(5.20)


def test_recovery_keeps_at_least_80ms_between_starts():
    r = Stage0Runner()
    assert r.due_at(K.RECOVERY, 0.0) == 0.0
    run(r, K.RECOVERY, 0.0, took=0.2)  # a slow step: the next one may start as soon as it finishes
    assert r.due_at(K.RECOVERY, 0.2) == 0.2
    run(r, K.RECOVERY, 0.2, took=0.01)
    assert r.due_at(K.RECOVERY, 0.21) == pytest.approx(0.28)


def test_guard_is_checked_before_every_position_synthetic_included():
    r = Stage0Runner(max_positions=2)
    run(r, K.REAL, 0.0)
    run(r, K.SETTLEMENT, 0.1)
    with pytest.raises(PositionLimitReached) as info:
        r.begin(K.SETTLEMENT, SILENT_INPUT_FRAME, NO_CONTROLS, None, 0.2)
    assert (info.value.positions, info.value.limit) == (2, 2)
    assert r.positions_run == 2 and r.in_flight is None


def test_metrics_per_position():
    r = Stage0Runner()
    p, m = run(r, K.REAL, 1.0, took=0.1, due=0.95)
    assert (m.frame, m.kind, m.inference_ms, m.budget_ms) == (0, K.REAL, 12.5, 80.0)
    assert m.server_step_ms == pytest.approx(100.0)
    assert m.late_ms == pytest.approx(50.0)
    assert m.over_budget
    _, m2 = run(r, K.SETTLEMENT, 2.0, took=0.05)
    assert (m2.frame, m2.over_budget) == (1, False)
    assert p.input.synthetic is False and K.SETTLEMENT.synthetic and not K.TYPED.synthetic


def test_one_position_in_flight_at_a_time():
    r = Stage0Runner()
    p = r.begin(K.REAL, SILENT_INPUT_FRAME, NO_CONTROLS, 0, 0.0)
    with pytest.raises(RuntimeError):
        r.begin(K.REAL, SILENT_INPUT_FRAME, NO_CONTROLS, 1, 0.0)
    r.finish(p, RESULT, 0.01)
    with pytest.raises(RuntimeError):
        r.finish(p, RESULT, 0.02)


def test_the_position_carries_its_due_time_for_a_model_home_that_holds_positions():
    r = Stage0Runner()
    p = r.begin(K.REAL, SILENT_INPUT_FRAME, NO_CONTROLS, 0, 1.0, due=0.97)
    assert p.input.ready == 0.97
    r.finish(p, RESULT, 1.01)
    assert r.begin(K.SETTLEMENT, SILENT_INPUT_FRAME, NO_CONTROLS, None, 2.0).input.ready == 2.0


def test_a_model_home_that_held_the_position_reports_the_lateness_and_the_hold_is_not_over_budget():
    r = Stage0Runner()
    p = r.begin(K.REAL, SILENT_INPUT_FRAME, NO_CONTROLS, 0, 1.0, due=0.9)  # started 100 ms after its frame arrived
    held = StepResult(audio=SILENT_OUTPUT_FRAME, timings=StepTimings(inference_ms=30.0, held_ms=35.0, late_ms=12.0))
    m = r.finish(p, held, 1.1)  # 100 ms in all: 35 held for a batch, 65 of engine work
    assert (m.late_ms, m.held_ms) == (12.0, 35.0)  # the model home's lateness, not the runner's 100 ms
    assert m.server_step_ms == pytest.approx(100.0)
    assert not m.over_budget
    p = r.begin(K.REAL, SILENT_INPUT_FRAME, NO_CONTROLS, 1, 2.0)
    m = r.finish(p, StepResult(audio=SILENT_OUTPUT_FRAME, timings=StepTimings(held_ms=10.0, late_ms=0.0)), 2.095)
    assert m.over_budget  # 85 ms of work beside the hold
