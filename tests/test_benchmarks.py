"""Smoke runs of the capacity and overhead benchmarks (benchmarks/) at tiny sizes: each runs, writes its JSON with
the documented keys and a PNG plot, and prints its one-line summary. Figures are not asserted (benchmarks are
not timed tests); only that they were measured."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _bench_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


def _measured(summary: dict) -> None:
    assert summary["count"] > 0 and summary["p50_us"] > 0 and summary["p99_us"] >= summary["p50_us"]


def test_server_overhead_smoke(tmp_path, capsys):
    import server_overhead

    out = tmp_path / "so.json"
    assert server_overhead.main(["--quick", "--sessions", "1", "3", "--ticks", "80", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "server_overhead"
    assert [(r["dialect"], r["sessions"]) for r in report["levels"]] == [("v3", 1), ("v3", 3), ("tiered", 1),
                                                                          ("tiered", 3)]
    for r in report["levels"]:
        assert {"overhead_per_position", "model_step_mean_us", "server_work_per_tick_excl_model", "positions",
                "client", "closed_sessions", "cpu_share"} <= set(r)
        _measured(r["overhead_per_position"])
        assert r["positions"] >= r["ticks"] * r["sessions"] * 0.5
        assert r["closed_sessions"] == 0 and r["client"]["responses_done"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
    assert capsys.readouterr().out.startswith("server overhead per 80 ms position (model excluded): v3@1: p50 ")


def test_memory_smoke(tmp_path):
    out = tmp_path / "mem.json"
    proc = subprocess.run([sys.executable, str(BENCH / "memory.py"), "--quick", "--sessions", "2", "--trace-sessions",
                           "2", "--seconds", "2", "--journal-seconds", "3", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r["dialect"] for r in report["per_session"]] == ["v3", "tiered"]
    for r in report["per_session"]:
        assert {"rss_bytes_per_session", "traced_bytes_per_session", "top_sites", "alive"} <= set(r)
        assert r["traced_bytes_per_session"] > 0 and r["alive"] == 2
        # the shared token-audio cache's growth is left out of the session-state RSS, and only it
        cache = r["process_cache_bytes"]
        assert cache >= 0 and abs(r["rss_bytes_per_session"] - r["rss_state_bytes_per_session"] - cache / 2) <= 1, r
    j = report["journal"]
    assert j["journal_bytes_per_minute_of_audio"] > 0 and j["retained_bytes_per_session_acking_client"] == 0
    assert j["retained_bytes_per_session_no_acks"] > 0 and j["sessions_overflowed"] == 0
    assert out.with_suffix(".png").stat().st_size > 0
    assert proc.stdout.strip().splitlines()[-1].startswith("memory per session: v3 ")


def test_trickled_frame_smoke(tmp_path):
    out = tmp_path / "trickle.json"
    proc = subprocess.run([sys.executable, str(BENCH / "trickled_frame.py"), "--mib", "0.25", "--read", "512",
                           "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["parameters"] == {"mib": 0.25, "read_bytes": 512}
    assert set(report["cpu_s"]) == {"ours", "websockets"} and all(v >= 0 for v in report["cpu_s"].values())
    assert proc.stdout.startswith("0.25 MiB text frame in 512-byte reads (513 reads):")


def test_session_end_pause_smoke(tmp_path):
    """Both policies on both dialects at smoke sizes; the former runs a full collection after the ends, the current
    one none (sessions free themselves)."""
    out = tmp_path / "pause.json"
    proc = subprocess.run([sys.executable, str(BENCH / "session_end_pause.py"), "--v3", "6", "--end", "3", "--tiered",
                           "4", "--settle", "2.5", "--out", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["dialect"], r["policy"]) for r in rows] == [
        ("v3", "collect after ends (former)"), ("v3", "free at the end (now)"),
        ("tiered", "collect after ends (former)"), ("tiered", "free at the end (now)")]
    assert [r["heap_collections"] >= 1 for r in rows] == [True, False, True, False]
    assert all(r["full_collections"] == 0 and r["objects_collected"] == 0 for r in rows[1::2])


def test_hostile_clients_smoke(tmp_path):
    """The reduced form: two attacks, 2 s each, against this checkout; the v3 bomb never reaches the decoder and the
    echo is cut."""
    out = tmp_path / "hostile.json"
    proc = subprocess.run([sys.executable, str(BENCH / "hostile_clients.py"), "--duration", "2", "--attacks",
                           "json_bomb_v3,echo", "--out", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["attack"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"json_bomb_v3", "echo"} and all(r["server"] == "now" for r in rows.values())
    assert rows["json_bomb_v3"]["attacker"].get("reconnects", 0) >= 1  # closed 1009 at each bomb's header
    echo = rows["echo"]["attacker"]
    assert echo["sent_bytes"] > 0 and echo["received_bytes"] < echo["sent_bytes"] / 100
    assert all(r["talker_frames"] > 0 for r in rows.values())


def test_capacity_smoke(tmp_path):
    """Both dialects, one short trial each, the load generator in its own process: every figure the search and the
    closing note rely on is there and measured."""
    out = tmp_path / "cap.json"
    proc = subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--quick", "--start", "2", "--warmup", "1",
                           "--window", "6", "--out", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert {"dialects", "parameters", "machine", "elapsed_s"} <= set(report)
    params = report["parameters"]
    assert params["server_python"] == sys.executable  # the server's interpreter, and its build, on the record
    assert params["server_python_version"].startswith(platform.python_version() + " ")
    assert params["server_python_version"].endswith(("libpython shared", "libpython static"))
    assert set(report["dialects"]) == {"v3", "tiered"}
    for dialect, d in report["dialects"].items():
        assert {"max_realtime_sessions", "at_max", "trials", "first_failing"} <= set(d)
        (trial,) = d["trials"]
        assert trial["dialect"] == dialect and trial["sessions"] == 2 and trial["connected"] == 2
        assert trial["error_count"] == 0 and trial["server_errors"] == 0, trial["errors"]
        assert trial["server_positions"] > 0 and trial["frames_sent"] > 0
        assert set(trial["late_by_cause"]) == {"late_start", "late_inbox", "over_budget", "delivery"}
        assert trial["server_cpu_ms_per_session_frame"] > 0 and trial["server_cpu_us_per_position"] > 0
        assert trial["server_threads"]["window"] >= trial["server_threads"]["idle"] > 0
        assert trial["server_rss_per_session_bytes"] is not None
        assert trial["client_generators"] == 2 and len(trial["client_cpu_cores"]) == 2
        _measured(trial["loop_probe_rtt"])
        host = trial["host_speed_ms"]
        assert host["count"] >= 1 and 0 < host["min"] <= host["median"] <= host["max"]
        if dialect == "v3":
            assert trial["frames_unanswered"] <= 2
            _measured(trial["input_to_metrics_lag"])
    assert out.with_suffix(".png").stat().st_size > 0
    assert proc.stdout.strip().splitlines()[-1].startswith("capacity: v3 ")


def test_capacity_paired_smoke(tmp_path):
    """--against: each round serves the same load from two checkouts at the same time; both trials and their ratio
    are on the record, and the start order alternates."""
    out = tmp_path / "paired.json"
    proc = subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--quick", "--dialects", "v3", "--sessions", "2",
                           "--warmup", "1", "--window", "4", "--against", str(BENCH.parent), "--rounds", "2",
                           "--out", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["parameters"]["against_root"] == str(BENCH.parent) and report["parameters"]["rounds"] == 2
    assert report["parameters"]["against_commit"] == report["parameters"]["server_commit"]
    paired = report["paired"]["v3"]
    assert paired["sessions"] == 2 and [r["first"] for r in paired["rounds"]] == ["served", "against"]
    for r in paired["rounds"]:
        for side in ("served", "against"):
            trial = r[side]
            assert trial["connected"] == 2 and trial["error_count"] == 0, trial["errors"]
            assert trial["server_positions"] > 0 and trial["server_cpu_ms_per_session_frame"] > 0
        assert r["ratio"] == round(r["served"]["server_cpu_ms_per_session_frame"]
                                   / r["against"]["server_cpu_ms_per_session_frame"], 4)
    assert paired["ratio_min"] <= paired["ratio_median"] <= paired["ratio_max"]
    assert proc.stdout.strip().splitlines()[-1].startswith("capacity paired: v3 2 sessions, served/against ")
    with pytest.raises(subprocess.CalledProcessError):  # one session count per paired run
        subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--against", str(BENCH.parent)], check=True,
                       capture_output=True, timeout=60)


def test_run_all_skips_the_omni_ratio_with_a_message_when_no_interpreter_has_vllm_omni(monkeypatch, tmp_path):
    import run_all

    monkeypatch.setattr(run_all, "OMNI_CANDIDATES", (tmp_path / "missing" / "python",))
    monkeypatch.setattr(run_all, "has_vllm_omni", lambda python: False)
    monkeypatch.delenv("VOICECHAT_OMNI_PYTHON", raising=False)
    python, why = run_all.find_omni_python(None)
    assert python is None
    assert why.startswith("no interpreter with vllm_omni: ") and "(missing)" in why and "(no vllm_omni)" in why


def test_omni_runner_ratio_smoke(tmp_path, capsys):
    pytest.importorskip("vllm_omni")
    import omni_runner_ratio

    out = tmp_path / "ratio.json"
    assert omni_runner_ratio.main(["--sessions", "2", "--seconds", "3", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (level,) = report["levels"]
    assert level["sessions"] == 2 and level["ratio"] > 0
    for stack in ("ours", "vllm_omni_runner"):
        r = level[stack]
        assert {"positions", "cpu_s", "model_s", "overhead_per_position_us", "events", "responses"} <= set(r)
        assert r["positions"] >= 30 and r["overhead_per_position_us"] > 0 and r["responses"] >= 2
    assert out.with_suffix(".png").stat().st_size > 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "vLLM-Omni runner / ours (CPU per position, model excluded): 2 sessions: ours ")


def test_memory_counts_what_the_token_audio_cache_holds():
    import tracemalloc

    import memory
    from vllm_omni_voicechat.audio.speech import render_token_audio

    render_token_audio.cache_clear()  # a cache: emptying it only costs the next renders
    assert memory.token_audio_cache_bytes() == 0
    render_token_audio(" the", 22_050, 1_764)  # as the simulator calls it; the first entry builds the cache's dict
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for token in (" hel", "lo", " wor", "ld"):
            render_token_audio(token, 22_050, 1_764)
        held = tracemalloc.get_traced_memory()[0] - before  # what stays allocated: frames and links
    finally:
        tracemalloc.stop()
    estimate = memory.token_audio_cache_bytes() * 4 / 5
    assert abs(estimate - held) <= 0.005 * held, (estimate, held)


def test_gpu_sizing_states_what_one_gpu_holds(tmp_path, monkeypatch):
    """The sizing behind deploy/voicechat.yaml's eight sessions (docs/running-on-gpu.md, "Sizing")."""
    import gpu_sizing

    out = tmp_path / "sizing.json"
    monkeypatch.setattr(sys, "argv", ["gpu_sizing.py", "--out", str(out)])
    assert gpu_sizing.main() == 0
    report = json.loads(out.read_text())
    assert report["memory_per_session_mib"]["thinker_kv"] == 144.0
    h100 = report["gpus"]["H100 SXM (80 GB, 3.35 TB/s)"]
    assert h100["compute_bound_sessions"]["unbatched"] == 4
    assert h100["compute_bound_sessions"]["tick_2_forwards"] >= 8 and h100["memory_bound_sessions"] >= 8
    measured = tmp_path / "costs.json"
    measured.write_text(json.dumps({"stage1_row_ms": 6.0}))  # a slower talker than estimated: fewer fit
    monkeypatch.setattr(sys, "argv", ["gpu_sizing.py", "--costs", str(measured), "--out", str(out)])
    assert gpu_sizing.main() == 0
    assert json.loads(out.read_text())["gpus"]["H100 SXM (80 GB, 3.35 TB/s)"]["compute_bound_sessions"][
        "tick_2_forwards"] < 8


def test_fleet_smoke(tmp_path):
    """The reduced form: 2 replicas x 2 sessions behind Debian's HAProxy, 8 drops; every resume on its owner, no
    refusal while a slot was free, the extra client of the over-capacity race refused."""
    import shutil

    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (scripts/install_haproxy.sh)")
    out = tmp_path / "fleet.json"
    proc = subprocess.run([sys.executable, str(BENCH / "fleet.py"), "--replicas", "2", "--sessions", "2", "--drops",
                           "8", "--pings", "20", "--extra", "1", "--rounds", "1", "--out", str(out)], check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["resumes"]["resumed_on_owner"] == report["resumes"]["attempted"] == 8
    assert report["resumes"]["sequence_gaps"] == report["resumes"]["sequence_duplicates"] == 0
    rounds = report["admission"]["rounds"]
    assert [r["clients"] for r in rounds] == [4, 5] and report["admission"]["refused_while_a_slot_was_free"] == 0
    assert rounds[0]["results"] == {"admitted": 4} and rounds[1]["results"].get("admitted") == 4
    assert report["latency"]["proxy"]["count"] == report["latency"]["direct"]["count"] == 20


def test_tick_model_runs_the_engine_tick_deterministically(tmp_path):
    """The tick model drives the real ``EngineTick``: the same seed gives the same run, every session's settlement
    ends, and a fast enough engine leaves nothing late under either settlement policy."""
    import tick_model

    out = tmp_path / "tick_model.json"
    assert tick_model.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["step_ms"], r["policy"]) for r in report["rows"]] == [(20.0, "base"), (20.0, "await")]
    for policy in ("base", "await"):
        first = tick_model.simulate(step=10.0, per_row=1.5, policy=policy, seed=4, duration=20_000.0)
        assert first == tick_model.simulate(step=10.0, per_row=1.5, policy=policy, seed=4, duration=20_000.0)
        assert first["late"] == 0 and first["settlement_p50_ms"] > 0
        assert first["positions"]["real"] > 0 and first["forwards_by_rows"].get(4, 0) > 0


def test_transport_floor_smoke(tmp_path, capsys):
    import transport_floor

    out = tmp_path / "floor.json"
    assert transport_floor.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "transport_floor"
    result = report["result"]
    assert result["sessions"] == 4 and result["window_s"] == 2.0
    assert result["frames_sent"] == 4 * 50  # 4 s of appends each (1 s warm-up, 2 s window, 1 s after)
    assert result["bytes_received"] > 0  # answered; the CPU figure is not asserted
    assert result["server_cores"] >= 0
    assert capsys.readouterr().out.startswith("transport floor: 4 sessions, server ")
