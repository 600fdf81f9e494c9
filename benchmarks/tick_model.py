#!/usr/bin/env python
"""A model, not a measurement: N paced sessions on one engine through the real engine tick (``runner/tick.py``),
with commits whose settlements take the quiet frames queued after them, to see how late positions depend on the
engine's step time and on the settlement's policy, free of this host's noise.

What it models: each session sends a frame every 80 ms (phases within ``--jitter`` ms of each other, or spread
across the frame); every ``--commit-every`` ms or so a session commits and runs ``--settlement`` positions back to
back, each taking the oldest frame queued after the commit if there is one, else zero input (as
``SessionCore._settlement_input`` does). A session's positions run one at a time. A position joins the tick when
its session is free (``EngineTick.join`` with the frame's arrival); a released tick is one forward of
``--step`` ms plus ``--per-row`` ms for each further position, run one after another on one engine (a forward
waits for the one before it). A position is late when ``Release.late_ms`` plus the wait for the engine is 40 ms
or more, as the runner counts it. Not modelled: the host's CPU shared with the clients and the other stages (it
is folded into the step time), the talker and codec behind Stage 0, the asyncio shell.

``--policy await`` tries one alternative: a settlement position that finds no queued frame waits for its
session's next frame when that is expected within ``--await-ms`` (trading settlement time, so the response's
start, for fewer zero positions and fewer frames waiting behind them).

Usage::

    python benchmarks/tick_model.py                          # steps 10-28 ms, both policies, 3 seeds (~10 s)
    python benchmarks/tick_model.py --quick
    python benchmarks/tick_model.py --step 20 --per-row 3 --policy base --seeds 1 2 3 4 5
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_omni_voicechat.runner.tick import EngineTick  # noqa: E402

FRAME_MS = 80.0
LATE_MS = 40.0
RESULTS = Path(__file__).resolve().parent / "results"


def simulate(*, step: float, per_row: float, sessions: int = 4, slot: float = 40.0, settlement: int = 7,
             commit_every: float = 2500.0, duration: float = 60_000.0, jitter: float = 3.0, spread: bool = False,
             policy: str = "base", await_ms: float = 40.0, seed: int = 1) -> dict:
    """One run of the model (times in ms); returns its counts and percentiles."""
    rnd = random.Random(seed)
    tick = EngineTick(slot / 1000.0)
    events: list[tuple[float, int, str, object]] = []
    order = 0

    def at(t: float, kind: str, data: object = None) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, data))

    queued: list[collections.deque[float]] = [collections.deque() for _ in range(sessions)]
    last_frame: list[float | None] = [None] * sessions
    busy = [False] * sessions
    settling = [0] * sessions
    committed: list[float | None] = [None] * sessions
    settle_started: list[float | None] = [None] * sessions
    held: dict[int, tuple[str, float | None]] = {}
    engine_free = 0.0
    late: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[int] = collections.Counter()
    e2e: list[float] = []
    settle_ms: list[float] = []

    def release(rel, now: float) -> None:
        nonlocal engine_free
        start = max(now, engine_free)
        engine_free = start + step + per_row * (rel.size - 1)
        sizes[rel.size] += 1
        for member in rel.members:
            kind, arrived = held.pop(member.key)
            kinds[kind] += 1
            if rel.late_ms(member) + (start - now) >= LATE_MS:
                late[kind] += 1
            at(engine_free, "done", (member.key, arrived))

    def join(i: int, kind: str, arrived: float | None, now: float) -> None:
        busy[i] = True
        held[i] = (kind, arrived)
        rel = tick.join(i, now / 1000.0, now / 1000.0, arrived=None if arrived is None else arrived / 1000.0)
        if rel is not None:
            release(rel, now)
        else:
            at(tick.deadline * 1000.0, "deadline")

    def start_next(i: int, now: float) -> None:
        if busy[i]:
            return
        if committed[i] is not None and settle_started[i] is None:
            settle_started[i], settling[i] = committed[i], settlement
        if settling[i]:
            if queued[i]:
                settling[i] -= 1
                join(i, "fed", queued[i].popleft(), now)
            elif policy == "await" and last_frame[i] is not None and last_frame[i] + FRAME_MS - now <= await_ms:
                return  # the frame's arrival starts it
            else:
                settling[i] -= 1
                join(i, "zero", None, now)
        elif queued[i]:
            join(i, "real", queued[i].popleft(), now)

    phases = [i * FRAME_MS / sessions if spread else rnd.uniform(0.0, jitter) for i in range(sessions)]
    for i in range(sessions):
        tick.enter(i)
        at(phases[i], "frame", i)
        at(phases[i] + 1000.0 + rnd.uniform(0.0, commit_every), "commit", i)
    while events:
        now, _, kind, data = heapq.heappop(events)
        if now > duration:
            break
        if kind == "frame":
            i = data
            queued[i].append(now)
            last_frame[i] = now
            at(now + FRAME_MS + rnd.gauss(0.0, 0.5), "frame", i)
            start_next(i, now)
        elif kind == "commit":
            i = data
            if committed[i] is None:
                committed[i] = now
            at(now + commit_every * (0.8 + 0.4 * rnd.random()), "commit", i)
            start_next(i, now)
        elif kind == "deadline":
            rel = tick.poll(now / 1000.0 + 1e-9)
            if rel is not None:
                release(rel, now)
        else:
            i, arrived = data
            busy[i] = False
            if arrived is not None:
                e2e.append(now - arrived)
            if settle_started[i] is not None and settling[i] == 0:
                settle_ms.append(now - settle_started[i])
                committed[i] = settle_started[i] = None
            start_next(i, now)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1) if ordered else 0.0

    return {"late": sum(late.values()), "late_by_kind": dict(late), "positions": dict(kinds),
            "forwards_by_rows": dict(sorted(sizes.items())), "e2e_p50_ms": pct(e2e, 0.5), "e2e_p99_ms": pct(e2e, 0.99),
            "settlement_p50_ms": pct(settle_ms, 0.5), "settlement_p90_ms": pct(settle_ms, 0.9)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", type=float, nargs="+", default=[10.0, 16.0, 20.0, 25.0, 28.0],
                    help="ms of one forward of one position")
    ap.add_argument("--per-row", type=float, default=None, help="ms each further position adds (default step/7)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--slot", type=float, default=40.0)
    ap.add_argument("--settlement", type=int, default=7, help="positions a settlement runs")
    ap.add_argument("--policy", nargs="+", choices=["base", "await"], default=["base", "await"])
    ap.add_argument("--await-ms", type=float, default=40.0)
    ap.add_argument("--spread", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds modelled")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "tick_model.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.step, args.seeds, args.duration = [20.0], [1], 10.0
    rows = []
    for step in args.step:
        per_row = step / 7.0 if args.per_row is None else args.per_row
        for policy in args.policy:
            runs = [simulate(step=step, per_row=per_row, sessions=args.sessions, slot=args.slot,
                             settlement=args.settlement, duration=args.duration * 1000.0, spread=args.spread,
                             policy=policy, await_ms=args.await_ms, seed=seed) for seed in args.seeds]
            row = {"step_ms": step, "per_row_ms": round(per_row, 2), "policy": policy, "runs": runs}
            rows.append(row)
            print(f"step {step:4.1f}+{per_row:.1f} ms {policy:5}: late {[r['late'] for r in runs]}, "
                  f"e2e p99 {statistics.median(r['e2e_p99_ms'] for r in runs):.0f} ms, settlement p50/p90 "
                  f"{statistics.median(r['settlement_p50_ms'] for r in runs):.0f}/"
                  f"{statistics.median(r['settlement_p90_ms'] for r in runs):.0f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": "benchmarks/tick_model.py", "parameters": {
        "sessions": args.sessions, "slot_ms": args.slot, "settlement": args.settlement, "await_ms": args.await_ms,
        "spread": args.spread, "seeds": args.seeds, "duration_s": args.duration}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
