"""Our stage schedulers (omni/scheduler.py): a tick's positions in one Stage-0 forward, Stages 1-2 waiting for a chunk
instead of stepping empty, and the vLLM-Omni 0.30.0 internals they rely on (skipped without vllm_omni)."""

from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm_omni")

from vllm.v1.core.sched.request_queue import create_request_queue, SchedulingPolicy  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler  # noqa: E402
from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler  # noqa: E402

from vllm_omni_voicechat.omni import scheduler as sched  # noqa: E402
from vllm_omni_voicechat.omni.scheduler import (  # noqa: E402
    ChunkArrivals,
    TickHold,
    VoiceChatStage0Scheduler,
    received_chunks,
    tick_of,
)


class Req:
    """What the scheduler reads of a vLLM ``Request`` (hashable by identity, as it is)."""

    def __init__(self, rid: str, status, buffer) -> None:
        self.request_id, self.status, self.model_intermediate_buffer = rid, status, buffer
        self.priority, self.arrival_time = 0, 0.0


def request(rid: str, tick: int | None = None, size: int = 0, status=RequestStatus.WAITING):
    vc = {"position": 3} if tick is None else {"position": 3, "tick": tick, "tick_size": size}
    return Req(rid, status, {"duplex": {"vc": vc}})


def test_a_positions_tick_is_read_from_its_envelope():
    assert tick_of(request("a", 5, 3)) == (5, 3)
    assert tick_of(request("a", 5, 1)) is None  # a tick of one: nothing to wait for
    assert tick_of(request("a")) is None
    assert tick_of(SimpleNamespace(model_intermediate_buffer=None)) is None


def test_an_incomplete_tick_is_held_until_complete_or_its_hold_ends():
    hold = TickHold(hold_s=0.02)
    a, b, c = request("a", 7, 3), request("b", 7, 3), request("c", 7, 3)
    lone = request("x")
    assert hold.held([a, lone], 1.000) == [a]
    assert hold.held([a, b, lone], 1.005) == [a, b]
    assert hold.held([a, b, c, lone], 1.006) == []  # complete: all three in this forward
    assert hold.held([a, b], 1.010) == [a, b]  # (a new sighting of tick 7 after it was gone starts over)
    hold2 = TickHold(hold_s=0.02)
    assert hold2.held([a, b], 2.000) == [a, b]
    assert hold2.held([a, b], 2.019) == [a, b]
    assert hold2.held([a, b], 2.020) == []  # the missing member's submission failed: the others go


def test_ticks_are_held_independently():
    hold = TickHold(hold_s=0.02)
    a7, b7, a8 = request("a", 7, 2), request("b", 7, 2), request("c", 8, 2)
    assert hold.held([a7, a8], 0.0) == [a7, a8]
    assert hold.held([a7, b7, a8], 0.001) == [a8]


def _stage0(monkeypatch, queued: list, parked: list):
    """A Stage-0 scheduler with just its queues, whose parent schedule records what it was offered."""
    s = VoiceChatStage0Scheduler.__new__(VoiceChatStage0Scheduler)
    s.waiting = create_request_queue(SchedulingPolicy.FCFS)
    s.skipped_waiting = create_request_queue(SchedulingPolicy.FCFS)
    for r in queued:
        s.waiting.add_request(r)
    for r in parked:
        s.skipped_waiting.add_request(r)
    s._init_batch_log()
    s.vc_hold = TickHold()
    s.offered = []

    def parent_schedule(self, throttle_prefills=False):
        self.offered.append([r.request_id for q in (self.waiting, self.skipped_waiting) for r in q])
        return SimpleNamespace(total_num_scheduled_tokens=len(self.offered[-1]),
                               num_scheduled_tokens={rid: 1 for rid in self.offered[-1]})

    monkeypatch.setattr(OmniARScheduler, "schedule", parent_schedule)
    return s


def test_stage0_keeps_a_held_tick_out_of_the_schedule_and_puts_it_back_in_order(monkeypatch):
    a, b = request("a", 4, 3), request("b", 4, 3)
    other = request("o")
    parked = request("p", 3, 3, status=RequestStatus.WAITING_FOR_STREAMING_REQ)  # not updated yet: never held
    s = _stage0(monkeypatch, [a, other], [b, parked])
    s.schedule()
    assert s.offered == [["o", "p"]]
    assert [r.request_id for r in s.waiting] == ["a", "o"] and [r.request_id for r in s.skipped_waiting] == ["b", "p"]
    s.waiting.add_request(request("c", 4, 3))
    s.schedule()
    assert s.offered[-1] == ["a", "o", "c", "b", "p"]
    assert dict(s.vc_batches) == {2: 1, 5: 1}


def test_chunk_arrivals_is_a_set_that_wakes_its_waiter():
    arrivals = ChunkArrivals({"x"})
    assert arrivals == {"x"} and isinstance(arrivals, set)
    arrivals.discard("x")
    woke = threading.Event()

    def waiter():
        arrivals.wait(5.0)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    arrivals.add("req-1")  # the receive thread's add
    assert woke.wait(5.0)
    thread.join(5)
    arrivals.wait(5.0)  # not empty: returns at once


def test_settling_waits_for_chunks_that_keep_coming_and_no_longer():
    import time

    arrivals = ChunkArrivals({"a"})

    def sender(names, gap):
        for name in names:
            time.sleep(gap)  # ok: the previous stage's sender thread, one chunk after another
            arrivals.add(name)

    thread = threading.Thread(target=sender, args=(["b", "c"], 0.0002))
    thread.start()
    arrivals.settle(3, gap=0.05, bound=5.0)  # all three arrive
    thread.join(5)
    assert arrivals == {"a", "b", "c"}
    t0 = time.monotonic()
    arrivals.settle(4, gap=0.01, bound=5.0)  # a fourth never comes: one gap, not the bound
    assert time.monotonic() - t0 < 1.0
    arrivals.settle(2, gap=5.0, bound=5.0)  # already there: at once


def test_received_chunks_swaps_the_adapters_set_once():
    adapter = SimpleNamespace(_finished_load_reqs={"a"})
    scheduler = SimpleNamespace(chunk_transfer_adapter=adapter)
    first = received_chunks(scheduler)
    assert isinstance(first, ChunkArrivals) and first == {"a"} and adapter._finished_load_reqs is first
    assert received_chunks(scheduler) is first
    assert received_chunks(SimpleNamespace(chunk_transfer_adapter=None)) is None


# ---- the pins: what the schedulers read of vLLM-Omni 0.30.0 ----


def test_vllm_omni_is_the_version_the_private_seams_were_written_against():
    import importlib.metadata

    assert importlib.metadata.version("vllm-omni") == "0.30.0"


def test_the_chunk_adapter_keeps_received_chunks_in_one_set_that_only_its_constructor_assigns():
    from pathlib import Path

    import vllm_omni
    from vllm_omni.distributed.omni_connectors.transfer_adapter import base, chunk_transfer_adapter

    assert f"self.{sched.RECEIVED_ATTR} = set()" in inspect.getsource(base.OmniTransferAdapterBase.__init__)
    assert f"self.{sched.RECEIVED_ATTR}.add(" in inspect.getsource(chunk_transfer_adapter.OmniChunkTransferAdapter)
    adapter_dir = Path(base.__file__).parent
    assigners = [p.name for p in Path(vllm_omni.__file__).parent.rglob("*.py")
                 if p.parent == adapter_dir and f"self.{sched.RECEIVED_ATTR} =" in p.read_text()]
    assert assigners == ["base.py"]


def test_the_schedulers_we_extend_have_the_hooks_we_use():
    for cls in (OmniARScheduler, OmniGenerationScheduler):
        for name in ("schedule", "add_request", "finish_requests", "has_finished_requests"):
            assert callable(getattr(cls, name)), (cls, name)
    assert "self.skipped_waiting" in inspect.getsource(__import__("vllm.v1.core.sched.scheduler",
                                                                  fromlist=["Scheduler"]).Scheduler.__init__)
    assert "chunk_transfer_adapter" in inspect.getsource(OmniARScheduler.__mro__[1])
    assert RequestStatus.WAITING.name == "WAITING"


def test_our_pipeline_names_a_scheduler_of_ours_for_every_stage():
    from vllm_omni_voicechat.omni.pipeline import VOICECHAT_PIPELINE

    assert {s.stage_id: s.scheduler_cls for s in VOICECHAT_PIPELINE.stages} == sched.STAGE_SCHEDULERS
    for path in sched.STAGE_SCHEDULERS.values():
        module, name = path.rsplit(".", 1)
        assert isinstance(getattr(__import__(module, fromlist=[name]), name), type)
