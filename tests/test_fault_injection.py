"""Transport fault injection with resume, small N: ``benchmarks/fault_injection.py``'s trials (vLLM-Omni 0.30.0's
own ``DuplexClient``, unmodified) against the real server, every socket through the trace checker.

Drops at random points (mid-audio, mid-response, mid-tool-call), reconnects within the grace, and takeovers by a
second socket: every trial must succeed with no event lost and none delivered twice. Skipped where vllm-omni is
not installed; CI runs it in the CPU vLLM-Omni venv. ``--trials 1000`` is the script's job.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from vllm_omni_voicechat.server import ServerConfig

from .compat import load_duplex_client_module
from .server_fixture import running_app

dc = load_duplex_client_module()

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fault_injection.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_fault_injection", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_random_drops_and_takeovers_resume_without_loss_or_duplicates():
    fi = load_script()
    config = ServerConfig.simulator(max_sessions=8, disconnect_grace_s=3.0, settlement_blank_frames=3)
    with running_app(config) as (url, app):
        report = asyncio.run(fi.run_trials(dc, url, app, trials=10, seed=7, concurrency=4, max_delay_s=0.3,
                                           takeover_share=0.3, timeout_s=40))
    results = report["results"]
    assert [r["failure"] for r in results if not r["ok"]] == []
    assert report["succeeded"] == 10 and report["lost_events"] == 0 and report["app_duplicate_events"] == 0
    assert {r["kind"] for r in results} == {"mid_audio", "mid_response", "mid_tool_call"}
    assert any(r["takeover"] for r in results) and any(not r["takeover"] for r in results)
    assert all(r["sockets"] == 2 for r in results)  # one drop, one resume each
    assert report["replay_latency_ms"]["count"] == 10


def test_mid_audio_drops_lose_no_input_with_our_client_and_the_stock_client_is_measured_too():
    """Issue 21: with ``ResumingDuplexClient`` the audio in flight at a drop reaches the session exactly once (the
    words decode and the bytes taken in equal the bytes streamed); the stock client runs the same plans."""
    fi = load_script()
    config = ServerConfig.simulator(max_sessions=8, disconnect_grace_s=3.0, settlement_blank_frames=3)
    with running_app(config) as (url, app):
        report = asyncio.run(fi.run_trials(dc, url, app, trials=6, seed=3, concurrency=4, max_delay_s=0.3,
                                           takeover_share=0.3, timeout_s=40, kinds=("mid_audio",),
                                           clients=("stock", "ours")))
    ours = [r for r in report["results"] if r["client"] == "ours"]
    assert [r["failure"] for r in report["results"] if not r["ok"]] == []
    assert len(ours) == 6 and all(r["input_intact"] for r in ours), [r["input_bytes"] for r in ours]
    assert all(r["input_bytes"]["taken_in"] == r["input_bytes"]["streamed"] for r in ours)
    assert sum(r["input_resent"] for r in ours) > 0  # the drops did catch audio in flight
    stock = report["by_client"]["stock"]["mid_audio_input_intact"]
    assert stock["ok_trials"] == 6 and stock["resent_appends"] == 0
