"""``vllm-omni bench serve --omni --backend voicechat`` through vLLM-Omni 0.30.0's real CLI (subprocesses) against
the in-process simulator server: strict v3 and the tiered OpenAI lane, 2 sessions each, concurrently.

Skipped unless ``vllm_omni`` imports (run it in the omni venv). Each CLI spends ~20 s importing vLLM-Omni; the
two run at the same time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm_omni")

from vllm_omni_voicechat.bench.metrics import LATENCY_FIELDS
from vllm_omni_voicechat.server import ServerConfig

from .server_fixture import running_server

REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 300
SCRIPTS = ["hello there\ngood morning", "how are you"]
REPLIES = {"You said: hello there.", "You said: good morning.", "You said: how are you."}
HAS_CHECKER = (REPO / "vllm_omni_voicechat" / "trace" / "__init__.py").exists()
ROUTES = {
    "v3": ("/v1/voicechat", {}),
    # the bench's channel for backend options; non-default instructions also make the OpenAI lane's
    # session.updated wait for the prefill (see test_bench_driver.py)
    "tiered": ("/v1/realtime?model=sim", {"voicechat": {"instructions": "Be brief.", "turn_timeout_s": 30}}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cli = Path(sys.executable).with_name("vllm-omni")
    if not cli.exists():
        pytest.fail("vllm_omni is importable but its `vllm-omni` console script is missing")
    tmp = tmp_path_factory.mktemp("bench")
    dataset = tmp / "sessions.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in SCRIPTS))
    with running_server(ServerConfig.simulator(max_sessions=4)) as ws:
        base = ws.replace("ws://", "http://")
        procs = {}
        for name, (endpoint, extra) in ROUTES.items():
            argv = [str(cli), "bench", "serve", "--omni", "--backend", "voicechat", "--base-url", base,
                    "--endpoint", endpoint, "--model", "sim", "--skip-tokenizer-init",
                    "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", "2",
                    "--disable-shuffle", "--max-concurrency", "2",
                    "--percentile-metrics", "ttft,itl,e2el,audio_ttfp,audio_rtf", "--metric-percentiles", "50,99",
                    "--save-result", "--result-dir", str(tmp), "--result-filename", f"{name}.json"]
            if extra:
                argv += ["--extra-body", json.dumps(extra)]
            procs[name] = subprocess.Popen(argv, cwd=tmp, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = {}
        for name, proc in procs.items():
            try:
                text, _ = proc.communicate(timeout=CLI_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
            out[name] = (proc.returncode, text, tmp / f"{name}.json")
    return out


@pytest.mark.parametrize("dialect", list(ROUTES))
def test_bench_serve_writes_every_metric(runs, dialect):
    code, text, path = runs[dialect]
    assert code == 0, text[-4000:]
    # the usual tables, our section after them, and the progress bar's last state
    assert "Serving Benchmark Result" in text and "Audio Result" in text and "Voicechat Duplex Result" in text
    assert "2/2" in text and "turns=3" in text
    r = json.loads(path.read_text())
    assert (r["backend"], r["completed"], r["failed"], r["max_concurrency"]) == ("voicechat", 2, 0, 2)
    for key in ("mean_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "mean_audio_ttfp_ms",
                "p99_audio_ttfp_ms", "mean_audio_rtf", "mean_e2el_ms"):
        assert math.isfinite(r[key]) and r[key] > 0, key

    s = r["voicechat"]
    assert (s["sessions"], s["failed_sessions"], s["turns"], s["completed_turns"]) == (2, 0, 3, 3)
    assert (s["errors"], s["error_messages"], s["dialects"]) == (0, [], [dialect])
    for name in LATENCY_FIELDS:
        d = s[name]
        assert d["count"] == 3 and 0 <= d["p50"] <= d["p99"] <= d["max"], name
    assert s["inter_delta_gap_ms"]["count"] >= 3 * 10  # ~12 audio deltas per "You said: ..." reply
    assert 0 < s["inter_delta_gap_ms"]["p50"] <= s["inter_delta_gap_ms"]["p99"]
    assert s["audio_rtf"]["count"] == 3 and s["audio_ms_total"] > 0
    if dialect == "v3":  # voicechat.metrics: every position's budget verdict
        assert s["over_budget_reported"] and s["positions"] > 0 and s["over_budget_positions"] >= 0
    else:  # the tiered dialect sends no per-position telemetry
        assert not s["over_budget_reported"] and s["positions"] is None and s["over_budget_positions"] is None

    rows = r["duplex_request_metrics"]
    assert len(rows) == 3 and {row["text"] for row in rows} == REPLIES
    assert sorted((row["session_id"].rsplit("-", 1)[-1], row["index"]) for row in rows) == [
        ("0", 0), ("0", 1), ("1", 0)]
    for row in rows:
        assert row["status"] == "completed" and row["errors"] == [] and row["dialect"] == dialect
        assert row["ttfa_ms"] >= row["commit_to_response_created_ms"] >= 0 and row["gaps_ms"]
        assert (row["over_budget_positions"] is None) == (dialect == "tiered")
    sessions = r["duplex_session_metrics"]
    assert len(sessions) == 2
    for sess in sessions:
        assert (sess["close_code"], sess["errors"], sess["trace_checked"]) == (1000, [], HAS_CHECKER)
