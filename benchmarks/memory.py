#!/usr/bin/env python
"""Memory per session at steady state, and tiered journal bytes per minute of streamed audio.

Sessions are the server's protocol objects hosted in-process exactly as in ``server_overhead.py`` (a
``V3Session`` or ``TieredSession`` over a ``SessionCore`` and a ``SimulatorModel`` each), driven by the shared
scripted talker for ``--seconds`` of audio. Each measurement runs in a fresh child interpreter, so one dialect's
freed memory never hides another's growth:

* **RSS**: resident set size after the imports and a one-session warm-up, then with N live sessions after
  the run; (after - before) / N. Includes everything a session keeps (core, model, projector, journal, buffers)
  and allocator slack. ``rss_state_bytes_per_session`` leaves out what the simulator's process-wide token-audio
  cache grew by (bounded at 256 tokens, ~0.9 MB however many sessions run). The real server adds the socket
  buffers; the capacity benchmark reports the server process's RSS delta per session for that.
* **tracemalloc**: Python-heap bytes traced with N live sessions, over N, and the top allocation sites. The
  scripted client's allocations are filtered out, and with them the model's (it is stepped through
  ``_common``'s timer): protocol, core and wire state only.
* **journal** (tiered, full lane): the bytes of events the resume journal records per minute of streamed audio
  (compact JSON as sent), and what it retains with a client that never acknowledges (everything within its 60 s
  TTL, up to the 8 MiB cap) versus one that acknowledges every event (nothing).

Usage::

    python benchmarks/memory.py            # ~40 s
    python benchmarks/memory.py --quick
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, AppendCache, machine_info, pyplot, rss_bytes, write_report
from server_overhead import HostedSession, run_level

from vllm_omni_voicechat.audio.speech import render_token_audio
from vllm_omni_voicechat.audio.frames import OUTPUT_FRAME_SAMPLES

DEFAULT_OUT = RESULTS / "memory.json"


def drive(dialect: str, n: int, ticks: int, seed: int, *, ack: bool = False) -> list[HostedSession]:
    rng = random.Random(seed)
    cache = AppendCache(dialect)
    hosts = [HostedSession(dialect, i, max(n, 2), random.Random(rng.random()), cache) for i in range(n)]
    for k in range(ticks):
        now = k * 0.08
        for h in hosts:
            h.deliver(h.client.tick(), now)
            sent = h.collect()
            for text in sent:
                h.client.observe(text)
            if ack and sent and h.protocol.journal is not None:
                h.protocol.journal.acknowledge(h.protocol.journal.head)  # what session.event_ack does
    return hosts


LRU_LINK_BYTES = 56
"""CPython's C ``lru_cache`` keeps one link per entry (object header, two pointers, hash, key, result)."""


def token_audio_cache_bytes() -> int:
    """What the simulator's process-wide token-audio cache holds, at least: per cached token one frame of PCM16 and
    its link. Its key (a 3-tuple, from the interpreter's free list) is left out, so the figure errs low and the
    session state computed from it errs high."""
    entries = render_token_audio.cache_info().currsize
    return entries * (sys.getsizeof(bytes(2 * OUTPUT_FRAME_SAMPLES)) + LRU_LINK_BYTES)


def child(dialect: str, n: int, ticks: int, seed: int, trace: bool) -> dict:
    run_level(dialect, 1, 60, seed + 7)  # warm-up: imports, lazily built tables
    gc.collect()
    rss0 = rss_bytes()
    cache0 = token_audio_cache_bytes()
    if trace:
        tracemalloc.start(5)
        snap0 = tracemalloc.take_snapshot()
    hosts = drive(dialect, n, ticks, seed)
    gc.collect()
    # The cache is shared by every session of the process and bounded (256 tokens, ~0.9 MB): it fills with the
    # replies' vocabulary, not with the sessions, so the RSS figure of session state leaves its growth out. (The
    # traced figure never held it: the model is stepped through _common's timer, which its filter leaves out.)
    cache = token_audio_cache_bytes() - cache0
    out: dict = {"dialect": dialect, "sessions": n, "seconds": round(ticks * 0.08, 2), "process_cache_bytes": cache}
    if trace:
        # server-side allocations only: a stack through the package and not through the scripted client
        keep = [tracemalloc.Filter(True, "*vllm_omni_voicechat*", all_frames=True),
                tracemalloc.Filter(False, "*_common.py", all_frames=True)]
        snap = tracemalloc.take_snapshot().filter_traces(keep)
        snap0 = snap0.filter_traces(keep)
        tracemalloc.stop()
        traced = sum(s.size for s in snap.statistics("filename")) - sum(s.size for s in snap0.statistics("filename"))
        stats = snap.compare_to(snap0, "filename")
        top = [{"file": "/".join(Path(s.traceback[0].filename).parts[-3:]), "bytes": s.size_diff}
               for s in stats[:8] if s.size_diff > 0]
        out.update(traced_bytes_per_session=round(traced / n), top_sites=top)
    else:
        rss1 = rss_bytes()
        out.update(rss_before=rss0, rss_after=rss1,
                   rss_bytes_per_session=round((rss1 - rss0) / n) if rss0 and rss1 else None,
                   rss_state_bytes_per_session=round((rss1 - rss0 - cache) / n) if rss0 and rss1 else None)
    if dialect == "tiered":
        out["journal_retained_bytes_per_session"] = round(sum(h.protocol.journal.retained_bytes for h in hosts) / n)
    out["responses"] = sum(h.client.stats.responses_done for h in hosts)
    out["alive"] = sum(1 for h in hosts if h.closed_code is None)
    del hosts
    return out


def journal_rate(n: int, ticks: int, seed: int) -> dict:
    """Recorded bytes per minute of audio, retained without and with acknowledgements."""
    minutes = ticks * 0.08 / 60
    hosts = drive("tiered", n, ticks, seed)
    recorded = sum(h.protocol.journal.head for h in hosts)
    recorded_bytes = sum(h.journaled_bytes for h in hosts)
    # every event of the window is retained (the TTL is 60 s; beyond it the journal holds the last minute)
    retained = [h.protocol.journal.retained_bytes for h in hosts]
    overflowed = sum(1 for h in hosts if h.protocol.journal.overflowed)
    acked = drive("tiered", n, ticks, seed, ack=True)
    per_min = recorded_bytes / n / minutes
    speaking = sum(h.client.stats.responses_done for h in hosts)
    return {
        "sessions": n,
        "audio_seconds_per_session": round(ticks * 0.08, 2),
        "events_recorded_per_session": round(recorded / n),
        "journal_bytes_per_minute_of_audio": round(per_min),
        "retained_bytes_per_session_no_acks": round(sum(retained) / n),
        "retained_bytes_per_session_acking_client": round(sum(h.protocol.journal.retained_bytes for h in acked) / n),
        "journal_max_bytes": hosts[0].protocol.journal.max_bytes,
        "journal_ttl_s": hosts[0].protocol.journal.ttl_s,
        "sessions_overflowed": overflowed,
        "responses": speaking,
    }


def spawn(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=False, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"child {args} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    rows = report["per_session"]
    names = [r["dialect"] for r in rows]
    ax1.bar([x - 0.2 for x in range(len(rows))], [r["rss_bytes_per_session"] / 1024 for r in rows], 0.4, label="RSS")
    ax1.bar([x + 0.2 for x in range(len(rows))], [r["traced_bytes_per_session"] / 1024 for r in rows], 0.4,
            label="tracemalloc")
    ax1.set_xticks(range(len(rows)), names)
    ax1.set_ylabel("KiB per live session")
    ax1.set_title(f"memory per session ({rows[0]['seconds']:.0f} s streamed)")
    ax1.legend()
    j = report["journal"]
    vals = [j["journal_bytes_per_minute_of_audio"] / 1024, j["retained_bytes_per_session_no_acks"] / 1024,
            j["retained_bytes_per_session_acking_client"] / 1024]
    ax2.bar(range(3), vals)
    ax2.set_xticks(range(3), ["recorded\nper minute", "retained,\nno acks", "retained,\nacking"])
    ax2.set_ylabel("KiB")
    ax2.set_title("tiered resume journal")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_line(report: dict) -> str:
    parts = [f"{r['dialect']} {r['rss_bytes_per_session'] / 1024:.0f} KiB RSS / "
             f"{r['traced_bytes_per_session'] / 1024:.0f} KiB traced "
             f"({r['rss_state_bytes_per_session'] / 1024:.0f} KiB RSS without the shared token-audio cache)"
             for r in report["per_session"]]
    j = report["journal"]
    per_minute = j["journal_bytes_per_minute_of_audio"] / 1024
    return (f"memory per session: {'; '.join(parts)}; tiered journal {per_minute:.0f} KiB per minute of audio "
            f"({j['retained_bytes_per_session_acking_client']} B retained when the client acks)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=None, help="live sessions for the RSS figure (default 100)")
    ap.add_argument("--trace-sessions", type=int, default=None, help="live sessions under tracemalloc (default 10)")
    ap.add_argument("--seconds", type=float, default=None, help="audio streamed before measuring (default 20)")
    ap.add_argument("--journal-seconds", type=float, default=None, help="audio for the journal rate (default 60)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--child", nargs=4, metavar=("DIALECT", "N", "TICKS", "TRACE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        d, n, t, trace = args.child
        print(json.dumps(child(d, int(n), int(t), args.seed, trace == "1")))
        return 0
    n = args.sessions or (8 if args.quick else 100)
    nt = args.trace_sessions or (4 if args.quick else 10)
    ticks = int((args.seconds or (3.0 if args.quick else 20.0)) / 0.08)
    jticks = int((args.journal_seconds or (6.0 if args.quick else 60.0)) / 0.08)
    started = time.perf_counter()
    rows = []
    for dialect in ("v3", "tiered"):
        rss = spawn(["--child", dialect, str(n), str(ticks), "0", "--seed", str(args.seed)])
        traced = spawn(["--child", dialect, str(nt), str(ticks), "1", "--seed", str(args.seed)])
        rows.append({**rss, "traced_sessions": nt, "traced_bytes_per_session": traced["traced_bytes_per_session"],
                     "top_sites": traced["top_sites"]})
    journal = journal_rate(4 if args.quick else 10, jticks, args.seed)
    report = {
        "benchmark": "memory",
        "parameters": {"sessions": n, "trace_sessions": nt, "seconds": ticks * 0.08, "journal_seconds": jticks * 0.08,
                       "seed": args.seed, "quick": args.quick},
        "per_session": rows,
        "journal": journal,
        "elapsed_s": round(time.perf_counter() - started, 2),
        "machine": machine_info(),
        "pid": os.getpid(),
    }
    write_report(report, args.out)
    plot(report, args.out.with_suffix(".png"))
    print(summary_line(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
