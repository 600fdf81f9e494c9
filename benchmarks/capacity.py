#!/usr/bin/env python
"""Maximum concurrent real-time sessions one server process holds with zero late positions, per dialect.

The server is the shipped one (``python -m vllm_omni_voicechat.cli serve``, CPU simulator) in a fresh child
process per trial; v3 sessions on ``/v1/voicechat``, tiered ones on ``/v1/duplex`` (full lane, acknowledging
like ``DuplexClient``). The load generator runs in its own processes (``--generators``, default 2), each with its
share of the sessions and its own CPU accounting. Every session runs the shared scripted talker
(``_common.ScriptedClient`` with ``mix``: pauses, spoken turns, typed turns, spoken function calls answered by
the client) in real time: one 80 ms append per session on an absolute schedule, starts spread across one frame.

A trial: connect and configure every session (staggered), stream for ``--warmup`` seconds (not judged), then
judge a steady-state window of ``--window`` seconds (turn starts, pre-roll bursts, typed and tool turns all fall
inside it). In the window, from the server (``/v1/usage`` deltas): positions, **late** positions (started 40 ms
or more after they could run: a microphone frame from when the server read it off the socket, a pre-roll frame
from its release; step queueing and loop lag), **late inbox** messages (a client message read 40 ms or more after it arrived: loop lag),
**over-budget** ones (a step > 80 ms); for v3 also from the client: each position's ``voicechat.metrics`` arriving
> 80 ms after the client sent its frame (**delivery**: the loop or the transport fell behind, end to end). A
loop-lag probe times ``/health`` round trips. A trial passes with zero late, late-inbox, over-budget and
delivery-late positions, no errors, every v3 frame answered, and no generator behind its
schedule by > 40 ms or above 90 % of a core in the window (else ``client_limited``: the load generator, not the
server, failed). Server CPU per session-frame and per position come from the server process's own CPU time in
the window; threads and RSS from /proc.

Without ``--sessions`` the search doubles from ``--start`` while trials pass, then bisects between the last
pass and the first failure (stopping within 1/8), within ``--max-trials`` per dialect. On a shared 2-core
machine the clients and the server compete for the cores: the figure is a floor.

Usage::

    python benchmarks/capacity.py                              # both dialects, searched (~20 min)
    python benchmarks/capacity.py --dialects v3 --sessions 300 # one trial at 300 v3 sessions
    python benchmarks/capacity.py --server-root /tmp/old       # the server of another checkout (before/after)
    python benchmarks/capacity.py --server-python /other/venv/bin/python  # the server on another interpreter
    python benchmarks/capacity.py --quick                      # a few sessions, a few seconds
    python benchmarks/capacity.py --dialects v3 --sessions 120 --against /tmp/old --rounds 5  # paired before/after

``--against ROOT`` measures a change instead of a capacity: each round serves the same load from this checkout's
server and from ``ROOT``'s at the same time (two servers, two sets of generators with the same seed, the same
window), and reports this one's server CPU per session-frame over the other's. Both share the host's mood of the
minute, which moved single trials by +-8 % on the shared VM (the paired ratio of a checkout against itself stayed
within 1.00-1.03); each server's own figures are under the other's load, so the ratio, not either figure, is the
result. Which server starts first alternates by round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    RESULTS,
    WEATHER,
    AppendCache,
    ScriptedClient,
    machine_info,
    proc_cpu,
    pyplot,
    rss_bytes,
    session_update,
    summarize_us,
    write_report,
)

DEFAULT_OUT = RESULTS / "capacity.json"
FRAME_S = 0.08
DELIVERY_LATE_MS = 80.0
CLIENT_SLIP_S = 0.040
CLIENT_CPU_LIMIT = 0.9
CONNECT_GAP_S = 0.01
ROUTES = {"v3": "/v1/voicechat", "tiered": "/v1/duplex"}
REPO = Path(__file__).resolve().parents[1]
_SEQ = re.compile(r'"server_event_seq":\s*(\d+)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid: int) -> dict:
    """CPU seconds (user + system, all threads), threads and RSS of a process, from /proc."""
    out: dict = {"cpu_s": None, "threads": None, "rss_bytes": rss_bytes(pid)}
    try:
        out["cpu_s"], out["threads"] = proc_cpu(pid)
    except (OSError, IndexError, ValueError):
        pass
    return out


# ====================================================================== the server (child process)


class Server:
    """The shipped server in a child process (its own interpreter and GIL), from ``root``'s code."""

    def __init__(self, max_sessions: int, root: Path = REPO, python: str = sys.executable) -> None:
        self.port = free_port()
        cmd = [python, "-m", "vllm_omni_voicechat.cli", "serve", "--port", str(self.port),
               "--max-sessions", str(max_sessions), "--log-level", "warning"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:  # startup poll of a child process: there is no event to wait on
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                self.get("/health")
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        self.base = f"ws://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ====================================================================== the load generator (its own process)


class Tally:
    def __init__(self) -> None:
        self.connected = 0
        self.frames_sent = 0  # in the window
        self.frames_answered = 0  # v3: window frames whose position's metrics came back
        self.gated = 0  # v3: window frames before the session's first turn (no position)
        self.deferred = 0  # v3: window frames a function cycle held (replayed after it, by design)
        self.positions = 0
        self.delivery_late = 0
        self.lag_ms: list[float] = []
        self.late_ms: list[float] = []
        self.late_examples: list[dict] = []
        self.errors: list[str] = []
        self.responses = 0
        self.turns: dict[str, int] = {}
        self.function_outputs = 0
        self.max_slip_s = 0.0
        self.cpu_window_s = 0.0
        self.gc_pauses: list[tuple[float, int, float]] = []  # (monotonic start, generation, ms) over 5 ms

    def to_json(self) -> dict:
        return dict(vars(self))


async def _session(url: str, dialect: str, index: int, spec: dict, tally: Tally, cache: AppendCache) -> None:
    from websockets.asyncio.client import connect

    client = ScriptedClient(dialect, random.Random(spec["seed"] + index), cache, mix=True)
    w0, w1, end = spec["window_start"], spec["window_end"], spec["end"]
    sent_at: dict[int, float] = {}
    deferred: set[int] = set()  # frames sent while a function cycle may hold the microphone
    cycle = {"deferring": False, "seen": False}
    await asyncio.sleep(max(0.0, spec["connect_at"] + index * CONNECT_GAP_S - time.monotonic()))
    async with connect(url, max_size=None, ping_interval=None, open_timeout=60, close_timeout=5,
                       compression=None) as ws:
        if dialect == "v3":
            first = json.loads(await ws.recv())
            if first.get("type") != "session.created":
                tally.errors.append(f"session {index}: {first.get('type')} {first.get('error')}")
                return
        await ws.send(session_update(dialect, "Use tools.", WEATHER))
        while True:  # tiered: session.created first, then session.updated
            event = json.loads(await ws.recv())
            if event["type"] == "session.updated":
                break
            if event["type"] == "error":
                tally.errors.append(f"session {index}: {event['error']}")
                return
        tally.connected += 1
        received = 0

        async def reader() -> None:
            nonlocal received
            async for text in ws:
                received += 1
                if text.startswith('{"type":"voicechat.metrics"'):
                    now = time.monotonic()
                    m = json.loads(text)
                    if cycle["deferring"] and m.get("frame") is not None:
                        if (m.get("turn_state") or {}).get("function_cycle"):
                            cycle["seen"] = True
                        elif cycle["seen"] and m.get("transport_frame") is not None:
                            cycle["deferring"] = cycle["seen"] = False  # the held microphone is replayed
                    tf = m.get("transport_frame")
                    if tf in deferred:
                        deferred.discard(tf)
                        sent_at.pop(tf, None)
                        tally.frames_answered += 1
                        tally.deferred += 1  # held by the function cycle by design: judged by the server only
                        continue
                    sent = sent_at.pop(tf, None)
                    if sent is None:
                        continue  # a synthetic position, or a frame sent before the window
                    tally.frames_answered += 1
                    if m.get("frame") is None:
                        tally.gated += 1  # before the session's first turn: no model position
                        continue
                    tally.positions += 1
                    lag = (now - sent) * 1000.0
                    tally.lag_ms.append(round(lag, 2))
                    tally.late_ms.append((m.get("turn_state") or {}).get("late_ms") or 0.0)
                    if lag > DELIVERY_LATE_MS:
                        tally.delivery_late += 1
                        if len(tally.late_examples) < 10:
                            ts = m.get("turn_state") or {}
                            tally.late_examples.append({"session": index, "transport_frame": m.get("transport_frame"),
                                                        "at": round(now, 3),
                                                        "lag_ms": round(lag, 1), "late_ms": ts.get("late_ms"),
                                                        "function_cycle": ts.get("function_cycle"),
                                                        "turn_id": m.get("turn_id")})
                    continue
                if text.startswith('{"type":"error"') or '"type":"error"' in text[:40]:
                    if time.monotonic() >= w0:
                        tally.errors.append(f"session {index}: {text[:200]}")
                for reply in client.observe(text):
                    await ws.send(reply)
                if cycle["deferring"] and not client.waiting:
                    cycle["deferring"] = cycle["seen"] = False  # the tool turn is over
                if dialect == "tiered" and received % 64 == 0:
                    seq = _SEQ.search(text)
                    if seq:  # what DuplexClient does per event, here in batches: the journal stays small
                        await ws.send(f'{{"type":"session.event_ack","server_event_seq":{seq.group(1)}}}')

        reading = asyncio.create_task(reader())
        frame = 0  # appends sent: the server's transport_frame numbering
        tick = 0  # 80 ms ticks (a muted tick sends no append)
        start = spec["t0"] + (index % 97) / 97 * FRAME_S  # spread the sessions across one frame
        responses0 = turns0 = None
        try:
            while True:
                due = start + tick * FRAME_S
                tick += 1
                if due >= end:
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # real-time pacing of the microphone on an absolute schedule
                elif w0 <= due < w1:
                    tally.max_slip_s = max(tally.max_slip_s, -delay)
                if responses0 is None and due >= w0:
                    responses0, turns0 = client.stats.responses_done, dict(client.stats.kinds)
                if reading.done():
                    break
                texts = client.tick()
                now = time.monotonic()
                for text in texts:
                    if '"input_audio_buffer.append"' in text:
                        if w0 <= due < w1:
                            if dialect == "v3":
                                sent_at[frame] = now
                                if cycle["deferring"]:
                                    deferred.add(frame)
                            tally.frames_sent += 1
                        frame += 1
                    elif client.kind == "tool" and '"input_audio_buffer.commit"' in text:
                        cycle["deferring"] = True  # from the call's commit until the held input is replayed
                    await ws.send(text)
        finally:
            if responses0 is not None:
                tally.responses += client.stats.responses_done - responses0
                for kind, n in client.stats.kinds.items():
                    tally.turns[kind] = tally.turns.get(kind, 0) + n - (turns0 or {}).get(kind, 0)
            tally.function_outputs += client.stats.function_outputs
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


def generator_main(spec: dict) -> dict:
    """One load-generator process: its sessions, its own CPU time in the window."""
    try:
        import uvloop  # the clients' cost is not what is measured: the fastest loop there is
        uvloop.install()
    except ImportError:
        pass
    tally = Tally()
    cache = AppendCache(spec["dialect"])
    url = spec["url"]
    started: list[float] = [0.0]

    def gc_timer(phase: str, info: dict) -> None:  # this process's own collector pauses
        if phase == "start":
            started[0] = time.monotonic()
        elif (ms := (time.monotonic() - started[0]) * 1000.0) > 5.0:
            tally.gc_pauses.append((round(started[0], 3), info["generation"], round(ms, 1)))

    gc.callbacks.append(gc_timer)

    async def main() -> None:
        async def cpu_at(when: float) -> float:
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            return time.process_time()

        c0 = asyncio.create_task(cpu_at(spec["window_start"]))
        c1 = asyncio.create_task(cpu_at(spec["window_end"]))
        results = await asyncio.gather(*[_session(url, spec["dialect"], i, spec, tally, cache)
                                         for i in spec["indices"]], return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                tally.errors.append(f"{type(r).__name__}: {r}"[:200])
        tally.cpu_window_s = (await c1) - (await c0)

    asyncio.run(main())
    return tally.to_json()


# ====================================================================== one trial


def _late_buckets(late_ms: list[float]) -> dict:
    edges = ((0, 10), (10, 40), (40, 80), (80, float("inf")))
    return {f"{lo}-{hi if hi != float('inf') else 'inf'}_ms": sum(lo <= x < hi for x in late_ms) for lo, hi in edges}


def host_speed_ms() -> float:
    """CPU milliseconds (this thread's own time, so not the wait for a core) a fixed pure-Python loop takes: the
    host's speed per unit of work at that moment. On a shared VM it moves by a third within minutes with nothing
    else on the machine changed, and the server's CPU per frame moves with it: trials compare only beside it."""
    t = time.thread_time()
    d: dict[int, int] = {}
    for i in range(50_000):
        d[i & 1023] = i
    return (time.thread_time() - t) * 1000.0


def _spread(values: list[float]) -> dict:
    v = sorted(values)
    return {"count": len(v), "min": round(v[0], 2) if v else None, "median": round(v[len(v) // 2], 2) if v else None,
            "max": round(v[-1], 2) if v else None}


def _usage_counts(usage: dict, dialect: str) -> dict:
    d = usage.get("by_dialect", {}).get(dialect, {})
    return {"positions": d.get("positions", 0), "late": d.get("late_positions", 0),
            "late_inbox": d.get("late_inbox_messages", 0), "over_budget": d.get("over_budget_positions", 0),
            "errors": sum(d.get("errors", {}).values())}


def run_trial(dialect: str, n: int, args: argparse.Namespace) -> dict:
    server = Server(max_sessions=max(n, 1), root=args.server_root, python=args.server_python)
    try:
        return _trial(server, dialect, n, args)
    finally:
        server.close()


def _trial(server: Server, dialect: str, n: int, args: argparse.Namespace) -> dict:
    idle = proc_stat(server.proc.pid)
    connect_at = time.monotonic() + 0.5
    t0 = connect_at + n * CONNECT_GAP_S + 2.0  # everyone connected and configured before the first frame
    window_start = t0 + args.warmup
    window_end = window_start + args.window
    gens = max(1, min(args.generators, n))
    url = server.base + ROUTES[dialect]
    procs = []
    outs = [Path(tempfile.mkstemp(prefix="capacity-gen-", suffix=".json")[1]) for _ in range(gens)]
    for g in range(gens):
        spec = {"url": url, "dialect": dialect, "indices": list(range(g, n, gens)), "seed": args.seed * 100_003,
                "connect_at": connect_at + g * CONNECT_GAP_S, "t0": t0, "window_start": window_start,
                "window_end": window_end, "end": window_end + 1.0, "out": str(outs[g])}
        procs.append(subprocess.Popen([sys.executable, __file__, "--generator", json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    samples: dict = {}
    probe_ms: list[float] = []
    host_ms: list[float] = []

    def observe() -> None:  # the window's edges, the loop-lag probe and the host's speed between them
        time.sleep(max(0.0, window_start - time.monotonic()))
        samples["start"] = (time.monotonic(), proc_stat(server.proc.pid), server.get("/v1/usage"))
        while time.monotonic() < window_end:
            if len(probe_ms) % 8 == 0:
                host_ms.append(host_speed_ms())
            t = time.perf_counter()
            server.get("/health")
            probe_ms.append((time.perf_counter() - t) * 1000.0)
            time.sleep(max(0.0, min(0.25, window_end - time.monotonic())))
        samples["end"] = (time.monotonic(), proc_stat(server.proc.pid), server.get("/v1/usage"))

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    tallies = []
    for p, out in zip(procs, outs, strict=True):
        try:
            _, err = p.communicate(timeout=max(1.0, window_end - time.monotonic()) + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        text = out.read_text() if out.exists() else ""
        out.unlink(missing_ok=True)
        if p.returncode != 0 or not text:
            tallies.append({"errors": [f"generator failed ({p.returncode}): {err[-500:]}"]})
        else:
            tallies.append(json.loads(text))
    observer.join(timeout=30)
    health = server.get("/health")
    if "start" not in samples or "end" not in samples:
        return {"dialect": dialect, "sessions": n, "passed": False, "errors": ["the window was not sampled"],
                "generator_tallies": tallies}
    (ta, sa, ua), (tb, sb, ub) = samples["start"], samples["end"]
    elapsed = tb - ta
    before, after = _usage_counts(ua, dialect), _usage_counts(ub, dialect)
    server_counts = {k: after[k] - before[k] for k in after}
    cpu = (sb["cpu_s"] - sa["cpu_s"]) if sa["cpu_s"] is not None and sb["cpu_s"] is not None else None

    def total(key: str) -> int:
        return sum(t.get(key, 0) for t in tallies)

    errors = [e for t in tallies for e in t.get("errors", [])]
    lag = [x for t in tallies for x in t.get("lag_ms", [])]
    late_ms = [x for t in tallies for x in t.get("late_ms", [])]
    turns: dict[str, int] = {}
    for t in tallies:
        for k, v in t.get("turns", {}).items():
            turns[k] = turns.get(k, 0) + v
    slip = max((t.get("max_slip_s", 0.0) for t in tallies), default=0.0)
    gen_cpu = [t.get("cpu_window_s", 0.0) / args.window for t in tallies]
    client_limited = slip > CLIENT_SLIP_S or any(c > CLIENT_CPU_LIMIT for c in gen_cpu)
    frames = total("frames_sent")
    unanswered = frames - total("frames_answered") if dialect == "v3" else 0
    session_frames = n * args.window / FRAME_S
    late = server_counts["late"] + server_counts["late_inbox"] + server_counts["over_budget"] + total("delivery_late")
    passed = (late == 0 and not errors and server_counts["errors"] == 0 and not client_limited
              and total("connected") == n and unanswered <= n and server_counts["positions"] > 0)
    return {
        "dialect": dialect,
        "sessions": n,
        "passed": passed,
        "connected": total("connected"),
        "window_s": round(elapsed, 2),
        "server_positions": server_counts["positions"],
        "late_positions": late,
        "late_by_cause": {"late_start": server_counts["late"], "late_inbox": server_counts["late_inbox"],
                          "over_budget": server_counts["over_budget"], "delivery": total("delivery_late")},
        "server_errors": server_counts["errors"],
        "errors": errors[:5],
        "error_count": len(errors),
        "frames_sent": frames,
        "frames_unanswered": unanswered if dialect == "v3" else None,
        "frames_gated": total("gated") if dialect == "v3" else None,
        "frames_deferred_by_function_cycle": total("deferred") if dialect == "v3" else None,
        "turns": turns,
        "responses": total("responses"),
        "function_outputs": total("function_outputs"),
        "input_to_metrics_lag": summarize_us([x * 1000 for x in lag]) if dialect == "v3" else None,
        "server_late_start_ms": _late_buckets(late_ms) if dialect == "v3" else None,
        "delivery_late_examples": [x for t in tallies for x in t.get("late_examples", [])][:10],
        "client_gc_pauses": sorted(x for t in tallies for x in t.get("gc_pauses", []) if window_start <= x[0] < window_end),
        "loop_probe_rtt": summarize_us([x * 1000 for x in probe_ms]),
        "host_speed_ms": _spread(host_ms),
        "server_cpu_cores": round(cpu / elapsed, 3) if cpu is not None else None,
        "server_cpu_ms_per_session_frame": round(cpu * 1000 / session_frames, 4) if cpu is not None else None,
        "server_cpu_us_per_position": (round(cpu * 1e6 / server_counts["positions"], 1)
                                       if cpu is not None and server_counts["positions"] else None),
        "server_threads": {"idle": idle["threads"], "window": sb["threads"]},
        "server_rss_idle_bytes": idle["rss_bytes"],
        "server_rss_window_bytes": sb["rss_bytes"],
        "server_rss_per_session_bytes": (round((sb["rss_bytes"] - idle["rss_bytes"]) / n)
                                         if sb["rss_bytes"] and idle["rss_bytes"] else None),
        "client_generators": len(tallies),
        "client_cpu_cores": [round(c, 3) for c in gen_cpu],
        "client_max_slip_ms": round(slip * 1000, 1),
        "client_limited": client_limited,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "server_health_after": {k: health.get(k) for k in ("status", "active_sessions")},
    }


def search(dialect: str, args: argparse.Namespace) -> tuple[list, int]:
    trials: list[dict] = []
    if args.sessions:
        for n in args.sessions:
            trials.append(_report_trial(run_trial(dialect, n, args)))
        return trials, max((t["sessions"] for t in trials if t["passed"]), default=0)
    good, bad = 0, None
    n = args.start
    while len(trials) < args.max_trials:
        t = _report_trial(run_trial(dialect, n, args))
        trials.append(t)
        if t["passed"]:
            good = max(good, n)
        else:
            bad = n if bad is None else min(bad, n)
        if bad is None:
            if n >= args.ceiling:
                break
            n = min(n * 2, args.ceiling)
        else:
            if bad - good <= max(1, good // 8):  # within 1/8: close enough for the budget
                break
            n = (good + bad) // 2 if good else max(1, bad // 2)
            if n in (t["sessions"] for t in trials):
                break
    return trials, good


def run_paired(dialect: str, n: int, args: argparse.Namespace) -> dict:
    """``--against``: rounds of this checkout's server and the baseline's under identical load at the same time."""
    rounds = []
    for r in range(args.rounds):
        order = [("served", args.server_root), ("against", args.against)]
        if r % 2:
            order.reverse()
        servers: dict[str, Server] = {}
        results: dict[str, dict] = {}
        try:
            for name, root in order:
                servers[name] = Server(max_sessions=max(n, 1), root=root, python=args.server_python)

            def one(name: str) -> None:
                results[name] = _trial(servers[name], dialect, n, args)

            threads = [threading.Thread(target=one, args=(name,)) for name, _ in order]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for server in servers.values():
                server.close()
        served, against = results.get("served", {}), results.get("against", {})
        a, b = served.get("server_cpu_ms_per_session_frame"), against.get("server_cpu_ms_per_session_frame")
        ratio = round(a / b, 4) if a and b else None
        print(f"  {dialect} {n} sessions, round {r}: served {a} ({'pass' if served.get('passed') else 'FAIL'}), "
              f"against {b} ({'pass' if against.get('passed') else 'FAIL'}) ms/session-frame: ratio {ratio}",
              flush=True)
        rounds.append({"round": r, "first": order[0][0], "ratio": ratio, "served": served, "against": against})
    ratios = sorted(x["ratio"] for x in rounds if x["ratio"] is not None)

    def median(key: str) -> float | None:
        v = sorted(x[key]["server_cpu_ms_per_session_frame"] for x in rounds
                   if x[key].get("server_cpu_ms_per_session_frame") is not None)
        return v[len(v) // 2] if v else None

    return {"sessions": n, "rounds": rounds, "ratio_median": ratios[len(ratios) // 2] if ratios else None,
            "ratio_min": ratios[0] if ratios else None, "ratio_max": ratios[-1] if ratios else None,
            "served_ms_median": median("served"), "against_ms_median": median("against"),
            "all_passed": all(x["served"].get("passed") and x["against"].get("passed") for x in rounds)}


def _report_trial(t: dict) -> dict:
    if "late_by_cause" not in t:
        print(f"  {t['dialect']} {t['sessions']:4d} sessions: FAIL ({t['errors']})", flush=True)
        return t
    lag = t["input_to_metrics_lag"]
    print(f"  {t['dialect']} {t['sessions']:4d} sessions: {'pass' if t['passed'] else 'FAIL'} "
          f"({t['server_positions']} positions, {t['late_positions']} late {t['late_by_cause']}, "
          f"{'lag p99 %.1f ms, ' % ((lag['p99_us'] or 0) / 1000) if lag else ''}"
          f"server {t['server_cpu_cores']} cores = {t['server_cpu_ms_per_session_frame']} ms/session-frame, "
          f"{t['server_cpu_us_per_position']} us/position, host {t['host_speed_ms']['median']} ms, probe p99 "
          f"{(t['loop_probe_rtt']['p99_us'] or 0) / 1000:.1f} ms, clients {t['client_cpu_cores']} cores, "
          f"slip {t['client_max_slip_ms']} ms{', CLIENT-LIMITED' if t['client_limited'] else ''}"
          f"{', errors ' + str(t['error_count']) if t['error_count'] else ''})", flush=True)
    return t


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for dialect, d in report["dialects"].items():
        trials = sorted((t for t in d["trials"] if "late_by_cause" in t), key=lambda t: t["sessions"])
        xs = [t["sessions"] for t in trials]
        ax.plot(xs, [t["server_cpu_ms_per_session_frame"] for t in trials], "o-", label=dialect)
        for t in trials:
            ax.annotate("pass" if t["passed"] else "fail", (t["sessions"], t["server_cpu_ms_per_session_frame"]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        bx.plot(xs, [max(t["late_positions"], 0.5) for t in trials], "s-", label=dialect)
    ax.set_xlabel("concurrent real-time sessions (one server process)")
    ax.set_ylabel("server CPU per session per 80 ms frame (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    bx.set_yscale("log")
    bx.set_xlabel("concurrent real-time sessions")
    bx.set_ylabel("late positions in the window (0 drawn at 0.5)")
    bx.grid(True, alpha=0.3)
    bx.legend(fontsize=8)
    caps = ", ".join(f"{k} {v['max_realtime_sessions']}" for k, v in report["dialects"].items())
    fig.suptitle(f"capacity with zero late positions: {caps}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dialects", nargs="+", choices=("v3", "tiered"), default=["v3", "tiered"])
    ap.add_argument("--sessions", type=int, nargs="+", help="run these session counts instead of searching")
    ap.add_argument("--start", type=int, default=None, help="the search's first count (default 64; --quick 2)")
    ap.add_argument("--max-trials", type=int, default=6, help="trial budget per dialect when searching")
    ap.add_argument("--ceiling", type=int, default=512, help="largest session count tried")
    ap.add_argument("--warmup", type=float, default=None, help="seconds streamed before the window (default 10)")
    ap.add_argument("--window", type=float, default=None, help="judged seconds (default 60; --quick 3)")
    ap.add_argument("--generators", type=int, default=2, help="load-generator processes")
    ap.add_argument("--server-root", type=Path, default=REPO, help="the checkout whose server runs (before/after)")
    ap.add_argument("--server-python", default=sys.executable,
                    help="the interpreter the server runs on (the load generators keep this one's)")
    ap.add_argument("--against", type=Path, default=None,
                    help="a baseline checkout served at the same time under the same load (paired before/after)")
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds (with --against)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--generator", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generator:
        spec = json.loads(args.generator)
        Path(spec["out"]).write_text(json.dumps(generator_main(spec)))
        return 0
    args.start = args.start or (2 if args.quick else 64)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 10.0)
    args.window = args.window if args.window is not None else (3.0 if args.quick else 60.0)
    if args.quick and not args.sessions:
        args.sessions = [args.start]
    if args.against is not None and (not args.sessions or len(args.sessions) != 1):
        ap.error("--against needs one session count (--sessions N)")
    started = time.perf_counter()
    report: dict = {
        "benchmark": "capacity",
        "parameters": {"dialects": args.dialects, "sessions": args.sessions, "start": args.start,
                       "max_trials": args.max_trials, "ceiling": args.ceiling, "warmup_s": args.warmup,
                       "window_s": args.window, "generators": args.generators, "seed": args.seed,
                       "quick": args.quick, "server_root": str(args.server_root),
                       "server_python": args.server_python, "server_python_version": _python_version(args.server_python),
                       "server_commit": _commit(args.server_root), "late_start_ms": 40.0,
                       "against_root": str(args.against) if args.against else None,
                       "against_commit": _commit(args.against) if args.against else None,
                       "rounds": args.rounds if args.against else None,
                       "delivery_late_ms": DELIVERY_LATE_MS, "client_slip_limit_ms": CLIENT_SLIP_S * 1000,
                       "client_cpu_limit_cores": CLIENT_CPU_LIMIT,
                       "server": "python -m vllm_omni_voicechat.cli serve (simulator), separate process"},
        "dialects": {},
        "machine": machine_info(),
    }
    if args.against is not None:
        report["paired"] = {dialect: run_paired(dialect, args.sessions[0], args) for dialect in args.dialects}
        report["elapsed_s"] = round(time.perf_counter() - started, 2)
        write_report(report, args.out)
        print("capacity paired: " + "; ".join(
            f"{dialect} {p['sessions']} sessions, served/against {p['ratio_median']} (median of {len(p['rounds'])}; "
            f"{p['ratio_min']}-{p['ratio_max']}), {p['served_ms_median']} vs {p['against_ms_median']} ms/session-frame"
            for dialect, p in report["paired"].items()))
        return 0
    for dialect in args.dialects:
        trials, best = search(dialect, args)
        at = next((t for t in trials if t["passed"] and t["sessions"] == best), None)
        report["dialects"][dialect] = {"max_realtime_sessions": best, "at_max": at, "trials": trials,
                                       "first_failing": min((t["sessions"] for t in trials if not t["passed"]),
                                                            default=None)}
    report["elapsed_s"] = round(time.perf_counter() - started, 2)
    write_report(report, args.out)
    plot(report, args.out.with_suffix(".png"))
    parts = []
    for dialect, d in report["dialects"].items():
        at = d["at_max"]
        extra = (f" ({at['server_cpu_ms_per_session_frame']} ms server CPU per session-frame, "
                 f"{at['server_cpu_us_per_position']} us per position, "
                 f"RSS {(at['server_rss_per_session_bytes'] or 0) / 1024:.0f} KiB/session, "
                 f"load {at['load_average'][0]})" if at else "")
        parts.append(f"{dialect} {d['max_realtime_sessions']}{extra}; first failing {d['first_failing']}")
    print("capacity: " + "; ".join(parts))
    return 0


def _commit(root: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _python_version(python: str) -> str | None:
    """The interpreter's version and how it links libpython (a build linking it statically, as Debian's does, runs
    Python code faster than one calling it through a shared library)."""
    probe = ("import sys; print(sys.version.split()[0], sys.version.split('[')[-1].rstrip(']'), '| libpython',"
             " 'shared' if any('libpython' in line for line in open('/proc/self/maps')) else 'static')")
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
