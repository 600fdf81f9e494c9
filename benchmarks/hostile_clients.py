"""What a hostile client costs the server and the well-behaved session beside it: each attack runs against a fresh
server process (the CLI, the simulator) while one v3 talker streams its microphone in real time, and the figures are
the talker's lag, the server's CPU and its RSS. ``--baseline TREE`` runs the same attacks against another checkout
(e.g. a ``git worktree`` of an older commit) in the same run: the before and after.

The talker sends one 80 ms append per tick on an absolute schedule; its **lag** is, per append, the time until the
server's ``voicechat.metrics`` for that frame arrives (every frame gets one, gated or a position). Attacks:

- ``json_bomb_v3``: a v3 session sends 15 MB frames of nested empty lists back to back (reconnecting when closed);
- ``json_bomb_tiered``: the same on a tiered session (after its ``session.update``: an admitted session's frames);
- ``connection_flood``: 1,000 v3 connections beyond the slots, 100 at a time;
- ``connection_rounds``: such floods one after another until the attack's time is up (each ~10 s: the connections
  admitted into freed slots hold them until their client's 10 s timeout); ``--duration 500`` makes ~50,000;
- ``idle_tcp``: 300 TCP connections that never send a byte (how many the server still holds at the end);
- ``echo``: a v3 session sends events whose type is 900 KB (the bytes it gets back);
- ``queued_memory``: a tiered client waiting in the admission queue sends 15 MB frames;
- ``slow_reader``: a v3 client streams its microphone in real time and never reads (when the server lets it go);
- ``typed_flood``: a v3 session sends 30,000 ``input_text.request``s as fast as it can, reading the answers;
- ``item_flood``: a tiered session adds 200 items of 1 MB (over the content limit), then small items without end;
- ``small_items``: a tiered session adds small items without end, acknowledging nothing (what it leaves retained);
- ``resume_storm``: 20 clients resume a live tiered session with wrong tokens, back to back;
- ``trickle``: a 15 MB tiered frame sent in 1 KiB writes, again and again.

RSS is the server's before the attack (idle, the talker on, after one short session of each dialect), its peak
during the attack (sampled every 50 ms) and after it (the attack's sockets closed, 6 s later: past the admission
queue's 5 s timeout and the tiered disconnect grace, 3 s here). The talker runs in a process of its own.

    .venv/bin/python benchmarks/hostile_clients.py --duration 10
    git worktree add /tmp/before <commit> && .venv/bin/python benchmarks/hostile_clients.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import machine_info, now_utc, proc_cpu, v3_append, write_report
from websockets.asyncio.client import connect

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES

FRAME_S = 0.08
AFTER_S = 6.0
"""When RSS is read again after an attack: past the admission queue's timeout (5 s here), when a server that stopped
reading a queued client (TCP backpressure) learns that it left."""
GRACE_S = 3.0
"""The tiered disconnect grace here (30 s by default): an attacker's detached session has expired when RSS is read
after the attack."""
BOMB = json.dumps({"type": "bogus.event", "event_id": "bomb", "a": [[] for _ in range(2_400_000)]})  # ~15 MB
ATTACKS = ("json_bomb_v3", "json_bomb_tiered", "connection_flood", "connection_rounds", "idle_tcp", "echo",
           "queued_memory", "slow_reader", "typed_flood", "item_flood", "small_items", "resume_storm", "trickle")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of a process."""
    cpu = proc_cpu(pid)[0]
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return cpu, rss


class Server:
    def __init__(self, tree: Path, max_sessions: int, admission_queue: int) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_omni_voicechat.cli", "serve", "--port", str(self.port), "--max-sessions",
             str(max_sessions), "--admission-queue", str(admission_queue), "--admission-timeout-s", "5",
             "--disconnect-grace-s", str(GRACE_S),
             "--log-level", "error"],
            env=env, cwd=str(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        self.url = f"ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def talker(url: str, stop: asyncio.Event, lags: list[tuple[float, float]]) -> None:
    """A v3 client streaming silence in real time; (when sent, lag) of each frame's metrics."""
    silence = v3_append(bytes(INPUT_FRAME_BYTES))
    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None, open_timeout=30) as ws:
        while json.loads(await ws.recv())["type"] != "session.created":
            pass
        await ws.send(json.dumps({"type": "session.update", "session": {"protocol_version": 3,
                                                                       "instructions": "Be brief."}}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        sent: dict[int, float] = {}

        async def read() -> None:
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "voicechat.metrics":
                    frame = event.get("transport_frame")
                    if frame in sent:
                        at = sent.pop(frame)
                        lags.append((at, time.monotonic() - at))

        reader = asyncio.create_task(read())
        start = time.monotonic()
        k = 0
        while not stop.is_set():
            sent[k] = time.monotonic()
            await ws.send(silence)
            k += 1
            await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        await asyncio.sleep(0.5)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


def talker_process(url: str, out: str) -> None:
    """The talker in a process of its own (until SIGTERM): an attacker's client work on the same loop would read as
    the server's lag. CLOCK_MONOTONIC is the machine's, so its times compare with the parent's."""
    import signal

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        lags: list[tuple[float, float]] = []
        try:
            await talker(url, stop, lags)
        finally:
            Path(out).write_text(json.dumps(lags))

    asyncio.run(main())


async def _drain(ws) -> int:
    n = 0
    with contextlib.suppress(Exception):
        async for message in ws:
            n += len(message)
    return n


async def json_bomb(url: str, path: str, stop: asyncio.Event, stats: dict) -> None:
    while not stop.is_set():
        try:
            async with connect(url + path, max_size=None, ping_interval=None, open_timeout=10) as ws:
                if path == "/v1/duplex":  # admitted first: a session's frames, not a first message's
                    await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
                drain = asyncio.create_task(_drain(ws))
                while not stop.is_set():
                    await ws.send(BOMB)
                    stats["frames"] = stats.get("frames", 0) + 1
                drain.cancel()
        except Exception:
            stats["reconnects"] = stats.get("reconnects", 0) + 1
            await asyncio.sleep(0.05)


async def connection_flood(url: str, stop: asyncio.Event, stats: dict, total: int = 1000, at_once: int = 100) -> None:
    room = asyncio.Semaphore(at_once)

    async def one() -> None:
        async with room:
            if stop.is_set():
                return
            try:
                async with asyncio.timeout(10):
                    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None,
                                       open_timeout=10) as ws:
                        await _drain(ws)
                stats["refused"] = stats.get("refused", 0) + 1
            except TimeoutError:
                stats["timed_out"] = stats.get("timed_out", 0) + 1
            except Exception:
                stats["failed"] = stats.get("failed", 0) + 1

    await asyncio.gather(*(one() for _ in range(total)))


async def connection_rounds(url: str, stop: asyncio.Event, stats: dict) -> None:
    while not stop.is_set():
        await connection_flood(url, stop, stats)
        stats["rounds"] = stats.get("rounds", 0) + 1


async def idle_tcp(url: str, stop: asyncio.Event, stats: dict, count: int = 300) -> None:
    port = int(url.rsplit(":", 1)[1])
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks.append(s)
    started = time.monotonic()
    await stop.wait()
    await asyncio.sleep(max(0.0, started + 12.0 - time.monotonic()))  # past the server's 10 s head deadline
    open_ = 0
    for s in socks:
        try:
            open_ += s.recv(1) != b""
        except BlockingIOError:
            open_ += 1  # nothing to read, not closed: still held
        except OSError:
            pass
        s.close()
    stats["still_open"] = open_
    stats["opened"] = count


async def echo(url: str, stop: asyncio.Event, stats: dict) -> None:
    huge = json.dumps({"type": "t" * 900_000, "event_id": "e"})
    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None, open_timeout=10) as ws:
        received = 0
        sent = 0
        while not stop.is_set():
            await ws.send(huge)
            sent += len(huge)
            while True:
                event = await ws.recv()
                received += len(event)
                if '"error"' in event[:40]:
                    break
        stats["sent_bytes"], stats["received_bytes"] = sent, received


async def queued_memory(url: str, stop: asyncio.Event, stats: dict, holders: int) -> None:
    """Every slot taken by idle configured sessions, then a queued tiered client sends 15 MB frames."""
    holds = []
    for _ in range(holders):
        ws = await connect(url + "/v1/voicechat", max_size=None, ping_interval=None, open_timeout=10)
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"protocol_version": 3}}))
        holds.append(ws)
    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None, open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {}}))
        frames = 0
        while not stop.is_set() and frames < 40:
            try:
                await asyncio.wait_for(ws.send(BOMB.replace("bogus.event", "session.heartbeat")), 2.0)
            except TimeoutError:
                break  # the server stopped reading: TCP backpressure
            frames += 1
        stats["frames_sent"] = frames
        await stop.wait()
    for h in holds:
        await h.close()


async def slow_reader(url: str, stop: asyncio.Event, stats: dict) -> None:
    """Streams in real time and never reads: the client library stops reading the socket once its queue is full."""
    silence = v3_append(bytes(INPUT_FRAME_BYTES))
    async with connect(url + "/v1/voicechat", max_size=None, max_queue=1, ping_interval=None, open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"protocol_version": 3}}))
        start = time.monotonic()
        k = 0
        try:
            while not stop.is_set():
                await asyncio.wait_for(ws.send(silence), 5.0)
                k += 1
                await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        except Exception:
            stats["closed_after_s"] = round(time.monotonic() - start, 1)
        stats["frames_sent"] = k


async def typed_flood(url: str, stop: asyncio.Event, stats: dict, total: int = 30_000) -> None:
    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None, open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"protocol_version": 3}}))
        drain = asyncio.create_task(_drain(ws))
        sent = 0
        while not stop.is_set() and sent < total:
            await ws.send(json.dumps({"type": "input_text.request", "job_id": f"j{sent}", "text": "tell me a joke"}))
            sent += 1
            if sent % 100 == 0:
                await asyncio.sleep(0)
        stats["requests"] = sent
        drain.cancel()


async def item_flood(url: str, stop: asyncio.Event, stats: dict, *, large: int = 200) -> None:
    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None, open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {}}))
        drain = asyncio.create_task(_drain(ws))
        big = "x" * 1_000_000
        sent = 0
        for k in range(large):
            if stop.is_set():
                break
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": big}]}}))
            sent += 1
        small = 0
        while not stop.is_set():
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"item {small}"}]}}))
            small += 1
            if small % 50 == 0:
                await asyncio.sleep(0)
        stats["large_items"], stats["small_items"] = sent, small
        drain.cancel()


async def resume_storm(url: str, stop: asyncio.Event, stats: dict, clients: int = 20) -> None:
    """The target is a live tiered session (attached, streaming); wrong-token resumes against it, back to back."""
    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None, open_timeout=10) as target:
        await target.send(json.dumps({"type": "session.update", "session": {}}))
        session_id = None
        while session_id is None:
            event = json.loads(await target.recv())
            if event["type"] == "session.created":
                session_id = event["session"]["id"] if "id" in event.get("session", {}) else event.get("session_id")
        drain = asyncio.create_task(_drain(target))
        refused = failed = 0

        async def storm() -> None:
            nonlocal refused, failed
            while not stop.is_set():
                try:
                    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None, open_timeout=10) as ws:
                        await ws.send(json.dumps({"type": "session.resume", "session_id": session_id,
                                                  "resume_token": "wrong", "last_received_server_event_seq": 0}))
                        await _drain(ws)
                    refused += 1
                except Exception:
                    failed += 1

        await asyncio.gather(*(storm() for _ in range(clients)))
        stats["session_id"] = session_id
        stats["refused"], stats["failed"] = refused, failed
        drain.cancel()


async def trickle(url: str, stop: asyncio.Event, stats: dict, size: int = 15_000_000, piece: int = 1024) -> None:
    """A whole frame's bytes in small writes on a raw socket (the client library writes a frame at once)."""
    host, port = url.removeprefix("ws://").split(":")
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        first = json.dumps({"type": "session.update", "session": {}}).encode()
        writer.write(bytes([0x81, 0x80 | len(first)]) + bytes(4) + first)  # a zero mask: the payload as is
        writer.write(bytes([0x81, 0x80 | 127]) + size.to_bytes(8, "big") + bytes(4))
        body = BOMB.encode()[:size].ljust(size, b" ")
        try:
            for at in range(0, size, piece):
                if stop.is_set():
                    break
                writer.write(body[at:at + piece])
                await writer.drain()
                stats["bytes"] = stats.get("bytes", 0) + piece
        except OSError:
            pass
        writer.close()
        stats["frames"] = stats.get("frames", 0) + 1


async def warm_up(url: str) -> None:
    """One short session of each dialect first: the idle baseline is a server that has served both (lazy imports and
    first-use caches are not the attack's)."""
    async with connect(url + "/v1/duplex", max_size=None, ping_interval=None, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {}}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        await ws.send(json.dumps({"type": "bogus.event"}))
        await ws.send(json.dumps({"type": "session.close"}))
        await _drain(ws)
    async with connect(url + "/v1/voicechat", max_size=None, ping_interval=None, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "session.stop"}))
        await _drain(ws)


async def run_attack(url: str, pid: int, name: str, duration: float, holders: int) -> dict:
    stop_attack = asyncio.Event()
    await warm_up(url)
    lag_file = Path(tempfile.mkstemp(suffix=".json")[1])
    talk = subprocess.Popen([sys.executable, __file__, "--talker", url, str(lag_file)])
    await asyncio.sleep(3.0)  # warm: the talker's session runs
    _, rss_before = proc_stat(pid)
    cpu0, _ = proc_stat(pid)
    stats: dict = {}
    attack = {
        "json_bomb_v3": lambda: json_bomb(url, "/v1/voicechat", stop_attack, stats),
        "json_bomb_tiered": lambda: json_bomb(url, "/v1/duplex", stop_attack, stats),
        "connection_flood": lambda: connection_flood(url, stop_attack, stats),
        "connection_rounds": lambda: connection_rounds(url, stop_attack, stats),
        "idle_tcp": lambda: idle_tcp(url, stop_attack, stats),
        "echo": lambda: echo(url, stop_attack, stats),
        "queued_memory": lambda: queued_memory(url, stop_attack, stats, holders),
        "slow_reader": lambda: slow_reader(url, stop_attack, stats),
        "typed_flood": lambda: typed_flood(url, stop_attack, stats),
        "item_flood": lambda: item_flood(url, stop_attack, stats),
        "small_items": lambda: item_flood(url, stop_attack, stats, large=0),
        "resume_storm": lambda: resume_storm(url, stop_attack, stats),
        "trickle": lambda: trickle(url, stop_attack, stats),
    }[name]()
    task = asyncio.create_task(attack)
    peak = rss_before
    t0 = time.monotonic()
    while time.monotonic() - t0 < duration:
        await asyncio.sleep(0.05)
        peak = max(peak, proc_stat(pid)[1])
    t1 = time.monotonic()
    stop_attack.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 30)
    cpu1, _ = proc_stat(pid)
    await asyncio.sleep(AFTER_S)
    _, rss_after = proc_stat(pid)
    talk.terminate()
    talk.wait(15)
    attack_lags = [lag for at, lag in json.loads(lag_file.read_text() or "[]") if t0 <= at <= t1]
    lag_file.unlink()
    a = np.asarray(attack_lags or [float("nan")]) * 1000
    return {"attack": name, "talker_frames": len(attack_lags),
            "lag_ms": {"p50": round(float(np.percentile(a, 50)), 1), "p99": round(float(np.percentile(a, 99)), 1),
                       "max": round(float(a.max()), 1)},
            "frames_over_80ms": int((a > 80).sum()), "server_cpu_s": round(cpu1 - cpu0, 2),
            "rss_mb": {"before": round(rss_before / 2**20, 1), "peak": round(peak / 2**20, 1),
                       "after": round(rss_after / 2**20, 1)},
            "attacker": stats}


def run_tree(tree: Path, label: str, attacks: list[str], duration: float) -> list[dict]:
    rows = []
    for name in attacks:
        server = Server(tree, max_sessions=4, admission_queue=2)
        try:
            row = asyncio.run(run_attack(server.url, server.proc.pid, name, duration, holders=3))
        finally:
            server.stop()
        row["server"] = label
        rows.append(row)
        r = row
        print(f"{label:8} {name:17} lag p50 {r['lag_ms']['p50']:7.1f} p99 {r['lag_ms']['p99']:8.1f} "
              f"max {r['lag_ms']['max']:8.1f} ms, {r['frames_over_80ms']:3} frames > 80 ms; server CPU "
              f"{r['server_cpu_s']:5.1f} s; RSS {r['rss_mb']['before']} -> {r['rss_mb']['peak']} -> "
              f"{r['rss_mb']['after']} MB; {r['attacker']}", flush=True)
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--talker"]:
        talker_process(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per attack (default 10)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated (default: all)")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to run first (the before)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hostile_clients.json")
    args = parser.parse_args()
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {sorted(unknown)}")
    here = Path(__file__).resolve().parents[1]
    rows = []
    if args.baseline is not None:
        rows += run_tree(args.baseline.resolve(), "before", attacks, args.duration)
    rows += run_tree(here, "now", attacks, args.duration)
    write_report({"benchmark": "hostile_clients", "when": now_utc(), "machine": machine_info(),
                  "parameters": {"duration_s": args.duration, "attacks": attacks,
                                 "baseline": str(args.baseline) if args.baseline else None},
                  "rows": rows}, args.out)


if __name__ == "__main__":
    main()
