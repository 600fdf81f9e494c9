"""``record`` builds the same values as ``@dataclass(frozen=True, slots=True)``, only faster."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni_voicechat.model.port import PositionControls, StepResult
from vllm_omni_voicechat.records import record
from vllm_omni_voicechat.session.core import Tick


def _pair():
    @dataclass(frozen=True, slots=True)
    class Base:
        a: int
        b: str = "b"

    @record
    class FastBase:
        a: int
        b: str = "b"

    @dataclass(frozen=True, slots=True)
    class Plain(Base):
        c: tuple = ()
        d: dict = field(default_factory=dict)

    @record
    class Fast(FastBase):
        c: tuple = ()
        d: dict = field(default_factory=dict)

    return Plain, Fast


Plain, Fast = _pair()


def _view(x):
    return type(x).__name__.replace("Plain", "Fast"), [getattr(x, f.name) for f in dataclasses.fields(x)], repr(x)


@given(a=st.integers(), b=st.text(max_size=3), c=st.tuples(st.integers()), d=st.dictionaries(st.text(max_size=2),
       st.integers(), max_size=2), how=st.sampled_from(["positional", "keyword", "defaults", "some"]))
def test_same_values_as_the_dataclass(a, b, c, d, how):
    args = {"positional": ((a, b, c, d), {}), "keyword": ((), {"a": a, "b": b, "c": c, "d": d}),
            "defaults": ((a,), {}), "some": ((a,), {"d": d})}[how]
    plain, fast = Plain(*args[0], **args[1]), Fast(*args[0], **args[1])
    assert [getattr(fast, f.name) for f in dataclasses.fields(fast)] == \
        [getattr(plain, f.name) for f in dataclasses.fields(plain)]
    assert repr(fast) == repr(plain).replace("Plain", "Fast")


def test_signature_frozen_hash_replace_and_fresh_factories():
    assert str(inspect.signature(Fast)) == str(inspect.signature(Plain))
    x = Fast(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.a = 2  # type: ignore[misc]
    assert Fast(1) == x and hash(Fast(1, d=None)) == hash(Fast(1, d=None))  # type: ignore[arg-type]
    assert Fast(1).d is not Fast(1).d  # a new dict each time, as with the dataclass
    assert dataclasses.replace(x, b="z") == Fast(1, "z")
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast(1, "b", (), {}, 5)  # type: ignore[call-arg]
    assert not hasattr(x, "__dict__")  # still slotted


def test_the_per_position_records_use_it():
    for cls in (StepResult, PositionControls, Tick):
        assert cls.__init__.__code__.co_filename == f"<record {cls.__qualname__}>"  # not dataclasses' __init__
    assert StepResult(b"").telemetry == {} and StepResult(b"").telemetry is not StepResult(b"").telemetry


def test_a_post_init_keeps_the_dataclass_init():
    @record
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    with pytest.raises(ValueError):
        Checked(-1)


def test_the_records_built_positionally_every_position_keep_their_field_order():
    """``Stage0Runner.begin``/``finish`` and ``Conversation._emit_metrics`` build these positionally (a keyword
    argument costs ~35 ns on CPython 3.11): a field moved or added in the middle must move those calls too."""
    from vllm_omni_voicechat.model.port import PositionInput
    from vllm_omni_voicechat.runner.stage0 import Position, StepMetrics
    from vllm_omni_voicechat.session.events import PositionMetrics
    from vllm_omni_voicechat.session.procedures import Plan

    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    assert names(PositionInput) == ["pcm", "controls", "synthetic", "ready", "arrived"]
    assert names(Position) == ["index", "kind", "input", "transport_frame", "due", "started", "arrived", "input_audio"]
    assert names(StepMetrics) == ["frame", "transport_frame", "kind", "inference_ms", "server_step_ms", "late_ms",
                                  "budget_ms", "over_budget", "input_audio", "held_ms"]
    assert names(PositionMetrics) == ["frame", "transport_frame", "kind", "inference_ms", "server_step_ms",
                                      "budget_ms", "over_budget", "input_audio", "output_audio", "audio_delivered",
                                      "turn_id", "response_id", "turn_state"]
    assert names(Plan) == ["kind", "pcm", "controls", "transport_frame", "ready", "arrived", "input_audio",
                           "queued_audio"]  # SessionCore._settlement_input
