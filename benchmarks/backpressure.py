"""Backpressure: what a stalled reader and an input flood cost the server and the other sessions.

Phase 1 (baseline): ``--sessions`` paced v3 talkers (80 ms appends in real time, a spoken phrase, wait for the
response, pause, repeat) for ``--duration`` seconds. Phase 2: the same plus one stalled reader (a raw socket that
stops reading while its model speaks without end) until its outbound bound trips, and one input flood (a client
that sends ``--flood`` events at once while its model steps slowly). Figures: the stalled session's peak queued
bytes/events and time to overflow, the flood's refusals and peak inbox, the talkers' position round trips (their
audio frame sent -> that frame's ``voicechat.metrics`` received; late: >= 80 ms) and responses per phase, and the ratio phase 2 / baseline. The bounds come
from ``ServerConfig`` (``--max-outbound-bytes`` etc.; defaults as documented in docs/reliability.md).

    .venv/bin/python benchmarks/backpressure.py                       # ~30 s
    .venv/bin/python benchmarks/backpressure.py --max-outbound-bytes 8388608 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

try:  # allow running from a checkout without installing the package
    import vllm_omni_voicechat  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import websockets
from _common import v3_append

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.bench.workload import split_frames
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.server.uvicorn import transport_for as asgi_transport
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.trace.recorder import TraceRecorder

RESULTS = Path(__file__).resolve().parent / "results"
UPDATE = json.dumps({"type": "session.update", "event_id": "u1", "session": {"protocol_version": 3}})
PHRASES = ("hello there", "what time is it", "tell me about the sea", "thanks a lot", "how are you today")
LATE_MS = 80.0  # a talker position is late when its metrics arrive a frame or more after its audio was sent
DEFAULTS = {name: f.default for name, f in ServerConfig.__dataclass_fields__.items()}  # a position that started half a frame or more after it was due


append = v3_append
frames = split_frames


class Talker:
    """A paced v3 client: phrase -> wait for response.done (streaming silence) -> pause -> ..."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.late: list[float] = []  # per position: its metrics' arrival - its frame's send (ms)
        self.sent: list[float] = []  # send time of each append (= transport frame index)
        self.positions = 0
        self.responses = 0
        self.errors: list[str] = []
        self._done = asyncio.Event()

    async def run(self, until: float) -> None:
        async with websockets.connect(self.url + "/v1/voicechat", ping_interval=None, max_size=None) as ws:
            await ws.send(UPDATE)
            while json.loads(await ws.recv())["type"] != "session.updated":
                pass
            reader = asyncio.ensure_future(self._read(ws))
            try:
                await self._talk(ws, until)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, ws: Any) -> None:
        async for raw in ws:
            e = json.loads(raw)
            if e["type"] == "voicechat.metrics":
                self.positions += 1
                frame = e.get("transport_frame")
                if isinstance(frame, int) and 0 <= frame < len(self.sent):
                    self.late.append((time.monotonic() - self.sent[frame]) * 1e3)
            elif e["type"] == "response.done":
                self.responses += 1
                self._done.set()
            elif e["type"] == "error":
                self.errors.append(e["error"]["code"])

    async def _talk(self, ws: Any, until: float) -> None:
        silence = append(bytes(INPUT_FRAME_BYTES))
        tick = time.monotonic()
        k = 0

        async def send(text: str) -> None:
            nonlocal tick
            tick += 0.08
            self.sent.append(time.monotonic())
            await ws.send(text)
            await asyncio.sleep(max(0.0, tick - time.monotonic()))  # real-time pacing

        while time.monotonic() < until:
            k += 1
            for _ in range(self.rng.randint(3, 10)):
                await send(silence)
            await ws.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": f"s{k}",
                                      "client_turn_id": k}))
            for f in frames(render_speech(self.rng.choice(PHRASES))):
                await send(append(f))
            self._done.clear()
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"c{k}", "client_turn_id": k}))
            for _ in range(150):
                if self._done.is_set():
                    break
                await send(silence)


class StalledClient:
    """A raw WebSocket client that stops reading after ``session.updated`` (tiny receive buffer)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((parts.hostname, parts.port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self.sock.recv(1)

    def send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        header = (struct.pack("!BB", 0x81, 0x80 | n) if n < 126 else struct.pack("!BBH", 0x81, 0xFE, n)
                  if n < 1 << 16 else struct.pack("!BBQ", 0x81, 0xFF, n))
        mask = os.urandom(4)
        m = np.frombuffer((mask * (n // 4 + 1))[:n], np.uint8)
        self.sock.sendall(header + mask + (np.frombuffer(data, np.uint8) ^ m).tobytes())

    def recv_until(self, type_: str) -> dict:
        def exact(k: int) -> bytes:
            buf = b""
            while len(buf) < k:
                buf += self.sock.recv(k - len(buf))
            return buf

        while True:
            _, b1 = exact(2)
            n = b1 & 0x7F
            n = struct.unpack("!H", exact(2))[0] if n == 126 else struct.unpack("!Q", exact(8))[0] if n == 127 else n
            event = json.loads(exact(n))
            if event["type"] == type_:
                return event


def stall(server: Any, url: str, shrink: bool, created: threading.Event) -> dict:
    """Runs in a thread: start an endless response on a socket that is never read; wait for the bound."""
    app = server.app.state.voicechat
    c = StalledClient(url + "/v1/voicechat")
    sid = c.recv_until("session.created")["session_id"]
    created.set()
    if shrink:
        while app.host.outbox(sid) is None:
            time.sleep(0.005)
        asgi_transport(app.host.outbox(sid).websocket).get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    c.send(UPDATE)
    c.recv_until("session.updated")
    c.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": "s1", "client_turn_id": 1}))
    c.send(append(render_speech("tell me a story")))
    c.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1", "client_turn_id": 1}))
    started = time.monotonic()
    while not any(s["session_id"] == sid for s in list(app.host.backpressure)):
        time.sleep(0.01)
    stats = next(s for s in app.host.backpressure if s["session_id"] == sid)
    c.sock.close()
    return {**stats, "seconds_to_overflow": round(time.monotonic() - started, 3)}


async def flood(url: str, app: Any, n: int, created: asyncio.Event) -> dict:
    async with websockets.connect(url + "/v1/voicechat", ping_interval=None, max_size=None) as ws:
        sid = json.loads(await ws.recv())["session_id"]
        created.set()
        await ws.send(UPDATE)
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        await ws.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": "s1", "client_turn_id": 1}))
        pcm = render_speech("hello") + bytes(INPUT_FRAME_BYTES * 60)
        for i in range(0, len(pcm), 40_960):
            await ws.send(append(pcm[i:i + 40_960]))
        started = time.monotonic()
        for i in range(n):
            await ws.send(json.dumps({"type": "flood.ping", "event_id": f"f{i}"}))
        codes: dict[str, int] = {}
        answered = 0
        while answered < n:
            e = json.loads(await ws.recv())
            if e["type"] == "error" and str(e["error"].get("client_event_id", "")).startswith("f"):
                answered += 1
                codes[e["error"]["code"]] = codes.get(e["error"]["code"], 0) + 1
        shell = app.live[sid].shell
        return {"sent": n, "answered": answered, "by_code": codes, "seconds": round(time.monotonic() - started, 3),
                "peak_inbox_messages": shell.peak_inbox_messages, "peak_inbox_bytes": shell.peak_inbox_bytes,
                "max_inbox_messages": shell.max_inbox_messages}


def summary(talkers: list[Talker]) -> dict:
    late = np.array([x for t in talkers for x in t.late], dtype=float)
    return {"positions": int(late.size), "late_positions": int((late >= LATE_MS).sum()),
            "late_share": round(float((late >= LATE_MS).mean()), 5) if late.size else None,
            "rtt_ms_p50": round(float(np.percentile(late, 50)), 3) if late.size else None,
            "rtt_ms_p99": round(float(np.percentile(late, 99)), 3) if late.size else None,
            "rtt_ms_max": round(float(late.max()), 3) if late.size else None,
            "responses": sum(t.responses for t in talkers), "errors": sum(len(t.errors) for t in talkers)}


async def phase(url: str, sessions: int, duration: float, seed: int, faults=None) -> tuple[dict, Any]:
    """``faults()`` (phase 2) returns (an event set once its sessions exist, the awaitable of its figures): the
    talkers start after it, so the model factory hands out behaviours in a known order."""
    extra = None
    if faults is not None:
        ready, extra = faults()
        await ready
    talkers = [Talker(url, seed * 100 + i) for i in range(sessions)]
    until = time.monotonic() + duration
    tasks = [asyncio.ensure_future(t.run(until)) for t in talkers]
    extra_result = await extra if extra is not None else None
    await asyncio.gather(*tasks)
    return summary(talkers), extra_result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--duration", type=float, default=12.0, help="seconds per phase")
    ap.add_argument("--max-outbound-bytes", type=int, default=256 << 10)
    ap.add_argument("--max-outbound-events", type=int, default=DEFAULTS["max_outbound_events"])
    ap.add_argument("--max-inbox-messages", type=int, default=DEFAULTS["max_inbox_messages"])
    ap.add_argument("--flood", type=int, default=5000, help="events the flooding client sends at once")
    ap.add_argument("--no-shrink", action="store_true",
                    help="keep the kernel's autotuned send buffer (MiBs) in front of the server's bound")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "backpressure.json")
    args = ap.parse_args(argv)

    n = args.sessions
    kinds = itertools.count()

    def factory() -> SimulatorModel:
        # Phase 2 opens the stalled reader (endless speech), then the flood target (slow steps), then its talkers.
        i = next(kinds)
        if i == n:
            return SimulatorModel(SimBehaviour(endless_response=True, prefill_delay_s=0.02))
        if i == n + 1:
            return SimulatorModel(SimBehaviour(step_delay_s=0.02, prefill_delay_s=0.02))
        return SimulatorModel(SimBehaviour(prefill_delay_s=0.02))

    traces = TraceRecorder()  # every socket, the stalled and flooding ones included, through the invariants
    config = ServerConfig(model_factory=factory, max_sessions=n + 2, settlement_blank_frames=3,
                          max_outbound_bytes=args.max_outbound_bytes, max_outbound_events=args.max_outbound_events,
                          max_inbox_messages=args.max_inbox_messages, outbound_close_timeout_s=1.0,
                          trace_factory=traces)
    server = InProcessServer(config)
    app = server.app.state.voicechat
    try:
        baseline, _ = asyncio.run(phase(server.url, n, args.duration, args.seed))

        def faults() -> tuple[Any, Any]:
            loop = asyncio.get_running_loop()
            stall_created, flood_created = threading.Event(), asyncio.Event()

            async def ready() -> None:
                await loop.run_in_executor(None, stall_created.wait)
                flooding.append(asyncio.ensure_future(flood(server.url, app, args.flood, flood_created)))
                await flood_created.wait()

            async def figures() -> tuple[dict, dict]:
                return await stalled, await flooding[0]

            flooding: list[asyncio.Future] = []
            stalled = loop.run_in_executor(None, stall, server, server.url, not args.no_shrink, stall_created)
            return ready(), figures()

        loaded, (stalled, flooded) = asyncio.run(phase(server.url, n, args.duration, args.seed, faults))
    finally:
        server.stop()
    ratio = (lambda a, b: None if not b else round(a / b, 3))
    report = {
        "parameters": {"sessions": n, "duration_s": args.duration, "max_outbound_bytes": args.max_outbound_bytes,
                       "max_outbound_events": args.max_outbound_events, "max_inbox_messages": args.max_inbox_messages,
                       "flood": args.flood, "kernel_send_buffer_shrunk": not args.no_shrink, "late_rtt_ms": LATE_MS},
        "baseline": baseline, "with_faults": loaded, "stalled_reader": stalled, "flood": flooded,
        "ratios": {"late_share": ratio(loaded["late_share"] or 0, baseline["late_share"] or 0),
                   "rtt_ms_p99": ratio(loaded["rtt_ms_p99"] or 0, baseline["rtt_ms_p99"] or 0),
                   "responses_per_session": ratio(loaded["responses"], baseline["responses"])},
        "trace": traces.summary(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"stalled reader: overflow after {stalled['seconds_to_overflow']} s, peak queued "
          f"{stalled['peak_outbound_bytes']} B / {stalled['peak_outbound_events']} events "
          f"(bounds {args.max_outbound_bytes} B / {args.max_outbound_events})")
    print(f"flood: {flooded['sent']} events -> {flooded['by_code']} in {flooded['seconds']} s; peak inbox "
          f"{flooded['peak_inbox_messages']} messages (bound {flooded['max_inbox_messages']})")
    for name, s in (("baseline", baseline), ("with faults", loaded)):
        print(f"{name:12s} positions {s['positions']}  late (>= {LATE_MS:g} ms) {s['late_positions']}  "
              f"round trip p50 {s['rtt_ms_p50']} ms  p99 {s['rtt_ms_p99']} ms  responses {s['responses']}  errors {s['errors']}")
    print(f"ratios (faults / baseline): {report['ratios']}")
    print(f"trace invariants: {report['trace']['sockets']} sockets, {report['trace']['violations']} violations")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
