#!/usr/bin/env python
"""Server overhead per 80 ms model position at 1, 10 and 100 concurrent sessions, model excluded.

Each session is the server's own protocol object, built as ``server/app.py`` builds it (``V3Session`` for the v3
dialect, ``TieredSession`` for the tiered one, over a ``SessionCore``), hosted by the synchronous host
(``shell/sync.py``) on a virtual clock and driven by the shared scripted client (``_common.ScriptedClient``): one
80 ms append per tick per session, round-robin across the sessions. Per session tick, what is timed is everything
the server does for that tick's client texts: protocol parse + audio decode (``receive``), the runner and session
core (``poll``/``complete``), the projector, and the compact JSON of every outgoing event (made inside the
protocol object for both dialects). The benchmark's own bookkeeping of what was sent (texts for the scripted
client, journaled byte counts) happens after the timed work. The simulator's ``step`` (the model) is timed separately and subtracted; its
prefill is not counted. Not included: the asyncio shell, the executor hop and the socket (the capacity benchmark
covers those).

A sample is one model position: a tick's overhead divided over the positions it ran (a tick that ran none, a
gated frame, carries its cost to the next position).

Usage::

    python benchmarks/server_overhead.py                  # 1, 10, 100 sessions, both dialects (~40 s)
    python benchmarks/server_overhead.py --quick          # smoke run
    python benchmarks/server_overhead.py --sessions 1 10 --ticks 400
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BUDGET_US,
    RESULTS,
    AppendCache,
    ScriptedClient,
    TimedModel,
    machine_info,
    pyplot,
    session_update,
    summarize_us,
    write_report,
)

from vllm_omni_voicechat.ops.tally import SessionTally
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.wire.tiered.connection import TieredOptions, TieredSession
from vllm_omni_voicechat.wire.transport import CloseTransport, WireText
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

DEFAULT_OUT = RESULTS / "server_overhead.json"
DEFAULT_SESSIONS = (1, 10, 100)
DIALECTS = ("v3", "tiered")
_clock = time.thread_time_ns  # CPU time of this thread: preemption by other processes is not counted


TALLIES = True  # --no-tally: the protocol objects without their operators' tally (its cost, in a same-machine A/B)


def build_protocol(dialect: str, n: int, max_sessions: int) -> Any:
    """The server's protocol object for one connection, configured as ``server/app.py`` configures it."""
    if dialect == "v3":
        core = SessionCore(SessionConfig(session_id=f"bench-v3-{n}"))
        return V3Session(core, V3Options(single_client=max_sessions == 1),
                         tally=SessionTally("v3", 0.0) if TALLIES else None)
    core = SessionCore(SessionConfig(session_id=f"duplex-bench-{n}", turn_policy="model", gate_open_after=1))
    return TieredSession(core, TieredOptions(lane="full", model="voicechat", max_sessions=max_sessions),
                         tally=SessionTally("tiered", 0.0) if TALLIES else None)


class HostedSession:
    """One server-side session on the synchronous host: effects run at once, events come out as wire texts."""

    def __init__(self, dialect: str, n: int, max_sessions: int, rng: random.Random, cache: AppendCache) -> None:
        self.dialect = dialect
        self.protocol = build_protocol(dialect, n, max_sessions)
        self.model = TimedModel(SimulatorModel(), _clock)  # model work (step and prefill): excluded
        self.client = ScriptedClient(dialect, rng, cache)
        self.closed_code: int | None = None
        self.journaled_bytes = 0
        self._outputs: list[Any] = []  # what the protocol handed its transport, collected after the timed work
        self.host = SyncDriver(self.protocol, self.model, on_event=self._outputs.append, keep=False)
        self.host.dispatch(self.protocol.start(0.0))
        for text in self.collect():
            self.client.observe(text)
        self.deliver([session_update(dialect)], 0.0)
        self.collect()

    @property
    def model_ns(self) -> int:
        return self.model.ns

    @property
    def positions(self) -> int:
        return self.host.positions

    def deliver(self, texts: list[str], now: float) -> None:
        """The client's texts of one tick, each followed by the positions that became due."""
        host = self.host
        host.clock.advance_to(now)
        for text in texts:
            host.send(text)
            host.run(advance_time=False)

    def collect(self) -> list[str]:
        """The wire texts sent since the last call (benchmark bookkeeping, outside the timed work)."""
        texts = []
        for o in self._outputs:
            if isinstance(o, WireText):
                texts.append(o.text)
                if o.seq is not None:
                    self.journaled_bytes += len(o.text.encode())  # what a resume journal records (memory.py)
            elif isinstance(o, CloseTransport):
                self.closed_code = o.code
        self._outputs.clear()
        return texts


def run_level(dialect: str, sessions: int, ticks: int, seed: int) -> dict:
    """``sessions`` concurrent sessions for ``ticks`` ticks of 80 ms; per-position overhead samples."""
    rng = random.Random(seed * 1000 + sessions)
    cache = AppendCache(dialect)
    hosts = [HostedSession(dialect, i, max(sessions, 2), random.Random(rng.random()), cache) for i in range(sessions)]
    samples: list[float] = []
    tick_us: list[float] = []  # all sessions' server work in one 80 ms tick (model included / excluded)
    tick_model_us: list[float] = []
    carry = [0] * sessions
    model_total = positions_total = overhead_total = 0
    events_out = bytes_out = 0
    gc0 = [s["collections"] for s in gc.get_stats()]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for k in range(ticks):
        now = k * 0.08
        tick_total = tick_model = 0
        for i, h in enumerate(hosts):
            texts = h.client.tick()
            m0, p0 = h.model_ns, h.positions
            t0 = _clock()
            h.deliver(texts, now)
            elapsed = _clock() - t0
            model = h.model_ns - m0
            ran = h.positions - p0
            over = elapsed - model + carry[i]
            tick_total += elapsed
            tick_model += model
            if ran:
                per = over / ran / 1000.0
                samples.extend([per] * ran)
                carry[i] = 0
            else:
                carry[i] = over
            model_total += model
            positions_total += ran
            overhead_total += elapsed - model
            sent = h.collect()
            for text in sent:
                h.client.observe(text)
                bytes_out += len(text)
            events_out += len(sent)
        tick_us.append(tick_total / 1000.0)
        tick_model_us.append(tick_model / 1000.0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    gc_delta = [s["collections"] - g for s, g in zip(gc.get_stats(), gc0)]
    stats = [h.client.stats for h in hosts]
    series = summarize_us(samples)
    mean_over = overhead_total / max(positions_total, 1) / 1000.0
    server_tick = summarize_us([t - m for t, m in zip(tick_us, tick_model_us)])
    return {
        "dialect": dialect,
        "sessions": sessions,
        "ticks": ticks,
        "positions": positions_total,
        "overhead_per_position": series,
        "overhead_per_position_mean_us": round(mean_over, 2),
        "model_step_mean_us": round(model_total / max(positions_total, 1) / 1000.0, 2),
        "overhead_over_model_step": round(overhead_total / max(model_total, 1), 3),
        "server_work_per_tick_excl_model": server_tick,
        "server_work_per_tick_share_of_80ms_p50": round((server_tick["p50_us"] or 0) / BUDGET_US, 4),
        "server_work_per_tick_share_of_80ms_p99": round((server_tick["p99_us"] or 0) / BUDGET_US, 4),
        "sessions_per_core_estimate": round(BUDGET_US / ((overhead_total + model_total) / max(positions_total, 1)
                                                         / 1000.0), 1),
        "events_out": events_out,
        "wire_bytes_out": bytes_out,
        "client": {"turns": sum(s.turns for s in stats), "responses_done": sum(s.responses_done for s in stats),
                   "wait_timeouts": sum(s.wait_timeouts for s in stats)},
        "closed_sessions": sum(1 for h in hosts if h.closed_code is not None),
        "gc_collections": gc_delta,
        "cpu_share": round(cpu / wall, 3) if wall else None,
        "wall_s": round(wall, 2),
    }


def default_ticks(sessions: int, quick: bool) -> int:
    if quick:
        return max(60, 300 // sessions)
    return max(250, 5000 // sessions)


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for dialect, marker in (("v3", "o"), ("tiered", "s")):
        rows = [r for r in report["levels"] if r["dialect"] == dialect]
        if not rows:
            continue
        xs = [r["sessions"] for r in rows]
        for key, style in (("p50_us", "-"), ("p99_us", "--")):
            ax.plot(xs, [r["overhead_per_position"][key] for r in rows], style, marker=marker,
                    label=f"{dialect} {key[:3]}")
    ax.set_xscale("log")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("server overhead per 80 ms position (µs)")
    ax.set_title("protocol + runtime + projector + encode (model excluded)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_line(report: dict) -> str:
    parts = []
    for r in report["levels"]:
        o = r["overhead_per_position"]
        parts.append(f"{r['dialect']}@{r['sessions']}: p50 {o['p50_us']:.0f} / p99 {o['p99_us']:.0f} us")
    return "server overhead per 80 ms position (model excluded): " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=list(DEFAULT_SESSIONS))
    ap.add_argument("--dialects", nargs="+", choices=DIALECTS, default=list(DIALECTS))
    ap.add_argument("--ticks", type=int, default=None, help="80 ms ticks per level (default: max(250, 5000/N))")
    ap.add_argument("--quick", action="store_true", help="smoke run (few ticks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-tally", action="store_true", help="sessions without the operators' tally (ops/tally.py)")
    args = ap.parse_args(argv)
    global TALLIES
    TALLIES = not args.no_tally
    started = time.perf_counter()
    run_level("tiered", 1, 60 if args.quick else 300, args.seed + 99)  # warm-up: imports, caches, allocator
    run_level("v3", 1, 60 if args.quick else 300, args.seed + 99)
    levels = []
    for dialect in args.dialects:
        for n in args.sessions:
            levels.append(run_level(dialect, n, args.ticks or default_ticks(n, args.quick), args.seed))
    report = {
        "benchmark": "server_overhead",
        "parameters": {"sessions": args.sessions, "dialects": args.dialects, "ticks": args.ticks, "tally": TALLIES,
                       "quick": args.quick, "seed": args.seed, "frame_ms": 80,
                       "clock": "time.thread_time_ns (CLOCK_THREAD_CPUTIME_ID, ~1-2 us per read, included)",
                       "timed": "receive (parse + audio decode) + poll/complete (runner + core) + projector + "
                                "JSON encode of every event, minus SimulatorModel.step; prefill excluded"},
        "levels": levels,
        "elapsed_s": round(time.perf_counter() - started, 2),
        "machine": machine_info(),
    }
    write_report(report, args.out)
    plot(report, args.out.with_suffix(".png"))
    for r in levels:
        if r["closed_sessions"] or not r["client"]["responses_done"]:
            print(f"WARNING: {r['dialect']}@{r['sessions']}: {r['closed_sessions']} sessions closed, "
                  f"{r['client']['responses_done']} responses", file=sys.stderr)
    print(summary_line(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
