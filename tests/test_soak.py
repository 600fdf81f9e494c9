"""Soak (``benchmarks/soak.py``): sessions talking continuously (paced audio, voice turns, typed input, tool
calls, session restarts) against a server in a child process.

- ``test_soak_smoke`` (~30 s, always): every turn answered and completed, no error, every session closed by
  ``session.stop``, zero trace invariant violations on every socket, and the server's open tasks back to idle.
- ``test_soak_five_minutes`` (marked ``soak``; runs with ``-m soak`` or ``VOICECHAT_SOAK=1``): the same checks
  over 5 minutes and 4 sessions, plus bounded memory. Its figures land in benchmarks/results/soak_5min.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_soak", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def check(report: dict) -> None:
    c = report["clients"]
    assert c["errors"] == {} and c["timeouts"] == 0
    assert c["sessions"] == c["sessions_closed_ok"] >= 2
    assert {k.split("/")[0] for k in c["turns"]} <= {"voice", "typed", "tool"}
    assert sum(c["responses"].values()) == sum(c["turns"].values())  # every turn answered once...
    assert all(k.endswith("/completed") for k in c["responses"])  # ...and completed
    assert report["server"]["trace_violation_count"] == 0 and report["server"]["sockets_traced"] == c["sessions"]
    assert report["server"]["backpressure_overflows"] == 0
    tasks = report["open_tasks"]
    assert tasks["end"] < tasks["max"] and tasks["end"] <= 4  # no session's task outlives it (idle: uvicorn's own)


def test_soak_smoke():
    report = load_script().run_soak(sessions=2, duration=25, session_s=12, sample_s=1.0, seed=1, trace=True)
    check(report)
    assert {k.split("/")[0] for k in report["clients"]["responses"]} == {"voice", "typed", "tool"}


@pytest.mark.soak
def test_soak_five_minutes(request):
    if "soak" not in (request.config.option.markexpr or "") and os.environ.get("VOICECHAT_SOAK") != "1":
        pytest.skip("5-minute soak: run with -m soak or VOICECHAT_SOAK=1")
    report = load_script().run_soak(sessions=4, duration=300, session_s=100, sample_s=5.0, seed=0, trace=True)
    out = SCRIPT.parent / "results" / "soak_5min.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    check(report)
    assert report["rss_mib"]["max"] - report["rss_mib"]["start"] < 64  # bounded, not a slope threshold
