"""Soak: K simulated v3 sessions talking for a long time; does the server's memory, task count or cadence drift?

The server (simulator model) runs in a child process, so its RSS is the server's alone; it reports RSS, open
asyncio tasks on its loop, threads and live sessions every ``--sample-s``. Each of the ``--sessions`` client slots
talks without pause: continuous real-time microphone audio (80 ms appends of simulator speech or silence), voice
turns, typed input (``input_text.request``) and tool calls (``get_weather``: arguments -> result -> post-tool
speech); every ``--session-s`` the slot stops its session (``session.stop``) and opens a new one (a v3 session
may not exceed 12,000 positions). Figures: RSS over time and its slope (MiB/hour, least squares over the samples
after the first 10 %), open tasks (start, max, end), late positions (the server's own ``voicechat.metrics``: a
position started >= 40 ms after it was due, or over its 80 ms budget), responses by kind and status, errors, and (``--trace``) trace invariant
violations from the server's checker on every socket. JSON (+ a PNG with matplotlib).

    .venv/bin/python benchmarks/soak.py                        # 1 hour, 4 sessions
    .venv/bin/python benchmarks/soak.py --duration 300         # the 5-minute version
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

RESULTS = Path(__file__).resolve().parent / "results"
LATE_MS = 40.0  # a position that started half a frame or more after it was due
WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
PHRASES = ("hello there", "what time is it", "tell me about the sea", "thanks a lot", "how are you today",
           "can you help me", "that sounds great")
CITIES = ("Paris", "Oslo", "Lima", "Rome")


# ====================================================================== the server (child process)


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
                                                    disconnect_grace_s=grace_s, **kw))
    app = server.app.state.voicechat
    print(f"READY {server.url}", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    async def count_tasks() -> int:
        return len(asyncio.all_tasks())

    started = time.monotonic()
    while not stop.wait(sample_s):
        tasks = asyncio.run_coroutine_threadsafe(count_tasks(), server.loop).result(10)
        print(json.dumps({"t": round(time.monotonic() - started, 3), "rss": rss_bytes(), "tasks": tasks,
                          "threads": threading.active_count(), "sessions": len(app.sessions),
                          "active": app.admission.active}), flush=True)
    server.stop()
    violations = [v for c in checkers for v in c.violations]
    print(json.dumps({"final": True, "sockets_traced": len(checkers), "trace_violations": violations[:50],
                      "trace_violation_count": len(violations), "backpressure_overflows":
                      sum(s["outbound_overflows"] for s in app.backpressure)}), flush=True)




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
    }


async def drive(url: str, sessions: int, duration: float, session_s: float, seed: int) -> list[SlotStats]:
    stats = [SlotStats() for _ in range(sessions)]
    until = time.monotonic() + duration
    slots = [Slot(url, seed * 1000 + i, session_s, stats[i]) for i in range(sessions)]
    await asyncio.gather(*(s.run(until) for s in slots))
    return stats


def run_soak(*, sessions: int, duration: float, session_s: float, sample_s: float, seed: int = 0,
             trace: bool = False) -> dict:
    server = ServerProcess(sample_s, trace)
    started = time.monotonic()
    try:
        stats = asyncio.run(drive(server.url, sessions, duration, session_s, seed))
        time.sleep(2 * sample_s)  # the samples after the last session closed (open tasks back to idle)
    finally:
        server.stop()
    samples = server.samples
    rss = [s["rss"] for s in samples if s.get("rss")]
    tasks = [s["tasks"] for s in samples]
    return {
        "parameters": {"sessions": sessions, "duration_s": duration, "session_s": session_s, "sample_s": sample_s,
                       "seed": seed, "trace": trace, "late_ms": LATE_MS},
        "wall_s": round(time.monotonic() - started, 2),
        "rss_mib": {"start": round(rss[0] / 2**20, 2) if rss else None,
                    "max": round(max(rss) / 2**20, 2) if rss else None,
                    "end": round(rss[-1] / 2**20, 2) if rss else None},
        "memory_slope_mib_per_hour": slope_mib_per_hour(samples),
        "open_tasks": {"start": tasks[0] if tasks else None, "max": max(tasks) if tasks else None,
                       "end": tasks[-1] if tasks else None},
        "clients": merge(stats),
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
    ax2.set_ylabel("tasks")
    ax.set_title(f"soak: {report['parameters']['sessions']} sessions, slope "
                 f"{report['memory_slope_mib_per_hour']} MiB/h")
    fig.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4)
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
    report = run_soak(sessions=args.sessions, duration=args.duration, session_s=args.session_s,
                      sample_s=args.sample_s, seed=args.seed, trace=args.trace)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.png or args.out.with_suffix(".png"))
    c = report["clients"]
    print(f"soak {args.duration:g} s, {args.sessions} slots: {c['sessions']} sessions ({c['sessions_closed_ok']} "
          f"closed by session.stop), {c['positions']} positions, turns {c['turns']}")
    print(f"responses {c['responses']}  errors {c['errors']}  timeouts {c['timeouts']}")
    print(f"late positions {c['late_positions']}/{c['positions']} (started >= 40 ms late "
          f"{c['server_late_positions']}, over budget {c['over_budget_positions']}; late_ms p99 "
          f"{c['server_late_ms_p99']})")
    print(f"server RSS {report['rss_mib']} MiB, slope {report['memory_slope_mib_per_hour']} MiB/h; open tasks "
          f"{report['open_tasks']}; {report['server']}")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
