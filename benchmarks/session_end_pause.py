"""The collector's pauses when sessions end beside hundreds of live ones: the server's heap policy now (an ended
session frees itself; no full collection at its end) against the former one (a full collection soon after each end,
``Heap(collect_after_ends=True)``), the baseline, in the same run.

Each phase starts a fresh server process (the CLI's heap: start-up frozen, the collector's own full collections off)
with a ``gc.callbacks`` timer, opens the live sessions (each takes one spoken turn, so its journal, ledger and
transcripts hold something), then ends ``--end`` of them together and records every collection the server ran from
the first end until ``--settle`` seconds after the last close (past the former policy's 2 s interval). Sessions come
from a separate client process, so the server's heap holds only the server's objects.

    .venv/bin/python benchmarks/session_end_pause.py                      # v3 300 live / 10 end; tiered 224 end
    .venv/bin/python benchmarks/session_end_pause.py --v3 40 --tiered 40 --end 5 --out /tmp/pause.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import machine_info, now_utc, write_report

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech

SILENCE = bytes(12 * INPUT_FRAME_BYTES)


# ---------------------------------------------------------------------------------------------------- the server


def serve(after_ends: bool, max_sessions: int) -> None:
    """The server process: prints its port, then on each stdin line prints (and forgets) the collections since."""
    from vllm_omni_voicechat.server import ServerConfig
    from vllm_omni_voicechat.server.heap import Heap
    from vllm_omni_voicechat.server.inprocess import InProcessServer

    lock = threading.Lock()
    collections: list[dict] = []
    started = [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - started[0]) * 1000.0
        with lock:
            collections.append({"generation": info["generation"], "ms": round(ms, 3), "collected": info["collected"]})

    config = ServerConfig(max_sessions=max_sessions, disconnect_grace_s=1.0)
    server = InProcessServer(config, heap=Heap(managed=True, collect_after_ends=after_ends))
    gc.callbacks.append(timer)
    print(json.dumps({"port": server.port}), flush=True)
    for _ in sys.stdin:
        with lock:
            taken = list(collections)
            collections.clear()
        print(json.dumps({"collections": taken, "heap_collections": server.voicechat.heap.collections}), flush=True)


# ---------------------------------------------------------------------------------------------------- the clients


async def v3_session(url: str, ready: asyncio.Event, end: asyncio.Event) -> None:
    from websockets.asyncio.client import connect

    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None) as ws:
        async def until(kind: str) -> None:
            while json.loads(await ws.recv())["type"] != kind:
                pass

        await until("session.created")
        await ws.send(json.dumps({"type": "session.update", "event_id": "u",
                                  "session": {"protocol_version": 3, "instructions": "Be brief."}}))
        await until("session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": "s", "client_turn_id": 1}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "event_id": "a", "encoding": "pcm16",
                                  "sample_rate": 16000, "channels": 1,
                                  "audio": base64.b64encode(render_speech("hello")).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c", "client_turn_id": 1}))
        await until("response.done")
        ready.set()
        await end.wait()
        await ws.send(json.dumps({"type": "session.stop", "event_id": "x"}))
        async for _ in ws:
            pass


async def tiered_session(url: str, ready: asyncio.Event, end: asyncio.Event) -> None:
    from websockets.asyncio.client import connect

    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None) as ws:
        async def until(kind: str) -> None:
            while json.loads(await ws.recv())["type"] != kind:
                pass

        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        await until("session.updated")
        audio = base64.b64encode(render_speech("hello") + SILENCE).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        await until("response.done")
        ready.set()
        await end.wait()
        await ws.send(json.dumps({"type": "session.close"}))
        async for _ in ws:
            pass


async def drive(url: str, dialect: str, live: int, ending: int, settle_s: float, report) -> dict:
    run = v3_session if dialect == "v3" else tiered_session
    readies = [asyncio.Event() for _ in range(live)]
    ends = [asyncio.Event() for _ in range(live)]
    tasks = []
    for i in range(live):
        tasks.append(asyncio.create_task(run(url, readies[i], ends[i])))
        if i % 20 == 19:
            await asyncio.sleep(0.2)  # a ramp: the turns spread out
    await asyncio.gather(*(r.wait() for r in readies))
    await asyncio.sleep(settle_s)
    report()  # forget the ramp's collections
    t0 = time.monotonic()
    for e in ends[:ending]:
        e.set()
    await asyncio.gather(*tasks[:ending])
    closed_s = time.monotonic() - t0
    await asyncio.sleep(settle_s)
    window = report()
    for e in ends[ending:]:
        e.set()
    await asyncio.gather(*tasks[ending:])
    full = [c for c in window["collections"] if c["generation"] == 2]
    return {"dialect": dialect, "live_sessions": live, "ended_together": ending, "closed_in_s": round(closed_s, 2),
            "collections": len(window["collections"]), "full_collections": len(full),
            "max_pause_ms": max((c["ms"] for c in window["collections"]), default=0.0),
            "longest": max(window["collections"], key=lambda c: c["ms"], default=None),
            "max_full_pause_ms": max((c["ms"] for c in full), default=0.0),
            "objects_collected": sum(c["collected"] for c in window["collections"]),
            "heap_collections": window["heap_collections"]}


def phase(dialect: str, live: int, ending: int, after_ends: bool, settle_s: float) -> dict:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--after-ends" if after_ends else "--no-after-ends",
                             "--max-sessions", str(live + 8)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = json.loads(proc.stdout.readline())["port"]

        def report() -> dict:
            proc.stdin.write("report\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        result = asyncio.run(drive(f"ws://127.0.0.1:{port}", dialect, live, ending, settle_s, report))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.terminate()
        proc.wait(30)
    result["policy"] = "collect after ends (former)" if after_ends else "free at the end (now)"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--after-ends", action=argparse.BooleanOptionalAction, default=False, help=argparse.SUPPRESS)
    parser.add_argument("--max-sessions", type=int, default=400, help=argparse.SUPPRESS)
    parser.add_argument("--v3", type=int, default=300, help="live v3 sessions (default 300)")
    parser.add_argument("--end", type=int, default=10, help="v3 sessions that end together (default 10)")
    parser.add_argument("--tiered", type=int, default=224, help="tiered sessions, all ending together (default 224)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the ramp and after the ends")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "session_end_pause.json")
    args = parser.parse_args()
    if args.serve:
        serve(args.after_ends, args.max_sessions)
        return
    rows = []
    for dialect, live, ending in (("v3", args.v3, args.end), ("tiered", args.tiered, args.tiered)):
        if live <= 0:
            continue
        for after_ends in (True, False):
            row = phase(dialect, live, ending, after_ends, args.settle)
            rows.append(row)
            print(f"{dialect:6} {live:4} live, {ending:4} end together, {row['policy']:28}: "
                  f"{row['full_collections']} full collections, longest pause {row['max_pause_ms']:.1f} ms "
                  f"({row['collections']} collections, {row['objects_collected']} objects collected)", flush=True)
    write_report({"benchmark": "session_end_pause", "when": now_utc(), "machine": machine_info(), "rows": rows},
                 args.out)


if __name__ == "__main__":
    main()
