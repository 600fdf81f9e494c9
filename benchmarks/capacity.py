#!/usr/bin/env python
"""Maximum concurrent real-time sessions one server process holds with zero late positions.

The server is the shipped one (``python -m vllm_omni_voicechat.cli serve``, CPU simulator, v3 dialect on
``/v1/voicechat``) in its own process; the clients are asyncio WebSocket clients in this process. Each trial
connects N sessions, configures them, and streams the shared scripted talker (``_common.ScriptedClient``: pauses,
simulator-speech turns with ``turn_start``/``commit``, silence while the reply plays) in real time: one 80 ms
append per session on an absolute schedule, starts staggered across one frame.

Lateness comes from the server's per-position telemetry (``voicechat.metrics``, one per model position): a
position is **late** when the server reports it ``over_budget`` (step > 80 ms), when its ``turn_state.late_ms``
(a paced position started after its due time) is 80 ms or more, or when its metrics event reaches the client
more than 80 ms after the client sent the frame that position consumed (the server fell a frame behind real
time). A trial passes with zero late positions, no errors, and every sent frame accounted for. If the client
process itself slips more than 40 ms behind its send schedule the trial is flagged ``client_limited`` (the load
generator, not the server, was the bottleneck) and counts as a failure.

The search doubles N from ``--start`` while trials pass, then bisects between the last pass and the first
failure, within ``--max-trials`` trials. On a shared 2-core machine the client and the server compete for the
cores: the figure is a floor for a machine where the clients run elsewhere.

Usage::

    python benchmarks/capacity.py                 # ~2-3 minutes
    python benchmarks/capacity.py --quick         # two short trials
    python benchmarks/capacity.py --start 16 --seconds 10 --max-trials 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    RESULTS,
    AppendCache,
    ScriptedClient,
    machine_info,
    pyplot,
    rss_bytes,
    session_update,
    summarize_us,
    write_report,
)
from websockets.asyncio.client import connect

DEFAULT_OUT = RESULTS / "capacity.json"
FRAME_S = 0.08
LATE_MS = 80.0
CLIENT_SLIP_S = 0.040
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Server:
    """The shipped server in a child process (its own interpreter and GIL)."""

    def __init__(self, max_sessions: int) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "vllm_omni_voicechat.cli", "serve", "--port", str(self.port),
               "--max-sessions", str(max_sessions), "--log-level", "warning"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:  # startup poll of a child process: there is no event to wait on
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        self.url = f"ws://127.0.0.1:{self.port}/v1/voicechat"

    def health(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Tally:
    def __init__(self) -> None:
        self.positions = 0
        self.late = 0
        self.late_reasons = {"over_budget": 0, "late_ms": 0, "lag": 0}
        self.lag_ms: list[float] = []
        self.step_ms: list[float] = []
        self.errors: list[str] = []
        self.frames_sent = 0
        self.frames_seen = 0
        self.max_slip_s = 0.0
        self.responses = 0


async def session(url: str, index: int, t0: float, frames: int, measure_from: int, tally: Tally, seed: int,
                  cache: AppendCache) -> None:
    client = ScriptedClient("v3", random.Random(seed), cache)
    sent_at: dict[int, float] = {}
    async with connect(url, max_size=None, ping_interval=None, open_timeout=30, close_timeout=5) as ws:
        first = json.loads(await ws.recv())
        if first.get("type") != "session.created":
            tally.errors.append(f"session {index}: {first.get('type')} {first.get('error')}")
            return
        await ws.send(session_update("v3"))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "session.updated":
                break
            if event["type"] == "error":
                tally.errors.append(f"session {index}: {event['error']}")
                return
        done = asyncio.Event()

        async def reader() -> None:
            try:
                async for text in ws:
                    client.observe(text)
                    if text.startswith('{"type":"voicechat.metrics"'):
                        now = time.monotonic()
                        m = json.loads(text)
                        tf = m.get("transport_frame")
                        if tf is None or tf < measure_from:
                            continue  # synthetic positions and the warm-up second are not judged
                        sent = sent_at.pop(tf, None)
                        if sent is None:
                            continue
                        tally.frames_seen += 1
                        if m.get("frame") is None:
                            continue  # a gated frame (before the first turn): no model position
                        tally.positions += 1
                        lag = (now - sent) * 1000.0
                        tally.lag_ms.append(lag)
                        tally.step_ms.append(m["server_step_ms"])
                        late_ms = (m.get("turn_state") or {}).get("late_ms") or 0.0
                        late = False
                        if m.get("over_budget"):
                            tally.late_reasons["over_budget"] += 1
                            late = True
                        if late_ms >= LATE_MS:
                            tally.late_reasons["late_ms"] += 1
                            late = True
                        if lag > LATE_MS:
                            tally.late_reasons["lag"] += 1
                            late = True
                        tally.late += late
                    elif text.startswith('{"type":"error"'):
                        tally.errors.append(f"session {index}: {text[:200]}")
                    elif text.startswith('{"type":"response.done"'):
                        tally.responses += 1
            finally:
                done.set()

        reading = asyncio.create_task(reader())
        frame = 0
        start = t0 + (index % 97) / 97 * FRAME_S  # spread the sessions across one frame
        while frame < frames:
            delay = start + frame * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # real-time pacing of the microphone on an absolute schedule
            else:
                tally.max_slip_s = max(tally.max_slip_s, -delay)
            texts = client.tick()
            now = time.monotonic()
            for text in texts:
                if '"input_audio_buffer.append"' in text:
                    if frame >= measure_from:
                        sent_at[frame] = now
                        tally.frames_sent += 1
                    frame += 1
                await ws.send(text)
        # let the last frame's position come back, then leave
        await asyncio.sleep(0.5)
        await ws.close()
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)


async def trial_async(url: str, n: int, seconds: float, seed: int) -> Tally:
    tally = Tally()
    cache = AppendCache("v3")
    frames = int(seconds / FRAME_S) + 13
    t0 = time.monotonic() + 1.0 + n * 0.01  # everyone connected and configured before the first frame
    rng = random.Random(seed)
    results = await asyncio.gather(
        *[session(url, i, t0, frames, 13, tally, rng.randrange(1 << 30), cache) for i in range(n)],
        return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            tally.errors.append(f"{type(r).__name__}: {r}")
    return tally


def run_trial(server: Server, n: int, seconds: float, seed: int) -> dict:
    rss0 = rss_bytes(server.proc.pid)
    cpu0, wall0 = _cpu_seconds(server.proc.pid), time.monotonic()
    sampled: list[int] = []

    async def main() -> Tally:
        async def sample() -> None:
            await asyncio.sleep(1.5 + seconds / 2)
            r = rss_bytes(server.proc.pid)
            if r:
                sampled.append(r)

        sampler = asyncio.create_task(sample())
        tally = await trial_async(server.url, n, seconds, seed)
        sampler.cancel()
        return tally

    client_cpu0 = time.process_time()
    tally = asyncio.run(main())
    cpu1, wall1 = _cpu_seconds(server.proc.pid), time.monotonic()
    client_cpu = time.process_time() - client_cpu0
    slip = tally.max_slip_s > CLIENT_SLIP_S
    accounted = tally.frames_seen >= tally.frames_sent - n  # the last frame of a session may still be in flight
    passed = tally.late == 0 and not tally.errors and not slip and accounted and tally.positions > 0
    return {
        "sessions": n,
        "passed": passed,
        "positions": tally.positions,
        "late_positions": tally.late,
        "late_reasons": tally.late_reasons,
        "errors": tally.errors[:5],
        "error_count": len(tally.errors),
        "frames_sent": tally.frames_sent,
        "frames_accounted": tally.frames_seen,
        "responses": tally.responses,
        "input_to_metrics_lag": summarize_us([x * 1000 for x in tally.lag_ms]),
        "server_step": summarize_us([x * 1000 for x in tally.step_ms]),
        "client_max_slip_ms": round(tally.max_slip_s * 1000, 1),
        "client_limited": slip,
        "client_cpu_cores": round(client_cpu / (wall1 - wall0), 3),
        "load_average_after": round(os.getloadavg()[0], 2),
        "server_cpu_cores": (round((cpu1 - cpu0) / (wall1 - wall0), 3) if cpu0 is not None and cpu1 is not None
                             else None),
        "server_rss_idle_bytes": rss0,
        "server_rss_loaded_bytes": sampled[0] if sampled else None,
        "server_rss_per_session_bytes": (round((sampled[0] - rss0) / n) if sampled and rss0 else None),
    }


def search(start: int, seconds: float, max_trials: int, seed: int, ceiling: int) -> tuple[list, int]:
    trials: list[dict] = []
    good, bad = 0, None
    n = start
    while len(trials) < max_trials:
        server = Server(max_sessions=ceiling)  # a fresh process per trial: no memory or threads carried over
        try:
            t = run_trial(server, n, seconds, seed)
            t["server_health_after"] = {k: server.health().get(k) for k in ("status", "active_sessions")}
        finally:
            server.close()
        trials.append(t)
        lat = t["input_to_metrics_lag"]
        print(f"  {n:4d} sessions: {'pass' if t['passed'] else 'FAIL'} ({t['positions']} positions, "
              f"{t['late_positions']} late, lag p99 {(lat['p99_us'] or 0) / 1000:.1f} ms, "
              f"server {t['server_cpu_cores']} cores, client slip {t['client_max_slip_ms']} ms"
              f"{', errors ' + str(t['error_count']) if t['error_count'] else ''})", flush=True)
        if t["passed"]:
            good = max(good, n)
        else:
            bad = n if bad is None else min(bad, n)
        if bad is None:
            if n >= ceiling:
                break
            n = min(n * 2, ceiling)
        else:
            if bad - good <= max(1, good // 8):  # within ~12 %: close enough for the budget
                break
            n = (good + bad) // 2 if good else max(1, bad // 2)
            if n in (t["sessions"] for t in trials):
                break
    return trials, good


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    trials = sorted(report["trials"], key=lambda t: t["sessions"])
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [t["sessions"] for t in trials]
    ax.plot(xs, [(t["input_to_metrics_lag"]["p50_us"] or 0) / 1000 for t in trials], "o-", label="lag p50")
    ax.plot(xs, [(t["input_to_metrics_lag"]["p99_us"] or 0) / 1000 for t in trials], "s--", label="lag p99")
    ax.plot(xs, [(t["input_to_metrics_lag"]["max_us"] or 0) / 1000 for t in trials], "^:", label="lag max")
    for t in trials:
        ax.annotate("pass" if t["passed"] else "fail", (t["sessions"], (t["input_to_metrics_lag"]["p99_us"] or 0) / 1000),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.axhline(LATE_MS, color="red", lw=0.8, label="80 ms budget")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent real-time sessions (one server process)")
    ax.set_ylabel("frame sent -> its position's metrics (ms)")
    ax.set_title(f"capacity: {report['max_realtime_sessions']} sessions with zero late positions")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", type=int, default=None, help="first trial's session count (default 8; --quick 2)")
    ap.add_argument("--seconds", type=float, default=None, help="streamed seconds per trial (default 8; --quick 2)")
    ap.add_argument("--max-trials", type=int, default=None, help="trial budget (default 8; --quick 2)")
    ap.add_argument("--ceiling", type=int, default=512, help="largest session count tried")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    start = args.start or (2 if args.quick else 8)
    seconds = args.seconds or (2.0 if args.quick else 8.0)
    max_trials = args.max_trials or (2 if args.quick else 8)
    started = time.perf_counter()
    trials, best = search(start, seconds, max_trials, args.seed, args.ceiling)
    passing = [t for t in trials if t["passed"] and t["sessions"] == best]
    report = {
        "benchmark": "capacity",
        "parameters": {"start": start, "seconds_per_trial": seconds, "max_trials": max_trials, "ceiling": args.ceiling,
                       "seed": args.seed, "quick": args.quick, "dialect": "v3", "late_threshold_ms": LATE_MS,
                       "client_slip_limit_ms": CLIENT_SLIP_S * 1000,
                       "server": "python -m vllm_omni_voicechat.cli serve (simulator), separate process"},
        "max_realtime_sessions": best,
        "at_max": passing[0] if passing else None,
        # what the server's own CPU use would allow on one otherwise idle core (not a measured capacity)
        "server_cpu_sessions_per_core_estimate": (round(best / passing[0]["server_cpu_cores"], 1)
                                                   if passing and passing[0]["server_cpu_cores"] else None),
        "trials": trials,
        "elapsed_s": round(time.perf_counter() - started, 2),
        "machine": machine_info(),
    }
    write_report(report, args.out)
    plot(report, args.out.with_suffix(".png"))
    at = report["at_max"]
    extra = ""
    if at:
        extra = (f" (lag p99 {at['input_to_metrics_lag']['p99_us'] / 1000:.1f} ms, server {at['server_cpu_cores']} "
                 f"cores = ~{report['server_cpu_sessions_per_core_estimate']} sessions per idle core by CPU, "
                 f"RSS {(at['server_rss_per_session_bytes'] or 0) / 1024:.0f} KiB/session, "
                 f"load average {at['load_average_after']})")
    first_fail = min((t["sessions"] for t in trials if not t["passed"]), default=None)
    print(f"capacity: {best} concurrent real-time v3 sessions in one server process with zero late positions"
          f"{extra}; first failing count {first_fail}; {len(trials)} trials")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
