"""Our stage schedulers: vLLM-Omni's, plus one forward for a tick's positions and a record of batch sizes.

Named by our pipeline (``pipeline.py``: ``scheduler_cls``, the seam vLLM-Omni offers per stage); vLLM builds them in
each stage's engine-core process.

Stage 0. The engine tick (``runner/tick.py``, ``batching.py``) submits a tick's positions back to back, but they reach
the Stage-0 engine core one by one, each after its own trip through vLLM-Omni's orchestrator: an idle core starts a
forward on the first and the rest wait for the next (the probe before this: 1 / 2 / 3-request forwards 301 / 120 / 33
times at four sessions). Each position's envelope carries its tick and the tick's size (``vc.tick``,
``vc.tick_size``), so ``VoiceChatStage0Scheduler`` holds a tick's positions out of the schedule until all of them have
arrived, at most ``TICK_HOLD_S`` after the first, then schedules them in one forward. While it holds, vLLM's engine
core keeps stepping empty (held requests stay queued between steps, so it never blocks on its input queue).

Stages 1 and 2. While a session is open its talker and codec requests wait for their next chunk, and vLLM's engine
core keeps stepping them empty about every 1 ms (a request waiting for a chunk goes back to the queues after each
schedule, so the core never blocks): measured here, one open and idle session cost 0.31 + 0.28 cores in those two
processes, more than the model work of a real-time session. ``_ChunkFed`` makes the schedule after an empty one
wait until a chunk has arrived, at most ``IDLE_WAIT_S``: a chunk is scheduled as soon as the adapter's receive thread
has it, and new requests and aborts wait at most ``IDLE_WAIT_S`` in the core's input queue. The chunks of one
Stage-0 forward arrive one after another (the previous stage's sender thread sends them in turn), so whenever some
but not all of the stage's requests have a chunk (after an idle wait, or because they came while the stage was
busy with the previous forward) the schedule waits while more keep coming (each within ``SETTLE_S``, at most
``SETTLE_MAX_S``) until every request has its chunk: the sessions' positions share this stage's forward too. To be
woken, the scheduler swaps the chunk adapter's set of received chunks for one that signals each addition
(``ChunkArrivals``; ``OmniTransferAdapterBase._finished_load_reqs``, a private attribute of vLLM-Omni 0.30.0 that
nothing else reassigns; pinned by ``tests/test_omni_scheduler.py``). Without it the wait polls.

Every stage logs how many requests its forwards carried (cumulative, at most every ``BATCH_LOG_S`` when it changed):
``voicechat stage N forwards by requests: {1: a, 2: b, ...}``; ``benchmarks/engine_concurrency.py`` reads it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler
from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler

from .envelope import VC_KEY

log = logging.getLogger(__name__)

TICK_HOLD_S = 0.02
"""How long Stage 0 waits for the rest of a tick after its first position arrived (the tick's submissions reach the
core within a few milliseconds of each other; a member whose submission failed must not stall the others)."""
IDLE_WAIT_S = 0.01
SETTLE_S = 0.002
"""After a chunk arrives, how long the next may take to count as the same batch (the chunks of one Stage-0 forward
arrive one after another from the previous stage's sender thread; at four sessions on two cores half a millisecond
split most forwards, two kept them whole: benchmarks/engine_concurrency.py's Stage 1-2 counts)."""
SETTLE_MAX_S = 0.006
"""The most a stage's schedule waits for the rest of a forward's chunks: what batching may add to a position's
latency at each of Stages 1 and 2."""
BATCH_LOG_S = 2.0
BATCH_LOG_FORMAT = "voicechat stage %d forwards by requests: %s"


class _BatchLog:
    """Counts the requests of every non-empty forward and logs the cumulative counts."""

    def _init_batch_log(self) -> None:
        self.vc_batches: Counter[int] = Counter()
        self._vc_logged_at = 0.0
        self._vc_logged: dict[int, int] = {}

    def _count_batch(self, output: Any, now: float) -> None:
        if getattr(output, "total_num_scheduled_tokens", 0) <= 0:
            return
        self.vc_batches[len(output.num_scheduled_tokens)] += 1
        if now - self._vc_logged_at >= BATCH_LOG_S:
            self.log_batches(now)

    def log_batches(self, now: float) -> None:
        counts = dict(sorted(self.vc_batches.items()))
        if counts != self._vc_logged:
            stage = getattr(getattr(self, "vllm_config", None), "model_config", None)
            log.info(BATCH_LOG_FORMAT, _stage_id(stage), counts)
            self._vc_logged = counts
        self._vc_logged_at = now


def _stage_id(model_config: Any) -> int:
    stage = getattr(model_config, "stage_id", None)
    return stage if isinstance(stage, int) else -1


def tick_of(request: Any) -> tuple[int, int] | None:
    """``(tick, size)`` from a request's current position envelope, or None (no tick: not held)."""
    buffer = getattr(request, "model_intermediate_buffer", None)
    duplex = buffer.get("duplex") if isinstance(buffer, dict) else None
    vc = duplex.get(VC_KEY) if isinstance(duplex, dict) else None
    if not isinstance(vc, dict):
        return None
    tick, size = vc.get("tick"), vc.get("tick_size")
    if isinstance(tick, int) and isinstance(size, int) and size > 1:
        return tick, size
    return None


class TickHold:
    """Which queued positions to keep out of this schedule (pure: the scheduler hands it requests and ``now``)."""

    def __init__(self, hold_s: float = TICK_HOLD_S) -> None:
        self.hold_s = hold_s
        self._first_seen: dict[int, float] = {}

    def held(self, ready: list[Any], now: float) -> list[Any]:
        """Of the positions ``ready`` to run, those of ticks still incomplete and within their hold."""
        groups: dict[int, list[Any]] = {}
        sizes: dict[int, int] = {}
        for request in ready:
            stamp = tick_of(request)
            if stamp is not None:
                groups.setdefault(stamp[0], []).append(request)
                sizes[stamp[0]] = stamp[1]
        for tick in list(self._first_seen):
            if tick not in groups:
                del self._first_seen[tick]
        held: list[Any] = []
        for tick, members in groups.items():
            first = self._first_seen.setdefault(tick, now)
            if len(members) < sizes[tick] and now - first < self.hold_s:
                held.extend(members)
        return held


def _is_ready(request: Any) -> bool:
    """Updated with a new position (WAITING), not parked for the next one (WAITING_FOR_STREAMING_REQ)."""
    return getattr(getattr(request, "status", None), "name", "") == "WAITING"


class VoiceChatStage0Scheduler(_BatchLog, OmniARScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_batch_log()
        self.vc_hold = TickHold()

    def schedule(self, throttle_prefills: bool = False):
        now = time.monotonic()
        queues = (self.waiting, self.skipped_waiting)
        ready = [r for queue in queues for r in queue if _is_ready(r)]
        held = set(map(id, self.vc_hold.held(ready, now)))
        parked: list[tuple[Any, list[Any]]] = []
        for queue in queues:
            mine = [r for r in queue if id(r) in held]
            if mine:
                queue.remove_requests(mine)
                parked.append((queue, mine))
        try:
            output = super().schedule(throttle_prefills)
        finally:
            for queue, requests in parked:
                for request in reversed(requests):
                    queue.prepend_request(request)
        self._count_batch(output, now)
        return output


RECEIVED_ATTR = "_finished_load_reqs"
"""The chunk adapter's set of request ids whose next chunk has arrived (vLLM-Omni 0.30.0's
``OmniTransferAdapterBase``): the receive thread adds, the scheduler consumes."""


class ChunkArrivals(set):
    """The adapter's set of received chunks, signalling every addition (the receive thread's ``add``)."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.arrived = threading.Condition()

    def add(self, item: Any) -> None:
        with self.arrived:
            super().add(item)
            self.arrived.notify_all()

    def wait(self, timeout: float) -> None:
        with self.arrived:
            if not self:
                self.arrived.wait(timeout)

    def settle(self, expected: int, gap: float, bound: float) -> None:
        """Until ``expected`` chunks are in, or none came within ``gap`` of the last, at most ``bound``."""
        deadline = time.monotonic() + bound
        with self.arrived:
            while len(self) < expected:
                seen = len(self)
                left = deadline - time.monotonic()
                if left <= 0 or not self.arrived.wait(min(gap, left)) or len(self) == seen:
                    return


def received_chunks(scheduler: Any) -> set | None:
    """The chunk adapter's set of received chunks (None: this stage receives none), made a ``ChunkArrivals``."""
    adapter = getattr(scheduler, "chunk_transfer_adapter", None)
    received = getattr(adapter, RECEIVED_ATTR, None)
    if not isinstance(received, set):
        return None
    if not isinstance(received, ChunkArrivals):
        received = ChunkArrivals(received)
        setattr(adapter, RECEIVED_ATTR, received)
    return received


class _ChunkFed(_BatchLog):
    """A stage fed by chunks (Stages 1-2): after a schedule that ran nothing, the next one first waits (bounded) for a
    chunk to arrive; once some of a forward's chunks are in, it waits (bounded) for the rest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_batch_log()
        self._vc_idle = False
        self._vc_inputs = 0
        self._vc_inputs_seen = 0
        self.vc_idle_waits = 0
        received_chunks(self)  # before the first chunk arrives

    def schedule(self, throttle_prefills: bool = False):
        self._wait_for_chunks()
        output = super().schedule(throttle_prefills)  # type: ignore[misc]
        self._vc_idle = getattr(output, "total_num_scheduled_tokens", 0) <= 0
        self._count_batch(output, time.monotonic())
        return output

    def add_request(self, request: Any) -> None:
        self._vc_inputs += 1
        super().add_request(request)  # type: ignore[misc]

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        self._vc_inputs += 1
        return super().finish_requests(*args, **kwargs)  # type: ignore[misc]

    def _wait_for_chunks(self) -> None:
        inputs, self._vc_inputs_seen = self._vc_inputs_seen, self._vc_inputs
        received = received_chunks(self)
        if received is None:
            return
        if (self._vc_idle and inputs == self._vc_inputs and not received
                and not self.has_finished_requests()):  # type: ignore[attr-defined]
            self.vc_idle_waits += 1
            received.wait(IDLE_WAIT_S)
        expected = len(self.requests)  # type: ignore[attr-defined]
        if 0 < len(received) < expected:
            # the other sessions' chunks of the same Stage-0 forward are a moment behind (also when they arrived
            # while this stage was busy): one forward for them all
            received.settle(expected, SETTLE_S, SETTLE_MAX_S)


class VoiceChatTalkerScheduler(_ChunkFed, OmniARScheduler):
    """Stage 1 (the talker)."""


class VoiceChatCodecScheduler(_ChunkFed, OmniGenerationScheduler):
    """Stage 2 (the codec)."""


STAGE_SCHEDULERS = {
    0: f"{__name__}.VoiceChatStage0Scheduler",
    1: f"{__name__}.VoiceChatTalkerScheduler",
    2: f"{__name__}.VoiceChatCodecScheduler",
}

__all__ = ["STAGE_SCHEDULERS", "TickHold", "received_chunks", "VoiceChatCodecScheduler", "VoiceChatStage0Scheduler",
           "VoiceChatTalkerScheduler", "tick_of"]
