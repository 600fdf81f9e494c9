"""A socket's read budget (server/reading.py): the pure byte bucket, the transport's reading held while it is
overdrawn, and our WebSocket protocol charging every byte it reads (driven byte by byte, no sockets)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.server.reading import INBOUND_BURST_BYTES, INBOUND_BYTES_PER_S, ByteBudget, GatedReading
from vllm_omni_voicechat.server.uvicorn import AbortableWebSockets

from .test_server_uvicorn_protocol import _connected


def test_the_budget_is_explicit_and_no_legitimate_client_is_near_it():
    from vllm_omni_voicechat.wire.limits import TIERED_MAX_MESSAGE_BYTES

    assert INBOUND_BYTES_PER_S == 4 << 20
    assert INBOUND_BURST_BYTES > TIERED_MAX_MESSAGE_BYTES + 14  # the largest message, framed, after a quiet spell
    assert INBOUND_BYTES_PER_S > 50 * 56_000  # fifty times real-time audio as v3 JSON


def test_a_budget_starts_full_and_an_overdraft_waits_for_the_deficit_at_the_rate():
    budget = ByteBudget(rate=1_000, burst=5_000, now=10.0)
    assert budget.spend(5_000, 10.0) == 0.0
    assert budget.spend(500, 10.0) == 0.5  # 500 bytes over: half a second at 1,000 B/s
    assert budget.spend(0, 10.5) == 0.0  # back to zero
    assert budget.spend(2_000, 12.5) == 0.0  # two seconds refilled 2,000
    assert budget.spend(1, 100.0) == 0.0 and budget.balance == 4_999  # refills stop at the burst
    assert budget.spend(0, 50.0) == 0.0 and budget.balance == 4_999  # a clock that steps back adds nothing


@pytest.mark.parametrize("rate, burst", [(0, 1), (1, 0), (-1, 5)])
def test_a_budget_needs_a_positive_rate_and_burst(rate, burst):
    with pytest.raises(ValueError):
        ByteBudget(rate, burst, 0.0)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 20_000), st.floats(0, 3, allow_nan=False)), max_size=60))
def test_what_is_read_without_waiting_never_exceeds_the_burst_plus_the_rate_over_the_time(steps):
    """Bytes taken while not overdrawn, from the start to any moment T: at most burst + rate x T; a reader that
    waits as told is never overdrawn when it reads again."""
    budget = ByteBudget(rate=1_000, burst=5_000, now=0.0)
    now = taken = 0.0
    for n, dt in steps:
        now += dt
        wait = budget.spend(n, now)
        taken += n
        assert taken <= 5_000 + 1_000 * now + 1e-6 or wait > 0
        assert budget.balance <= 5_000
        if wait:
            now += wait  # the hold
            assert budget.spend(0, now) < 1e-9


class Reading(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.calls.append("write")


async def after_the_hold(gate: GatedReading) -> None:
    """Once the hold's own timer has run: a timer of the same loop due just after it (no wall-clock guess)."""
    held = gate._held
    assert held is not None
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_at(held.when() + 1e-3, done.set_result, None)
    await done
    assert gate._held is None


def test_a_hold_and_the_readers_pauses_resume_reading_only_when_neither_holds_it():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        real = Reading()
        gate = GatedReading(real, loop)
        gate.hold(0.02)
        assert real.calls == ["pause"]
        gate.pause_reading()
        gate.resume_reading()  # the reader is done with it, the hold is not
        assert real.calls == ["pause"]
        gate.hold(0.01)  # a shorter hold does not cut the running one short
        await after_the_hold(gate)
        assert real.calls == ["pause", "resume"] and gate.holds == 1
        gate.hold(0.01)
        gate.pause_reading()  # a reader pauses during the hold: reading stays paused after it
        await after_the_hold(gate)
        assert real.calls == ["pause", "resume", "pause"]
        gate.resume_reading()
        assert real.calls == ["pause", "resume", "pause", "resume"]
        gate.write(b"x")  # the rest is the transport's own
        assert real.calls[-1] == "write" and gate.is_closing() is False
        gate.hold(5.0)
        gate.cancel_hold()
        assert gate._held is None

    asyncio.run(scenario())


def test_a_socket_that_reads_past_its_budget_is_held_for_the_deficit_and_loses_nothing(monkeypatch):
    """Our protocol charges every byte (the handshake's too): past the burst, reading is held for exactly the
    deficit at the rate, and every message already read still reaches the app in order."""
    monkeypatch.setattr(AbortableWebSockets, "read_bytes_per_s", 10_000)
    monkeypatch.setattr(AbortableWebSockets, "read_burst_bytes", 1_000)

    async def scenario() -> None:
        protocol, transport, client = await _connected()
        assert isinstance(protocol.transport, GatedReading) and protocol.transport.holds == 0
        handshake = 1_000 - protocol._budget.balance
        texts = ['{"n":%d,"pad":"%s"}' % (i, "x" * 80) for i in range(12)]
        for text in texts:
            client.send_text(text.encode())
        data = b"".join(client.data_to_send())
        before = protocol.loop.time()
        protocol.data_received(data)
        held = protocol.transport._held
        assert held is not None and protocol.transport.holds == 1 and "pause" in transport.calls
        deficit = handshake + len(data) - 1_000
        assert deficit > 0
        assert held.when() - before == pytest.approx(deficit / 10_000, abs=0.005)
        received = [(await protocol.receive()) for _ in texts]
        assert [m["text"] for m in received] == texts
        protocol.connection_lost(None)
        assert protocol.transport._held is None

    asyncio.run(scenario())
