"""Soak (``benchmarks/soak.py``): sessions talking continuously (paced audio, voice turns, typed input, tool
calls, barge-ins, transport drops with resume, session restarts and abandoned sessions) against a server in a
child process, both dialects at once.

- ``test_soak_smoke`` (~35 s, always): every turn answered and completed (a barge-in's first answer cancelled),
  no error, every v3 session closed by ``session.stop`` and every tiered one closed or abandoned, every resumed
  question answered whole (its input resent from the receipt) with no event lost or duplicated, zero trace
  invariant violations on every socket, the server's open tasks, threads and descriptors back to idle, and no
  ended session left in the server's memory (their reference cycles collected: server/heap.py).
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

from vllm_omni_voicechat.server.hosting import MODEL_POOL_THREADS

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_soak", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def check(report: dict) -> None:
    v3, tiered = report["v3"], report["tiered"]
    assert report["clients"]["errors"] == {} and report["clients"]["timeouts"] == 0, report["clients"]["anomalies"]
    assert v3["sessions"] == v3["sessions_closed_ok"] >= 2
    assert {k.split("/")[0] for k in v3["turns"]} <= {"voice", "typed", "tool"}
    assert sum(v3["responses"].values()) == sum(v3["turns"].values())  # every turn answered once...
    assert all(k.endswith("/completed") for k in v3["responses"])  # ...and completed
    if report["parameters"]["tiered"]:
        assert tiered["sessions"] == tiered["sessions_closed_ok"] + tiered["abandoned"] >= 2
        assert tiered["answered"] == sum(tiered["turns"].values())
        barge_ins = tiered["turns"].get("barge_in", 0)
        assert tiered["responses"].get("barge_in/cancelled", 0) == barge_ins
        assert sum(n for k, n in tiered["responses"].items() if not k.endswith("/completed")) == barge_ins
        assert tiered["resumes"] == tiered["turns"].get("drop", 0) == tiered["input_intact"]
        assert tiered["input_gaps"] == tiered["lost_events"] == tiered["duplicate_events"] == 0
        assert tiered["anomalies"] == []
    sockets = v3["sessions"] + tiered["sessions"] + tiered["resumes"]
    assert report["server"]["trace_violation_count"] == 0 and report["server"]["sockets_traced"] == sockets
    assert report["server"]["backpressure_overflows"] == 0
    assert report["server"]["session_cores_alive"] == 0  # ended sessions freed themselves (no full collection at ends)
    tasks = report["open_tasks"]
    assert tasks["end"] < tasks["max"] and tasks["end"] <= 4  # no session's task outlives it (idle: uvicorn's own)
    # no thread outlives its session; the server's bounded pools keep theirs (the model pool: not one per session)
    assert report["threads_outside_pools"]["end"] <= report["threads_outside_pools"]["start"]
    assert report["model_threads"]["max"] <= MODEL_POOL_THREADS
    assert report["fds"]["end"] <= report["fds"]["start"]


def test_soak_smoke():
    report = load_script().run_soak(sessions=2, tiered=2, duration=30, session_s=14, sample_s=1.0, seed=1,
                                    trace=True, grace_s=2.0)
    check(report)
    assert {k.split("/")[0] for k in report["v3"]["responses"]} == {"voice", "typed", "tool"}
    assert {"drop", "barge_in", "tool", "typed", "voice"} <= set(report["tiered"]["turns"])


@pytest.mark.soak
def test_soak_five_minutes(request):
    if "soak" not in (request.config.option.markexpr or "") and os.environ.get("VOICECHAT_SOAK") != "1":
        pytest.skip("5-minute soak: run with -m soak or VOICECHAT_SOAK=1")
    report = load_script().run_soak(sessions=4, tiered=4, duration=300, session_s=100, sample_s=5.0, seed=0,
                                    trace=True)
    out = SCRIPT.parent / "results" / "soak_5min.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    check(report)
    assert report["rss_mib"]["max"] - report["rss_mib"]["start"] < 64  # bounded, not a slope threshold
