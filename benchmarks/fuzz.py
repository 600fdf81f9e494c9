"""Protocol fuzzing at scale: generated client streams against both dialects' sans-I/O sessions.

Runs the fuzzer of ``tests/fuzz.py`` (valid, invalid and hostile client events, model behaviours, socket drops,
resumes, takeovers, grace expiry; every server event through the trace checker) for at least ``--events`` client
events (default 100,000, split evenly between the dialects), then prints events/s, crashes, hangs, invariant
violations, unusable sessions and errors by code, and writes a JSON report. A failure names its
``(dialect, seed, episode)``: rerun with that seed to reproduce it. Exit status 1 when anything failed.

    .venv/bin/python benchmarks/fuzz.py                        # 100,000 events, seed 0 (a few minutes)
    .venv/bin/python benchmarks/fuzz.py --events 10000 --seed 7 --dialect tiered
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: the fuzzer is a test harness

from tests.fuzz import fuzz

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="client events in all (default 100,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dialect", choices=["both", "v3", "tiered"], default="both")
    ap.add_argument("--out", type=Path, default=RESULTS / "fuzz.json")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy casts of random float32 input (NaN/inf) are expected

    dialects = ["v3", "tiered"] if args.dialect == "both" else [args.dialect]
    share = -(-args.events // len(dialects))
    runs = []
    for dialect in dialects:
        start = time.perf_counter()
        stats = fuzz(dialect, seed=args.seed, events=share)
        seconds = time.perf_counter() - start
        summary = stats.summary()
        summary["seconds"] = round(seconds, 2)
        summary["events_per_second"] = round(stats.client_events / seconds, 1)
        summary["server_events_per_second"] = round(stats.server_events / seconds, 1)
        runs.append(summary)
        print(f"{dialect:7s} {stats.client_events:8,d} client events  {stats.server_events:9,d} server events  "
              f"{stats.positions:8,d} positions  {stats.episodes:5,d} sessions  {seconds:6.1f} s  "
              f"{summary['events_per_second']:8,.0f} events/s")
        print(f"        crashes {len(stats.crashes)}  hangs {len(stats.hangs)}  violations {len(stats.violations)}  "
              f"unusable {len(stats.unusable)} (of {stats.usability_checks} usability checks)")
        print("        errors by code: " + ", ".join(f"{k} {v}" for k, v in stats.errors_by_code.most_common()))
        print("        fatal by code:  " + ", ".join(f"{k} {v}" for k, v in stats.fatal_by_code.most_common()))
        print("        endings:        " + ", ".join(f"{k} {v}" for k, v in stats.endings.most_common()))
        if stats.transport:
            print("        transport:      " + ", ".join(f"{k} {v}" for k, v in stats.transport.most_common()))
        for failure in summary["first_failures"][:5]:
            print("        FAIL " + failure.splitlines()[0][:300])

    total = {k: sum(r[k] for r in runs) for k in ("client_events", "server_events", "positions", "episodes",
                                                   "crashes", "hangs", "violations", "unusable")}
    seconds = sum(r["seconds"] for r in runs)
    total["seconds"] = round(seconds, 2)
    total["events_per_second"] = round(total["client_events"] / seconds, 1) if seconds else None
    print(f"total   {total['client_events']:,} client events in {seconds:.1f} s "
          f"({total['events_per_second']:,.0f}/s): crashes {total['crashes']}, hangs {total['hangs']}, "
          f"violations {total['violations']}, unusable {total['unusable']}")
    report = {
        "benchmark": "fuzz",
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count()},
        "parameters": {"events": args.events, "seed": args.seed, "dialects": dialects},
        "total": total,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if not (total["crashes"] or total["hangs"] or total["violations"] or total["unusable"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
