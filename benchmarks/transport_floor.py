#!/usr/bin/env python
"""The transport's floor: server CPU per session-frame of a bare server doing only what any v3 server must do for
each client frame, with no session behind it. Set beside ``capacity.py``'s figure, it says how much of the served
process's CPU is the sockets, the event loop and the per-frame coding, and how much is the session.

The server is one uvloop process with a plain ``asyncio.Protocol`` per connection. For each 80 ms append it reads
the masked frame (RFC 6455 §5.2), unmasks it (websockets' C speedup), decodes its JSON (orjson) and its audio
(pybase64), then writes one event of the size and shape of a ``voicechat.metrics`` (orjson). On one frame in
three it also writes a 22.05 kHz audio delta. All the events of a frame go out in one write.

The load is ``--sessions`` connections from 2 client processes. Each connection sends one append every 80 ms on an
absolute schedule, with starts spread across one frame, and reads and discards what comes back. There is no
handshake and no protocol state. The clients count what they sent and received (the path ran). The figure is the server process's CPU time (user + system, from /proc) over the
``--window``, after a warm-up.

Usage::

    python benchmarks/transport_floor.py                    # 300 sessions, 30 s window
    python benchmarks/transport_floor.py --sessions 100 --window 10
    python benchmarks/transport_floor.py --quick            # a few sessions, a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pybase64
import uvloop
from websockets.frames import apply_mask

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, proc_cpu, write_report

from vllm_omni_voicechat.audio.frames import (
    FRAME_SECONDS,
    INPUT_SAMPLE_RATE,
    OUTPUT_SAMPLE_RATE,
    SILENT_INPUT_FRAME,
    SILENT_OUTPUT_FRAME,
)

DEFAULT_OUT = RESULTS / "transport_floor.json"
DELTA_EVERY = 3
"""An audio delta goes out with one frame in this many (a v3 session at 300 sends ~2 events a position)."""
ANSWER_TIMEOUT_S = 60.0
"""How long a client waits, after its last append, for the server's first answer."""
_MASK = b"\x11\x22\x33\x44"
_HEAD16 = struct.Struct("!BBH")
_APPEND = orjson.dumps({"type": "input_audio_buffer.append", "event_id": "evt_client_000001",
                        "audio": base64.b64encode(SILENT_INPUT_FRAME).decode(), "encoding": "pcm16",
                        "sample_rate": INPUT_SAMPLE_RATE,
                        "channels": 1})
CLIENT_FRAME = _HEAD16.pack(0x81, 0x80 | 126, len(_APPEND)) + _MASK + apply_mask(_APPEND, _MASK)
"""One masked text frame of a 3.5 KB append: what a v3 client sends every 80 ms."""


def _text_frame(data: bytes) -> bytes:
    n = len(data)
    return bytes((0x81, n)) if n < 126 else _HEAD16.pack(0x81, 126, n)


class FloorProtocol(asyncio.Protocol):
    """One connection: each whole client frame is decoded and answered; nothing else is kept."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.partial = b""
        self.seq = 0

    def data_received(self, data: bytes) -> None:
        buf = self.partial + data if self.partial else data
        pos, n, out = 0, len(buf), []
        while n - pos >= 8:  # the 16-bit length form: every append is 126-65535 bytes
            end = pos + 8 + _HEAD16.unpack_from(buf, pos)[2]
            if end > n:
                break
            message = orjson.loads(apply_mask(buf[pos + 8:end], buf[pos + 4:pos + 8]).decode())
            pybase64.b64decode(message["audio"], validate=True)
            self.seq += 1
            events = [orjson.dumps(_metrics(self.seq))]
            if self.seq % DELTA_EVERY == 0:
                events.append(orjson.dumps(_delta(self.seq)))
            for event in events:
                out.append(_text_frame(event))
                out.append(event)
            pos = end
        self.partial = buf[pos:]
        if out:
            self.transport.write(b"".join(out))


def _metrics(seq: int) -> dict:
    return {"type": "voicechat.metrics", "event_id": f"evt_s_{seq}", "session_id": "s", "frame": seq,
            "transport_frame": seq, "inference_ms": 0.1, "server_step_ms": 0.2, "budget_ms": 80.0,
            "over_budget": False, "input_audio": True, "output_audio": False, "model_output_audio": False,
            "audio_delivered": False,
            "turn_state": {"kind": "real", "open_client_turn_id": None, "blank_count": 3, "agent_control": "pad",
                           "boundary": "idle", "late_ms": 0.0, "function_cycle": None, "model": {"gate": 0}},
            "turn_id": None, "response_id": None, "step9_capture_fallback": False}


def _delta(seq: int) -> dict:
    return {"type": "response.output_audio.delta", "event_id": f"evt_s_{seq}_audio", "session_id": "s",
            "turn_id": "turn_1", "response_id": "response_1",
            "delta": pybase64.b64encode(SILENT_OUTPUT_FRAME).decode("ascii"), "encoding": "pcm16",
            "sample_rate": OUTPUT_SAMPLE_RATE,
            "channels": 1}


def _serve(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(FloorProtocol, sock=sock)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def _load(port: int, sessions: int, start_at: float, frames: int, sent: Any, received: Any) -> None:
    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answered = asyncio.Event()

        async def discard() -> None:
            while data := await reader.read(1 << 16):
                received.value += len(data)
                answered.set()

        reading = asyncio.ensure_future(discard())
        first = start_at + (i % 100) * FRAME_SECONDS / 100
        for k in range(frames):
            await asyncio.sleep(max(0.0, first + k * FRAME_SECONDS - time.time()))
            writer.write(CLIENT_FRAME)
            sent.value += 1
        await asyncio.wait_for(answered.wait(), ANSWER_TIMEOUT_S)  # awaited: a loaded machine answers late
        writer.close()
        reading.cancel()

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(sessions)))

    uvloop.run(main())


def measure(sessions: int, warmup_s: float, window_s: float) -> dict:
    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = sock.getsockname()[1]
    server = mp.Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    sock.close()
    start_at = time.time() + 2.0
    loads = [n for n in (sessions // 2, sessions - sessions // 2) if n]
    counts = [(mp.Value("q", 0, lock=False), mp.Value("q", 0, lock=False)) for _ in loads]  # each client its own
    frames = round((warmup_s + window_s + 1.0) / FRAME_SECONDS)  # each session's appends: past the window's end
    clients = [mp.Process(target=_load, args=(port, n, start_at, frames, sent, received), daemon=True)
               for n, (sent, received) in zip(loads, counts, strict=True)]
    for client in clients:
        client.start()
    time.sleep(max(0.0, start_at + warmup_s - time.time()))
    cpu0, t0 = proc_cpu(server.pid)[0], time.monotonic()  # type: ignore[arg-type]
    time.sleep(window_s)
    cpu1, t1 = proc_cpu(server.pid)[0], time.monotonic()  # type: ignore[arg-type]
    for client in clients:
        client.join(timeout=warmup_s + window_s + ANSWER_TIMEOUT_S + 30)
    server.terminate()
    server.join(timeout=10)
    cores = (cpu1 - cpu0) / (t1 - t0)
    return {"sessions": sessions, "window_s": window_s, "server_cores": round(cores, 4),
            "ms_per_session_frame": round(cores * FRAME_SECONDS / sessions * 1000.0, 4),
            "frames_sent": sum(sent.value for sent, _ in counts),
            "bytes_received": sum(received.value for _, received in counts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the window")
    parser.add_argument("--window", type=float, default=30.0, help="seconds the server's CPU is measured over")
    parser.add_argument("--quick", action="store_true", help="4 sessions, 1 s warm-up, 2 s window")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.warmup, args.window = 4, 1.0, 2.0
    result = measure(args.sessions, args.warmup, args.window)
    report = {"benchmark": "transport_floor",
              "parameters": {"sessions": args.sessions, "warmup_s": args.warmup, "window_s": args.window,
                             "delta_every": DELTA_EVERY, "client_frame_bytes": len(CLIENT_FRAME)},
              "result": result}
    write_report(report, args.out)
    print(f"transport floor: {result['sessions']} sessions, server {result['server_cores']:.3f} cores = "
          f"{result['ms_per_session_frame']:.4f} ms per session-frame")
    return 0


if __name__ == "__main__":
    sys.exit(main())
