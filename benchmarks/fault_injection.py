"""Transport fault injection with resume (tiered dialect), driven by vLLM-Omni 0.30.0's own ``DuplexClient``.

Each trial is one session against the in-process simulator server: it drops the client's TCP transport at a
random point (mid-audio, mid-response, mid-tool-call), lets the client reconnect after a random delay within the
server's disconnect grace and resume (``session.resume`` with its rotated token and last seq), and then finishes
the scenario. In a share of the trials (``--takeover``) the old socket is not dropped but frozen: the server still
has it attached when a second socket resumes the session, so the server answers ``session.replaced`` on the old
one and closes it with 1000.

Figures: success rate (per kind), events lost and duplicated on the wire (by ``server_event_seq``, counted over
every socket the client read), events delivered twice to the application, the replay latency (from the
client's ``session.resume`` to the last event the server had journaled when it was sent), p50/p99, and whether the
audio the client streamed reached the model intact in the mid-audio trials. Every trial plan runs once per client:
``stock`` (``DuplexClient``: what it wrote into the dying socket is lost) and ``ours`` (``ResumingDuplexClient``
from ``vllm_omni_voicechat.omni.client_preset``: it resends what the server's input receipt lacks).

    .omni-venv/bin/python benchmarks/fault_injection.py                   # 200 plans x both clients
    .omni-venv/bin/python benchmarks/fault_injection.py --kinds mid_audio --trials 100 --clients ours

It needs ``vllm_omni`` installed (the client is its ``vllm_omni/clients/duplex.py``, used unmodified); vLLM
itself is not imported (a namespace stub skips ``vllm_omni/__init__``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import random
import sys
import time
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # allow running from a checkout without installing the package
    import vllm_omni_voicechat  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.server.inprocess import InProcessServer
from vllm_omni_voicechat.trace.recorder import TraceRecorder

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("mid_audio", "mid_response", "mid_tool_call")
WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
SILENCE_200MS = bytes(2 * 3200)
CHUNK = 2 * 1280  # 80 ms of 16 kHz pcm16


def load_duplex_client() -> types.ModuleType:
    """``vllm_omni.clients.duplex`` without running ``vllm_omni/__init__`` (which imports vLLM and torch)."""
    name = "vllm_omni.clients.duplex"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm-omni is not installed: run with /tmp/omni-venv/bin/python")
    if "vllm_omni" not in sys.modules:
        stub = types.ModuleType("vllm_omni")
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules["vllm_omni"] = stub
    return importlib.import_module(name)


# ====================================================================== the client's transport


class Tap:
    """The client's WebSocket transport (DuplexClient's ``connect=`` seam): records every server event it hands
    the client, and can be dropped (TCP abort) or frozen (the client sees it fail; the server still has it)."""

    def __init__(self, ws: Any, trial: Trial) -> None:
        self.ws = ws
        self.trial = trial
        self.frozen = asyncio.Event()
        self.superseded: list[dict] = []  # what a frozen socket got afterwards (the takeover's session.replaced)
        self.close_code: int | None = None
        self._drain: asyncio.Task | None = None
        self._pending: asyncio.Future | None = None

    async def send(self, data: str) -> None:
        if self.frozen.is_set():
            raise ConnectionError("transport frozen")
        if '"session.resume"' in data:
            self.trial.resume_sent(json.loads(data))
        await self.ws.send(data)

    async def recv(self) -> str | bytes:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.ws.recv())
            self._pending.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved in any case
        frozen = asyncio.ensure_future(self.frozen.wait())
        try:
            await asyncio.wait({self._pending, frozen}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            frozen.cancel()
        if self.frozen.is_set():
            raise ConnectionError("transport frozen")  # the pending read is the drain's now
        pending, self._pending = self._pending, None
        raw = pending.result()  # raises when the connection is gone
        self.trial.received(raw)
        return raw

    async def close(self) -> None:
        if self._drain is None:
            await self.ws.close()

    def drop(self) -> None:
        self.ws.transport.abort()

    def freeze(self) -> None:
        """The client gives this socket up without closing it; keep reading it to see how the server retires it."""
        self.frozen.set()
        self._drain = asyncio.ensure_future(self._read_superseded())

    async def _read_superseded(self) -> None:
        import websockets

        try:
            while True:
                pending, self._pending = self._pending, None
                raw = await (pending if pending is not None else self.ws.recv())
                self.superseded.append(json.loads(raw))
        except websockets.ConnectionClosed:
            pass
        self.close_code = self.ws.close_code

    async def wait_superseded(self, timeout: float) -> None:
        if self._drain is not None:
            await asyncio.wait_for(asyncio.shield(self._drain), timeout)


# ====================================================================== one trial


@dataclass
class Trial:
    index: int
    kind: str
    takeover: bool
    delay_s: float
    app: Any
    client: str = "stock"
    taps: list[Tap] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # every server_event_seq the client's transports delivered
    events: list[dict] = field(default_factory=list)  # what the application saw (after the client's dedupe)
    app_seqs: list[int] = field(default_factory=list)
    session_id: str | None = None
    resume_at: float | None = None
    resume_head: int = 0
    replay_latency_s: float | None = None
    dropped_at: float | None = None
    failure: str | None = None
    notes: dict = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def received(self, raw: str | bytes) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return
        seq = event.get("server_event_seq") if isinstance(event, dict) else None
        if isinstance(seq, int):
            self.seqs.append(seq)
            if self.resume_at is not None and self.replay_latency_s is None and seq >= self.resume_head:
                self.replay_latency_s = time.monotonic() - self.resume_at
        if isinstance(event, dict) and event.get("type") == "session.resumed" and self.resume_head == 0:
            self.replay_latency_s = time.monotonic() - (self.resume_at or time.monotonic())  # nothing to replay

    def resume_sent(self, request: dict) -> None:
        att = self.app.live.resumable(request.get("session_id"))
        journal = att.protocol.journal if att is not None else None
        self.resume_at = time.monotonic()
        self.resume_head = journal.head if journal is not None else 0
        self.replay_latency_s = None
        if self.resume_head <= int(request.get("last_received_server_event_seq") or 0):
            self.resume_head = 0  # nothing missed: latency is the handshake

    def see(self, raw: dict) -> None:
        self.events.append(raw)
        seq = raw.get("server_event_seq")
        if isinstance(seq, int):
            self.app_seqs.append(seq)
        self._changed.set()

    async def wait(self, predicate, timeout: float = 20.0, *, start: int = 0) -> dict:
        """The first application event from ``start`` on that matches ``predicate``."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.events):
                if predicate(self.events[i]):
                    return self.events[i]
                i += 1
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event in {timeout} s")
            await asyncio.wait_for(self._changed.wait(), left)

    async def until(self, condition, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"condition not reached in {timeout} s")
            await asyncio.wait_for(self._changed.wait(), left)

    def count(self, type_: str) -> int:
        return sum(1 for e in self.events if e.get("type") == type_)

    def disrupt(self) -> None:
        """The fault: drop the current transport, or freeze it for a takeover."""
        self.dropped_at = time.monotonic()
        tap = self.taps[-1]
        if self.takeover:
            tap.freeze()
        else:
            tap.drop()


def is_type(*types_: str):
    return lambda e: e.get("type") in types_


async def retrying(dc: Any, trial: Trial, send) -> None:
    """``await send()``; a send that fails in the resume window (the transport is gone) is sent again once the
    client has resumed. (What the dropped transport had in flight may or may not have reached the server.)"""
    for _ in range(10):
        resumes = trial.count("connection.resumed")
        try:
            await send()
            return
        except dc.DuplexConnectionError:
            await trial.until(lambda n=resumes: trial.count("connection.resumed") > n)
    raise RuntimeError("send kept failing")


def speech_chunks(text: str) -> list[bytes]:
    pcm = render_speech(text) + SILENCE_200MS
    return [pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)]


def response_text(trial: Trial, response_id: str) -> str:
    return "".join(e.get("delta", "") for e in trial.events
                   if e.get("type") == "response.output_audio_transcript.delta" and e.get("response_id") == response_id)


def response_audio(trial: Trial, response_id: str) -> bytes:
    import base64

    return b"".join(base64.b64decode(e["delta"]) for e in trial.events
                    if e.get("type") == "response.output_audio.delta" and e.get("response_id") == response_id)


def accepted_input_bytes(trial: Trial) -> int | None:
    """The audio bytes the in-process server's session has taken in (docs/tiered-dialect.md §6.5)."""
    att = trial.app.live.resumable(trial.session_id)
    return None if att is None else att.protocol.input_buffer.accepted_bytes


async def run_trial(dc: Any, url: str, trial: Trial, rng: random.Random) -> None:
    import websockets

    async def connect(u: str) -> Tap:
        if trial.taps:  # a reconnect: the random delay within the grace
            await asyncio.sleep(trial.delay_s)
        tap = Tap(await websockets.connect(u, max_size=64 << 20, ping_interval=None), trial)
        trial.taps.append(tap)
        return tap

    tools = trial.kind == "mid_tool_call"
    config = dc.SessionConfig(instructions="Use tools." if tools else "",
                              extra_body={"realtime_tools": WEATHER} if tools else {})
    cls = dc.DuplexClient
    if trial.client == "ours":
        from vllm_omni_voicechat.omni.client_preset import ResumingDuplexClient as cls
    client = cls(url, model="sim", config=config, connect=connect, heartbeat_interval_s=None,
                 reconnect=dc.ReconnectPolicy(max_attempts=5, backoff_s=(0.0, 0.05)))
    async with client:
        trial.session_id = client.session_id

        async def consume() -> None:
            async for event in client.events():
                trial.see(event.raw)

        consumer = asyncio.ensure_future(consume())
        try:
            await scenario(dc, client, trial, rng)
            await client.close(timeout_s=20)
            await asyncio.wait_for(consumer, 10)
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
        if trial.client == "ours":
            trial.notes["input_resent"] = client.input_resent
            if client.input_gaps:
                trial.notes["input_gaps"] = client.input_gaps
    if trial.takeover:
        await trial.taps[0].wait_superseded(10)


async def scenario(dc: Any, client: Any, trial: Trial, rng: random.Random) -> None:
    if trial.kind == "mid_audio":
        text = "please tell me about the sea"
        chunks = speech_chunks(text)
        kill_at = rng.randrange(1, len(chunks))
        for i, chunk in enumerate(chunks):
            if i == kill_at:
                trial.disrupt()
            await retrying(dc, trial, lambda c=chunk: client.append_audio(c))
            await asyncio.sleep(0.02)  # pacing (~4x real time), so the drop lands mid-stream
        await retrying(dc, trial, client.commit)
        created = await trial.wait(is_type("response.created"))
        rid = created["response"]["id"]
        done = await trial.wait(lambda e: e.get("type") == "response.done" and e.get("response", {}).get("id") == rid)
        # Intact: the model heard the words, and the session took in exactly the bytes streamed (none twice). The
        # heartbeat is a barrier: once it is acknowledged, everything the client sent before it has been handled
        # (a model-owned end of utterance may answer before the last resent append arrives).
        await retrying(dc, trial, lambda: client.send({"type": "session.heartbeat"}))
        await trial.wait(is_type("session.heartbeat_ack"))
        taken = accepted_input_bytes(trial)
        trial.notes["input_bytes"] = {"streamed": sum(map(len, chunks)), "taken_in": taken}
        trial.notes["input_intact"] = (response_text(trial, rid) == f"You said: {text}."
                                       and taken == sum(map(len, chunks)))
        if done["response"]["status"] != "completed":
            raise AssertionError(f"response {done['response']['status']}")
    elif trial.kind == "mid_response":
        text = "please tell me a very long story about the sea and the sky"
        for chunk in speech_chunks(text):
            await client.append_audio(chunk)
        await client.commit()
        created = await trial.wait(is_type("response.created"))
        rid = created["response"]["id"]
        nth = rng.randrange(1, 16)
        await trial.until(lambda: sum(e.get("type") == "response.output_audio.delta" for e in trial.events) >= nth)
        trial.disrupt()
        done = await trial.wait(lambda e: e.get("type") == "response.done" and e.get("response", {}).get("id") == rid)
        expected = f"You said: {text}."
        if done["response"]["status"] != "completed" or response_text(trial, rid) != expected:
            raise AssertionError(f"response {done['response']['status']}: {response_text(trial, rid)!r}")
        if decode_speech(response_audio(trial, rid), 24_000) != expected:
            raise AssertionError("response audio does not decode to its transcript")
    else:  # mid_tool_call
        for chunk in speech_chunks('call get_weather {"city": "Paris"}'):
            await client.append_audio(chunk)
        await client.commit()
        point = rng.choice(("after_response_created", "after_arguments_done"))
        if point == "after_response_created":
            await trial.wait(is_type("response.created"))
            trial.disrupt()
        args = await trial.wait(is_type("response.function_call_arguments.done"))
        if point == "after_arguments_done":
            trial.disrupt()
            # What a client writes as its transport dies may be lost without an error (the write lands in an
            # aborted transport), and a tool result must not be sent twice: wait until resumed, then send.
            await trial.until(lambda: trial.count("connection.resumed") > 0)
        trial.notes["point"] = point
        output = {"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": args["call_id"], "output": '{"temp_c": 21}'}}
        await retrying(dc, trial, lambda: client.send(output))
        await retrying(dc, trial, lambda: client.send({"type": "response.create"}))
        done = await trial.wait(lambda e: e.get("type") == "response.done"
                                and "21" in response_text(trial, e.get("response", {}).get("id", "")))
        if done["response"]["status"] != "completed":
            raise AssertionError(f"post-tool response {done['response']['status']}")
    if trial.count("connection.resumed") != 1:
        raise AssertionError(f"{trial.count('connection.resumed')} resumes")


def judge(trial: Trial) -> dict:
    closed = [e for e in trial.events if e.get("type") == "session.closed"]
    last = closed[-1].get("server_event_seq") if closed else (max(trial.seqs) if trial.seqs else 0)
    received = set(trial.seqs)
    lost = sorted(set(range(1, (last or 0) + 1)) - received)
    wire_dups = sum(n - 1 for n in Counter(trial.seqs).values() if n > 1)
    app_dups = sum(n - 1 for n in Counter(trial.app_seqs).values() if n > 1)
    failure = trial.failure
    if failure is None and not closed:
        failure = "no session.closed"
    if failure is None and lost:
        failure = f"lost seqs {lost[:10]}"
    if failure is None and app_dups:
        failure = f"{app_dups} events delivered twice"
    if trial.takeover and failure is None:
        old = trial.taps[0]
        kinds = [e.get("type") for e in old.superseded]
        if "session.replaced" not in kinds or old.close_code != 1000:
            failure = f"takeover: old socket got {kinds[-3:]} close {old.close_code}"
    return {"index": trial.index, "client": trial.client, "kind": trial.kind, "takeover": trial.takeover,
            "delay_s": round(trial.delay_s, 3),
            "ok": failure is None, "failure": failure, "lost": len(lost), "wire_duplicates": wire_dups,
            "app_duplicates": app_dups, "sockets": len(trial.taps), "events": len(trial.events),
            "replay_latency_ms": None if trial.replay_latency_s is None else round(trial.replay_latency_s * 1e3, 3),
            **trial.notes}


CLIENTS = ("stock", "ours")


async def run_trials(dc: Any, url: str, app: Any, *, trials: int, seed: int, concurrency: int, max_delay_s: float,
                     takeover_share: float, timeout_s: float = 60.0, kinds: tuple[str, ...] = KINDS,
                     clients: tuple[str, ...] = ("stock",)) -> dict:
    """Run ``trials`` trial plans, each once per client (``concurrency`` at a time) against a running server; the
    report dict (figures per client under ``by_client`` when there are several)."""
    rng = random.Random(seed)
    plans = [(i, rng.choice(kinds), rng.random() < takeover_share, rng.uniform(0.0, max_delay_s), rng.random())
             for i in range(trials)]
    results: list[dict] = []
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def one(i: int, kind: str, takeover: bool, delay: float, sub: float, client: str) -> None:
        async with gate:
            trial = Trial(i, kind, takeover, delay, app, client)
            try:
                await asyncio.wait_for(run_trial(dc, url, trial, random.Random(sub)), timeout_s)
            except Exception as exc:  # a failed trial is a figure, not a crash
                trial.failure = f"{type(exc).__name__}: {exc}"[:300]
            results.append(judge(trial))

    await asyncio.gather(*(one(*p, client) for p in plans for client in clients))
    results.sort(key=lambda r: (r["index"], CLIENTS.index(r["client"])))
    report = summarize(results, time.monotonic() - started)
    if len(clients) > 1:
        report["by_client"] = {c: {k: v for k, v in summarize([r for r in results if r["client"] == c], 0).items()
                                   if k not in ("results", "wall_s")} for c in clients}
    return report


def summarize(results: list[dict], wall_s: float) -> dict:
    lat = np.array([r["replay_latency_ms"] for r in results if r["replay_latency_ms"] is not None], dtype=float)
    by_kind = {}
    for kind in KINDS:
        rs = [r for r in results if r["kind"] == kind]
        by_kind[kind] = {"trials": len(rs), "ok": sum(r["ok"] for r in rs)}
    takeovers = [r for r in results if r["takeover"]]
    audio = [r for r in results if r["kind"] == "mid_audio" and r["ok"]]
    return {
        "trials": len(results),
        "succeeded": sum(r["ok"] for r in results),
        "success_rate": round(sum(r["ok"] for r in results) / max(1, len(results)), 4),
        "by_kind": by_kind,
        "takeover": {"trials": len(takeovers), "ok": sum(r["ok"] for r in takeovers)},
        "lost_events": sum(r["lost"] for r in results),
        "wire_duplicate_events": sum(r["wire_duplicates"] for r in results),
        "app_duplicate_events": sum(r["app_duplicates"] for r in results),
        "events": sum(r["events"] for r in results),
        "replay_latency_ms": {
            "count": int(lat.size),
            "p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
            "p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
            "max": round(float(lat.max()), 3) if lat.size else None,
        },
        "mid_audio_input_intact": {"ok_trials": len(audio), "intact": sum(bool(r.get("input_intact")) for r in audio),
                                   "resent_appends": sum(r.get("input_resent", 0) for r in audio),
                                   "gaps": sum(len(r.get("input_gaps", ())) for r in audio)},
        "failures": Counter((r["failure"] or "")[:80] for r in results if not r["ok"]).most_common(10),
        "wall_s": round(wall_s, 2),
        "results": results,
    }


# ====================================================================== the server


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--grace", type=float, default=3.0, help="the server's disconnect grace (s)")
    ap.add_argument("--max-delay", type=float, default=None, help="reconnect delay upper bound (default 0.8 x grace)")
    ap.add_argument("--takeover", type=float, default=0.25, help="share of trials where a second socket takes over")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="fault kinds drawn from")
    ap.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS),
                    help="each plan runs once per client (default: both)")
    ap.add_argument("--out", type=Path, default=RESULTS / "fault_injection.json")
    args = ap.parse_args(argv)
    dc = load_duplex_client()
    max_delay = args.max_delay if args.max_delay is not None else 0.8 * args.grace
    traces = TraceRecorder()  # every socket of every trial through the trace invariants
    server = InProcessServer(ServerConfig.simulator(max_sessions=max(4, 2 * args.concurrency),
                                                    disconnect_grace_s=args.grace, settlement_blank_frames=3,
                                                    trace_factory=traces))
    try:
        report = asyncio.run(run_trials(dc, server.url, server.app.state.voicechat, trials=args.trials,
                                        seed=args.seed, concurrency=args.concurrency, max_delay_s=max_delay,
                                        takeover_share=args.takeover, kinds=tuple(args.kinds),
                                        clients=tuple(args.clients)))
    finally:
        server.stop()
    report["trace"] = traces.summary()
    report["server_resumes"] = dict(server.app.state.voicechat.usage.resumes)  # refused: e.g. after the grace
    report["parameters"] = {"trials": args.trials, "seed": args.seed, "concurrency": args.concurrency,
                            "disconnect_grace_s": args.grace, "max_reconnect_delay_s": max_delay,
                            "takeover_share": args.takeover, "kinds": args.kinds, "clients": args.clients}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lat = report["replay_latency_ms"]
    print(f"trials {report['trials']}  success {report['succeeded']}/{report['trials']} "
          f"({100 * report['success_rate']:.1f} %)  by kind {report['by_kind']}  takeover {report['takeover']}")
    print(f"events {report['events']}  lost {report['lost_events']}  duplicated to the app "
          f"{report['app_duplicate_events']}  duplicated on the wire {report['wire_duplicate_events']}")
    print(f"replay latency p50 {lat['p50']} ms  p99 {lat['p99']} ms  max {lat['max']} ms  "
          f"mid-audio input intact {report['mid_audio_input_intact']}  wall {report['wall_s']} s")
    for client, figures in report.get("by_client", {}).items():
        print(f"  {client}: success {figures['succeeded']}/{figures['trials']}  lost {figures['lost_events']}  "
              f"dup {figures['app_duplicate_events']}  mid-audio input intact {figures['mid_audio_input_intact']}")
    print(f"trace invariants: {report['trace']['sockets']} sockets, {report['trace']['violations']} violations; "
          f"server resumes {report['server_resumes']}")
    for failure, n in report["failures"]:
        print(f"  FAILED x{n}: {failure}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
