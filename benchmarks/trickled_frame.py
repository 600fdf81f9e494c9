"""What a WebSocket frame trickled in small reads costs the server's event loop: our framing
(``server/uvicorn.py``'s ``AbortableWebSockets.data_received``) against websockets' own parser on the same reads
(the baseline, in the same run), both inside uvicorn's protocol as the server runs it.

A hostile client can send one large frame a few bytes at a time; the loop must pay for each read in proportion to
the read, not to the partial frame held so far. Prints CPU seconds per frame and the ratio, writes JSON.

    .venv/bin/python benchmarks/trickled_frame.py                 # 16 MiB in 1 KiB reads
    .venv/bin/python benchmarks/trickled_frame.py --mib 4 --read 256 --out /tmp/trickle.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from _common import machine_info, now_utc, write_report
from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from vllm_omni_voicechat.server.uvicorn import AbortableWebSockets


class _Transport(asyncio.Transport):
    def write(self, data: bytes) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)


def _masked_text(size: int) -> bytes:
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/realtime"), max_size=None)
    client.send_request(client.connect())
    client.data_to_send()
    client.state = State.OPEN
    client.send_text(b"a" * size)
    return b"".join(client.data_to_send())


async def _cpu_per_frame(frame: bytes, read: int, ours: bool) -> float:
    accepted = asyncio.Event()

    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        accepted.set()
        await asyncio.Event().wait()

    config = Config(app, ws=AbortableWebSockets, log_level="critical", ws_max_size=len(frame) + 1024)
    config.load()
    protocol = AbortableWebSockets(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    protocol.connection_made(_Transport())
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/realtime"))
    client.send_request(client.connect())
    protocol.data_received(b"".join(client.data_to_send()))
    await asyncio.wait_for(accepted.wait(), 10)
    if not ours:
        protocol._frames = None  # websockets' parser reads everything (the framing uvicorn ships)
    taken: list = []
    protocol.receiver = taken.append
    t0 = time.process_time()
    for i in range(0, len(frame), read):
        protocol.data_received(frame[i:i + read])
    cpu = time.process_time() - t0
    assert len(taken) == 1 and len(taken[0]) == len(frame) - 14  # the message, whole (14: the 64-bit head + mask)
    protocol.connection_lost(None)
    return cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=16.0, help="the frame's payload in MiB (default 16)")
    parser.add_argument("--read", type=int, default=1024, help="bytes per read (default 1024)")
    parser.add_argument("--out", default="benchmarks/results/trickled_frame.json")
    args = parser.parse_args(argv)
    frame = _masked_text(int(args.mib * 1024 * 1024))
    ours = asyncio.run(_cpu_per_frame(frame, args.read, ours=True))
    theirs = asyncio.run(_cpu_per_frame(frame, args.read, ours=False))
    print(f"{args.mib:g} MiB text frame in {args.read}-byte reads ({len(frame) // args.read + 1} reads):")
    print(f"  our framing        {ours:8.3f} s CPU")
    print(f"  websockets' parser {theirs:8.3f} s CPU (baseline)")
    print(f"  ratio ours/baseline {ours / theirs:.2f}" if theirs else "  baseline took no measurable CPU")
    path = write_report({"timestamp": now_utc(), "machine": machine_info(),
                         "parameters": {"mib": args.mib, "read_bytes": args.read},
                         "cpu_s": {"ours": ours, "websockets": theirs},
                         "ratio": ours / theirs if theirs else None}, Path(args.out))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
