"""Soak: simulated v3 and tiered sessions talking for a long time; does the server's memory, task count, file
descriptors, threads or cadence drift?

The server (simulator model) runs in a child process, so its RSS is the server's alone; it reports RSS, open
asyncio tasks on its loop, threads, open file descriptors, live sessions and its own count of late positions every
``--sample-s``. Every client slot talks without pause: continuous real-time microphone audio (80 ms appends of
simulator speech or silence) and turns of several kinds, and every ``--session-s`` it ends its session and opens a
new one (churn).

- ``--sessions`` v3 slots (``/v1/voicechat``): voice turns, typed input (``input_text.request``) and tool calls
  (``get_weather``: arguments -> result -> post-tool speech), each session ended by ``session.stop``.
- ``--tiered`` tiered slots (``/v1/duplex``, full lane): voice turns, typed input (``input.text.append``), tool
  calls (result + ``response.create``), barge-ins (``barge_in`` during a long answer, then a new question) and
  drops: the TCP transport is aborted mid-question, the slot reconnects after up to a second and resumes
  (``session.resume``), resending the audio the server's input receipt lacks (``client/input_journal.py``); the
  answer must repeat the whole question. Sessions end with ``session.close``, or (one in five) are abandoned
  without a close and expire after the server's grace.

Figures: RSS over time and its slope (MiB/hour, least squares over the samples after the first 10 %), open tasks,
threads and file descriptors (start, max, end), late positions (the server's tallies, both dialects: a position
started >= 40 ms after it was due; plus v3's ``voicechat.metrics`` and positions over the 80 ms budget), responses
by kind and status, errors, events lost or duplicated across resumes, resumes and the input they resent, and
(``--trace``) trace invariant violations on every socket. JSON (+ a PNG with matplotlib).

    .venv/bin/python benchmarks/soak.py                                 # 1 hour, 4 v3 + 4 tiered slots
    .venv/bin/python benchmarks/soak.py --duration 300                  # the 5-minute version
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # allow running from a checkout without installing the package
    import vllm_omni_voicechat  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import websockets
from _common import rss_bytes, v3_append

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.bench.workload import split_frames
from vllm_omni_voicechat.client.input_journal import InputGap, InputJournal

RESULTS = Path(__file__).resolve().parent / "results"
LATE_MS = 40.0  # a position that started half a frame or more after it was due
WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
PHRASES = ("hello there", "what time is it", "tell me about the sea", "thanks a lot", "how are you today",
           "can you help me", "that sounds great")
CITIES = ("Paris", "Oslo", "Lima", "Rome")


# ====================================================================== the server (child process)


class GcPauses:
    """A ``gc.callbacks`` entry: full (generation 2) collections and the longest pause of any collection since the
    last sample. A pause stops the server's loop and every session's model thread alike."""

    def __init__(self) -> None:
        self.full = 0
        self.max_ms = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.max_ms = max(self.max_ms, (time.perf_counter() - self._t0) * 1000)
        self.full += info["generation"] == 2

    def take(self) -> dict:
        out = {"full": self.full, "max_pause_ms": round(self.max_ms, 2)}
        self.full, self.max_ms = 0, 0.0
        return out


def serve_child(sample_s: float, trace: bool, grace_s: float) -> None:
    """Child process: serve, print ``READY <url>``, then one JSON stats line per sample until stdin closes."""
    from vllm_omni_voicechat.server import ServerConfig
    from vllm_omni_voicechat.server.inprocess import InProcessServer

    checkers: list[Any] = []
    kw: dict[str, Any] = {}
    if trace:
        from vllm_omni_voicechat.trace import TraceChecker

        def factory(dialect: str) -> Any:
            checker = TraceChecker(dialect)  # type: ignore[arg-type]
            checkers.append(checker)
            return checker

        kw["trace_factory"] = factory
    server = InProcessServer(ServerConfig.simulator(max_sessions=64, settlement_blank_frames=3,
                                                    disconnect_grace_s=grace_s, **kw), manage_heap=True)
    app = server.app.state.voicechat
    print(f"READY {server.url}", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    async def count_tasks() -> int:
        return len(asyncio.all_tasks())

    async def late_counts() -> dict:
        """The server's own tallies (ended + live sessions), read on its loop: positions, late, over budget."""
        totals = app.usage.totals()
        return {"positions": {d: t.position_count for d, t in totals.items()},
                "late": {d: t.late for d, t in totals.items()},
                "over_budget": {d: t.over_budget for d, t in totals.items()},
                "resumes": dict(app.usage.resumes)}

    pauses = GcPauses()
    gc.callbacks.append(pauses)
    started = time.monotonic()
    while not stop.wait(sample_s):
        tasks = asyncio.run_coroutine_threadsafe(count_tasks(), server.loop).result(10)
        totals = asyncio.run_coroutine_threadsafe(late_counts(), server.loop).result(10)
        names = [t.name for t in threading.enumerate()]
        print(json.dumps({"t": round(time.monotonic() - started, 3), "rss": rss_bytes(), "tasks": tasks,
                          "threads": len(names),
                          "model_threads": sum(n.startswith("voicechat-model") for n in names),
                          "pool_threads": sum(n.startswith(("voicechat-model", "asyncio_", "uvloop_")) for n in names),
                          "fds": len(os.listdir("/proc/self/fd")),
                          "sessions": len(app.live), "active": app.admission.active, **totals,
                          "gc": pauses.take()}), flush=True)
    from vllm_omni_voicechat.session.core import SessionCore

    # Every session has ended by now: none of them may still be in memory (their cycles collected).
    cores_alive = sum(isinstance(o, SessionCore) for o in gc.get_objects())
    server.stop()
    violations = [v for c in checkers for v in c.violations]
    thread_names = sorted(t.name for t in threading.enumerate())
    print(json.dumps({"final": True, "session_cores_alive": cores_alive, "heap_collections": app.heap.collections,
                      "threads_at_end": thread_names,
                      "sockets_traced": len(checkers), "trace_violations": violations[:50],
                      "trace_violation_count": len(violations), "backpressure_overflows":
                      sum(s["outbound_overflows"] for s in app.host.backpressure)}), flush=True)




class ServerProcess:
    def __init__(self, sample_s: float, trace: bool, grace_s: float = 5.0) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-child",
                                      "--sample-s", str(sample_s), *(["--trace"] if trace else []),
                                      "--grace", str(grace_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"server child did not start: {line!r}")
        self.url = line.split()[1]
        self.samples: list[dict] = []
        self.final: dict = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            data = json.loads(line)
            if data.get("final"):
                self.final = data
            else:
                self.samples.append(data)

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
        self._reader.join(10)


# ====================================================================== the client slots


append = v3_append
frames = split_frames


SILENCE = append(bytes(INPUT_FRAME_BYTES))


@dataclass
class SlotStats:
    sessions: int = 0
    closed_ok: int = 0
    positions: int = 0
    server_late_ms: list[float] = field(default_factory=list)
    over_budget: int = 0
    responses: dict[str, int] = field(default_factory=dict)  # "kind/status" -> count
    errors: dict[str, int] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    # tiered slots only
    answered: int = 0  # turns whose last response completed
    abandoned: int = 0
    resumes: int = 0
    input_resent: int = 0
    input_gaps: int = 0
    input_intact: int = 0  # resumed questions answered with the whole question
    lost_events: int = 0
    duplicate_events: int = 0
    anomalies: list[str] = field(default_factory=list)  # the first few unexpected outcomes, for the report

    def note(self, what: str) -> None:
        if len(self.anomalies) < 20:
            self.anomalies.append(what[:300])

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class Slot:
    """One client slot: sessions back to back, each talking for ``session_s``."""

    def __init__(self, url: str, seed: int, session_s: float, stats: SlotStats) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.session_s = session_s
        self.stats = stats

    async def run(self, until: float) -> None:
        while time.monotonic() < until - 5.0:
            await self._session(min(until, time.monotonic() + self.session_s))

    async def _session(self, until: float) -> None:
        st = self.stats
        async with websockets.connect(self.url + "/v1/voicechat", ping_interval=None, max_size=None) as ws:
            st.sessions += 1
            state = {"done": asyncio.Event(), "closed": asyncio.Event(), "kind": "voice"}
            await ws.send(json.dumps({"type": "session.update", "event_id": "u1", "session": {
                "protocol_version": 3, "instructions": "Use tools.", "tools": WEATHER}}))
            while json.loads(await ws.recv())["type"] != "session.updated":
                pass
            reader = asyncio.ensure_future(self._read(ws, state))
            try:
                await self._talk(ws, state, until)
                await ws.send(json.dumps({"type": "session.stop", "event_id": "stop"}))
                await asyncio.wait_for(state["closed"].wait(), 30)
                st.closed_ok += 1
            except TimeoutError:
                st.timeouts += 1
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, ws: Any, state: dict) -> None:
        st = self.stats
        async for raw in ws:
            e = json.loads(raw)
            t = e["type"]
            if t == "voicechat.metrics":
                st.positions += 1
                st.over_budget += bool(e.get("over_budget"))
                late = (e.get("turn_state") or {}).get("late_ms")
                if isinstance(late, (int, float)):
                    st.server_late_ms.append(float(late))
            elif t == "response.done":
                key = f"{state['kind']}/{e['status']}"
                st.responses[key] = st.responses.get(key, 0) + 1
                state["done"].set()
            elif t == "response.function_call_arguments.done":
                city = json.loads(e["arguments"]).get("city", "?")
                await ws.send(json.dumps({"type": "conversation.item.create", "event_id": f"out_{e['call_id']}",
                                          "item": {"type": "function_call_output", "call_id": e["call_id"],
                                                   "output": json.dumps({"city": city, "temp_c": 21})}}))
            elif t == "error":
                code = e["error"]["code"]
                st.errors[code] = st.errors.get(code, 0) + 1
            elif t == "session.closed":
                state["closed"].set()

    async def _talk(self, ws: Any, state: dict, until: float) -> None:
        tick = time.monotonic()
        k = 0

        async def frame(text: str = SILENCE) -> None:
            nonlocal tick
            tick += 0.08
            await ws.send(text)
            await asyncio.sleep(max(0.0, tick - time.monotonic()))  # real-time microphone

        async def until_done(limit: int = 400) -> None:
            for _ in range(limit):
                if state["done"].is_set():
                    return
                await frame()
            self.stats.timeouts += 1

        while time.monotonic() < until:
            for _ in range(self.rng.randint(3, 12)):
                await frame()
            kind = self.rng.choice(("voice", "voice", "typed", "tool"))
            state["kind"] = kind
            self.stats.turns[kind] = self.stats.turns.get(kind, 0) + 1
            state["done"].clear()
            if kind == "typed":
                k += 1
                await ws.send(json.dumps({"type": "input_text.request", "event_id": f"t{k}", "job_id": f"job{k}",
                                          "text": self.rng.choice(PHRASES)}))
            else:
                k += 1
                text = (f'call get_weather {{"city": "{self.rng.choice(CITIES)}"}}' if kind == "tool"
                        else self.rng.choice(PHRASES))
                await ws.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": f"s{k}",
                                          "client_turn_id": k}))
                for f in frames(render_speech(text)):
                    await frame(append(f))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"c{k}",
                                          "client_turn_id": k}))
            await until_done()


TIERED_KINDS = ("voice", "voice", "typed", "tool", "barge_in", "drop")
ABANDON_SHARE = 0.2
LONG = "please tell me a very long story about the sea and the sky"


class Abandoned(Exception):
    """The slot left a turn it could not finish (a timeout): the session is abandoned, not closed."""


class TieredSocket:
    """One tiered session as a client sees it across its sockets: the seq cursor (losses and duplicates counted),
    the resume token, the input journal, and the events of the current turn."""

    def __init__(self, url: str, stats: SlotStats) -> None:
        self.url = url
        self.st = stats
        self.ws: Any = None
        self.reader: asyncio.Future | None = None
        self.session_id = ""
        self.token = ""
        self.last_seq = 0
        self.journal = InputJournal()
        self.events: list[dict] = []
        self.changed = asyncio.Event()
        self.kind = "voice"
        self.connected = False
        self._n = 0

    async def open(self) -> None:
        self.ws = await websockets.connect(self.url + "/v1/duplex", ping_interval=None, max_size=None)
        await self.ws.send(json.dumps({"type": "session.update", "event_id": "u1", "session": {
            "instructions": "Use tools.", "tools": WEATHER}}))
        created = json.loads(await self.ws.recv())
        if created["type"] != "session.created":
            raise RuntimeError(f"no session: {created}")
        self.session_id, self.token = created["session"]["id"], created["resume_token"]
        self.connected = True
        self.reader = asyncio.ensure_future(self._read(self.ws))

    async def _read(self, ws: Any) -> None:
        try:
            async for raw in ws:
                event = json.loads(raw)
                seq = event.get("server_event_seq")
                if isinstance(seq, int):
                    if seq <= self.last_seq:
                        self.st.duplicate_events += 1
                        continue
                    self.st.lost_events += seq - self.last_seq - 1
                    self.last_seq = seq
                    if seq % 64 == 0:  # what DuplexClient does per event, here in batches: the journal stays small
                        await ws.send(json.dumps({"type": "session.event_ack", "server_event_seq": seq}))
                await self._handle(ws, event)
        except websockets.ConnectionClosed:
            pass

    async def _handle(self, ws: Any, e: dict) -> None:
        t = e["type"]
        if t == "response.done":
            status = e["response"]["status"]
            self.st.count(self.st.responses, f"{self.kind}/{status}")
            if status != "completed" and self.kind != "barge_in":
                self.st.note(f"{self.kind}: response {status}: {e['response'].get('status_details')}")
        elif t == "response.function_call_arguments.done":
            city = json.loads(e["arguments"]).get("city", "?")
            await ws.send(json.dumps({"type": "conversation.item.create", "event_id": f"out_{e['call_id']}", "item": {
                "type": "function_call_output", "call_id": e["call_id"],
                "output": json.dumps({"city": city, "temp_c": 21})}}))
            await ws.send(json.dumps({"type": "response.create", "event_id": f"rc_{e['call_id']}"}))
        elif t == "error":
            self.st.count(self.st.errors, e["error"]["code"])
        self.events.append(e)
        self.changed.set()

    async def append(self, pcm: bytes) -> None:
        """One 80 ms microphone frame: journaled, then sent (while disconnected only journaled)."""
        self._n += 1
        text = json.dumps({"type": "input_audio_buffer.append", "event_id": f"a{self._n}",
                           "audio": base64.b64encode(pcm).decode()})
        self.journal.record(f"a{self._n}", len(pcm), text)
        if self.connected:
            try:
                await self.ws.send(text)
            except websockets.ConnectionClosed:
                self.connected = False  # the journal has it

    def drop(self) -> None:
        """The network fails: the TCP transport is aborted (no close handshake)."""
        self.connected = False
        self.ws.transport.abort()

    async def resume(self) -> None:
        if self.reader is not None:
            await asyncio.wait_for(self.reader, 10)
        ws = await websockets.connect(self.url + "/v1/duplex?autostart=0", ping_interval=None, max_size=None)
        await ws.send(json.dumps({"type": "session.resume", "session_id": self.session_id,
                                  "resume_token": self.token, "last_received_server_event_seq": self.last_seq}))
        resumed = json.loads(await ws.recv())
        if resumed["type"] != "session.resumed":
            raise RuntimeError(f"resume refused: {resumed}")
        self.token = resumed["resume_token"]
        self.ws, self.connected = ws, True
        self.reader = asyncio.ensure_future(self._read(ws))
        try:
            again = self.journal.unreceived(resumed["input_received"])
        except InputGap:
            self.st.input_gaps += 1
            again = []
        for entry in again:
            await ws.send(entry.text)
        self.st.resumes += 1
        self.st.input_resent += len(again)

    async def close(self) -> None:
        await self.ws.send(json.dumps({"type": "session.close", "event_id": "close"}))
        await asyncio.wait_for(self.reader, 30)
        if not any(e["type"] == "session.closed" for e in self.events[-3:]):
            raise RuntimeError("no session.closed")

    async def shutdown(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.ws is not None:
            await self.ws.close()


class TieredSlot:
    """One tiered client slot: sessions back to back on ``/v1/duplex``, each talking for ``session_s``."""

    def __init__(self, url: str, seed: int, session_s: float, stats: SlotStats) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.session_s = session_s
        self.stats = stats
        self.tick = 0.0

    async def run(self, until: float) -> None:
        while time.monotonic() < until - 5.0:
            try:
                await self._session(min(until, time.monotonic() + self.session_s))
            except Abandoned:
                self.stats.timeouts += 1
            except Exception as exc:  # a broken session is a figure, not the end of the soak
                self.stats.count(self.stats.errors, f"client:{type(exc).__name__}: {exc}"[:120])

    async def _session(self, until: float) -> None:
        st = self.stats
        sock = TieredSocket(self.url, st)
        st.sessions += 1
        await sock.open()
        self.tick = time.monotonic()
        try:
            while time.monotonic() < until:
                for _ in range(self.rng.randint(3, 12)):
                    await self.frame(sock)
                await self.turn(sock, self.rng.choice(TIERED_KINDS))
            if self.rng.random() < ABANDON_SHARE:
                sock.drop()  # gone without a close: the server expires it after its grace
                st.abandoned += 1
            else:
                await sock.close()
                st.closed_ok += 1
        finally:
            await sock.shutdown()

    async def frame(self, sock: TieredSocket, pcm: bytes = bytes(INPUT_FRAME_BYTES)) -> None:
        self.tick += 0.08
        await sock.append(pcm)
        await asyncio.sleep(max(0.0, self.tick - time.monotonic()))  # real-time microphone

    async def until(self, sock: TieredSocket, predicate, limit: int = 400) -> dict:
        """Stream silence until an event of this turn matches (at most ``limit`` frames)."""
        for _ in range(limit):
            for e in sock.events:
                if predicate(e):
                    return e
            await self.frame(sock)
        self.stats.note(f"{sock.kind}: timed out; events {[e['type'] for e in sock.events][-8:]}")
        raise Abandoned

    async def say(self, sock: TieredSocket, text: str, drop_at: int | None = None) -> None:
        """Speak ``text`` in real time; with ``drop_at``, the transport fails before that frame, the user goes on
        talking into the journal for up to a second, and then the session resumes."""
        chunks = frames(render_speech(text))
        resume_at = None if drop_at is None else min(len(chunks) - 1, drop_at + self.rng.randint(0, 12))
        for i, f in enumerate(chunks):
            if i == drop_at:
                sock.drop()
            if i == resume_at:
                await sock.resume()
            await self.frame(sock, f)

    async def turn(self, sock: TieredSocket, kind: str) -> None:
        st = self.stats
        sock.kind = kind
        sock.events = []
        st.count(st.turns, kind)

        def done(status: str = "completed"):
            return lambda e: e["type"] == "response.done" and e["response"]["status"] == status

        if kind == "typed":
            await sock.ws.send(json.dumps({"type": "input.text.append", "event_id": f"t{self.rng.random()}",
                                           "text": self.rng.choice(PHRASES)}))
            await self.until(sock, done())
        elif kind == "tool":
            await self.say(sock, f'call get_weather {{"city": "{self.rng.choice(CITIES)}"}}')
            answer = await self.until(sock, lambda e: e["type"] == "response.output_audio_transcript.done"
                                      and "temp_c" in e["transcript"])  # the post-tool answer
            await self.until(sock, lambda e: e["type"] == "response.done" and e["response"]["id"] == answer[
                "response_id"])
        elif kind == "barge_in":
            await self.say(sock, LONG)
            await self.until(sock, lambda e: e["type"] == "response.output_audio.delta")
            await sock.ws.send(json.dumps({"type": "barge_in", "event_id": f"b{self.rng.random()}"}))
            await self.until(sock, done("cancelled"))
            sock.events = []
            await self.say(sock, self.rng.choice(PHRASES))
            await self.until(sock, done())
        else:  # voice; "drop": the transport fails mid-question and the session resumes
            text = LONG if kind == "drop" else self.rng.choice(PHRASES)
            drop_at = self.rng.randrange(1, len(frames(render_speech(text))) - 1) if kind == "drop" else None
            await self.say(sock, text, drop_at)
            answer = await self.until(sock, lambda e: e["type"] == "response.output_audio_transcript.done")
            await self.until(sock, done())
            if kind == "drop":
                if answer["transcript"] == f"You said: {text}.":
                    st.input_intact += 1
                else:
                    st.note(f"drop at {drop_at}: answered {answer['transcript']!r}")
        st.answered += 1


# ====================================================================== figures


def slope_mib_per_hour(samples: list[dict], skip: float = 0.1) -> float | None:
    pts = [(s["t"], s["rss"]) for s in samples if s.get("rss")]
    pts = pts[int(len(pts) * skip):]
    if len(pts) < 3:
        return None
    t = np.array([p[0] for p in pts]) / 3600.0
    m = np.array([p[1] for p in pts]) / 2**20
    return round(float(np.polyfit(t, m, 1)[0]), 3)


def merge(stats: list[SlotStats]) -> dict:
    def add(dicts: list[dict]) -> dict:
        out: dict[str, int] = {}
        for d in dicts:
            for k, v in d.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    late = np.array([x for s in stats for x in s.server_late_ms], dtype=float)
    return {
        "sessions": sum(s.sessions for s in stats), "sessions_closed_ok": sum(s.closed_ok for s in stats),
        "positions": sum(s.positions for s in stats), "turns": add([s.turns for s in stats]),
        "responses": add([s.responses for s in stats]), "errors": add([s.errors for s in stats]),
        "timeouts": sum(s.timeouts for s in stats),
        "late_positions": int((late >= LATE_MS).sum()) + sum(s.over_budget for s in stats),
        "server_late_positions": int((late >= LATE_MS).sum()), "over_budget_positions": sum(s.over_budget for s in stats),
        "server_late_ms_p99": round(float(np.percentile(late, 99)), 3) if late.size else None,
        **{k: sum(getattr(s, k) for s in stats) for k in (
            "answered", "abandoned", "resumes", "input_resent", "input_gaps", "input_intact", "lost_events",
            "duplicate_events")},
        "anomalies": [a for s in stats for a in s.anomalies][:40],
    }


async def drive(url: str, sessions: int, tiered: int, duration: float, session_s: float,
                seed: int) -> tuple[list[SlotStats], list[SlotStats]]:
    v3 = [SlotStats() for _ in range(sessions)]
    td = [SlotStats() for _ in range(tiered)]
    until = time.monotonic() + duration
    slots: list[Any] = [Slot(url, seed * 1000 + i, session_s, v3[i]) for i in range(sessions)]
    slots += [TieredSlot(url, seed * 1000 + 500 + i, session_s, td[i]) for i in range(tiered)]
    await asyncio.gather(*(s.run(until) for s in slots))
    return v3, td


def spread(samples: list[dict], key: str) -> dict:
    values = [s[key] for s in samples if key in s]
    return {"start": values[0], "max": max(values), "end": values[-1]} if values else {}


def run_soak(*, sessions: int, duration: float, session_s: float, sample_s: float, seed: int = 0,
             trace: bool = False, tiered: int = 0, grace_s: float = 5.0) -> dict:
    server = ServerProcess(sample_s, trace, grace_s)
    started = time.monotonic()
    try:
        v3, td = asyncio.run(drive(server.url, sessions, tiered, duration, session_s, seed))
        time.sleep(grace_s + 2 * sample_s)  # abandoned sessions expire; open tasks back to idle  # ok
    finally:
        server.stop()
    samples = server.samples
    rss = [s["rss"] for s in samples if s.get("rss")]
    last = samples[-1] if samples else {}
    return {
        "parameters": {"sessions": sessions, "tiered": tiered, "duration_s": duration, "session_s": session_s,
                       "sample_s": sample_s, "seed": seed, "trace": trace, "late_ms": LATE_MS,
                       "grace_s": grace_s},
        "wall_s": round(time.monotonic() - started, 2),
        "rss_mib": {"start": round(rss[0] / 2**20, 2) if rss else None,
                    "max": round(max(rss) / 2**20, 2) if rss else None,
                    "end": round(rss[-1] / 2**20, 2) if rss else None},
        "memory_slope_mib_per_hour": slope_mib_per_hour(samples),
        "open_tasks": spread(samples, "tasks"),
        "threads": spread(samples, "threads"),
        # the server's bounded pools (its shared model pool; the loop's default executor, asyncio's or uvloop's,
        # which synthesizes typed input) start threads on demand and keep them: every other thread must be back
        # where it started
        "model_threads": spread(samples, "model_threads"),
        "threads_outside_pools": spread([{"n": x["threads"] - x.get("pool_threads", 0)} for x in samples], "n"),
        "fds": spread(samples, "fds"),
        "server_positions": last.get("positions", {}),
        "server_late_positions": last.get("late", {}),
        "server_over_budget_positions": last.get("over_budget", {}),
        "server_resumes": last.get("resumes", {}),
        "gc": {"full_collections": sum(x["gc"]["full"] for x in samples if "gc" in x),
               "max_pause_ms": max((x["gc"]["max_pause_ms"] for x in samples if "gc" in x), default=None)},
        "clients": merge(v3 + td),
        "v3": merge(v3),
        "tiered": merge(td),
        "server": server.final,
        "samples": samples,
    }


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    s = report["samples"]
    t = [x["t"] / 60 for x in s]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [x["rss"] / 2**20 for x in s], label="server RSS (MiB)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax2 = ax.twinx()
    ax2.plot(t, [x["tasks"] for x in s], color="tab:orange", label="open asyncio tasks")
    ax2.plot(t, [x.get("fds", 0) for x in s], color="tab:green", label="open file descriptors")
    ax2.plot(t, [x["threads"] for x in s], color="tab:red", label="threads")
    ax2.set_ylabel("count")
    p = report["parameters"]
    ax.set_title(f"soak: {p['sessions']} v3 + {p.get('tiered', 0)} tiered slots, RSS slope "
                 f"{report['memory_slope_mib_per_hour']} MiB/h")
    fig.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4, help="v3 client slots")
    ap.add_argument("--tiered", type=int, default=4, help="tiered client slots")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds (default one hour)")
    ap.add_argument("--session-s", type=float, default=300.0, help="each slot's session length before it restarts")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", action="store_true", help="trace-check every socket in the server (memory!)")
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    ap.add_argument("--png", type=Path, default=None, help="plot (default: next to --out)")
    ap.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--grace", type=float, default=5.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_child:
        serve_child(args.sample_s, args.trace, args.grace)
        return None
    report = run_soak(sessions=args.sessions, tiered=args.tiered, duration=args.duration, session_s=args.session_s,
                      sample_s=args.sample_s, seed=args.seed, trace=args.trace)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.png or args.out.with_suffix(".png"))
    for name in ("v3", "tiered"):
        c = report[name]
        print(f"{name}: {c['sessions']} sessions ({c['sessions_closed_ok']} closed, {c['abandoned']} abandoned), "
              f"turns {c['turns']}  responses {c['responses']}  errors {c['errors']}  timeouts {c['timeouts']}")
    t = report["tiered"]
    print(f"tiered resumes {t['resumes']} (input resent {t['input_resent']} appends, gaps {t['input_gaps']}, "
          f"questions intact {t['input_intact']}), events lost {t['lost_events']} duplicated {t['duplicate_events']}")
    print(f"server: positions {report['server_positions']}, late (>= 40 ms) {report['server_late_positions']}, "
          f"over budget {report['server_over_budget_positions']}; v3 metrics late_ms p99 "
          f"{report['v3']['server_late_ms_p99']}")
    print(f"server RSS {report['rss_mib']} MiB, slope {report['memory_slope_mib_per_hour']} MiB/h; open tasks "
          f"{report['open_tasks']}, threads {report['threads']}, fds {report['fds']}; collector {report['gc']}; "
          f"{report['server']}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
