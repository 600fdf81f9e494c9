"""Many sessions on one engine: 1..N real-time v3 sessions on the real engine on CPU (``vllm-omni serve``, the tiny
checkpoint, deploy/voicechat-cpu.yaml), with the engine tick on and off in the same run.

Every session is a full-duplex talker whose microphone never stops (one 80 ms append on an absolute schedule): a
pause, a phrase of simulator speech between ``turn_start`` and ``commit``, silence until ``response.done``, a pause,
... (``_common.ScriptedClient``). The sessions start streaming together (aligned, as clients that connect at
once; ``--spread`` spreads their phases across one frame instead). After ``--warmup`` seconds a ``--window`` of
steady state is measured:

* positions run, **late** positions (``turn_state.late_ms`` >= 40: a position that ran half a frame or more after it
  was due, not counting the engine tick's chosen hold), over-budget steps, held milliseconds;
* step p50/p99 (the whole position on the server), e2e p50/p99 (append written -> its metrics at the client);
* server CPU per session-position by process (the API server with our runtime and vLLM-Omni's orchestrator, and
  each stage's engine core with its worker), all processes of the server included;
* how many requests each stage's forwards carried: Stage 0 exactly, from our thinker's per-position evidence
  (``stage0_batch``, and ``perceived_with``: how many frames its perception was encoded with), and every stage from
  our stage schedulers' log (cumulative counts logged at most every 2 s: the window's edges are as precise as that).

``--slots 40 0`` runs the engine once per tick slot (0: no batching) with everything else as deployed;
``--audio-lags 1 2`` once per Stage-2 lag (``voicechat.audio_lag_positions``: step N returns position N - L's audio,
so a position waits for Stage 2 only L positions back) for each slot.
``--server-root DIR --env KEY=VALUE ...`` serves another checkout's code with its own CPU deploy YAML and environment
(the code before a change, for a before/after in one hour; its YAML gets only the session count). Run in the engine
venv (scripts/install_omni_cpu.sh VENV --engine):

    .engine-venv/bin/python benchmarks/engine_concurrency.py [--sessions 1 2 3 4] [--window 60] [--slots 40 0]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import AppendCache, ScriptedClient, machine_info, now_utc, pyplot, session_update, write_report  # noqa: E402

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS  # noqa: E402

LATE_MS = 40.0
BUDGET_MS = 80.0
CONNECT_S = 3.0
BATCH_LINE = re.compile(r"StageEngineCoreProc_stage(\d+)_replica0 pid=\d+\).*voicechat stage \d+ forwards by "
                        r"requests: (\{[^}]*\})")


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)


def spread(values: list[float]) -> dict:
    return {"count": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "max": round(max(values), 2) if values else None,
            "mean": round(statistics.fmean(values), 2) if values else None}


class Stats:
    def __init__(self) -> None:
        self.positions = 0
        self.late = 0
        self.over_budget = 0
        self.step_ms: list[float] = []
        self.inference_ms: list[float] = []
        self.held_ms: list[float] = []
        self.e2e_ms: list[float] = []
        self.late_ms: list[float] = []
        self.late_seconds: dict[int, int] = {}
        """Late positions by the second of the window their metrics arrived in: whether lateness comes in bursts."""
        self.stage0_batch: dict[int, float] = {}
        self.perceived_with: dict[int, float] = {}
        self.tick_size: dict[int, int] = {}
        self.kinds: dict[str, int] = {}
        self.errors: list[str] = []
        self.responses = 0
        self.committed_ms: list[float] = []
        """A commit's send -> its ``input_audio_buffer.committed`` (the settlement's positions between)."""
        self.response_start_ms: list[float] = []
        """A commit's send -> the response's first audio."""
        self.trace: list[dict] = []
        """Every position of the window (``--trace``): where late positions sit, by session and by tick."""


async def one_session(url: str, index: int, spec: dict, stats: Stats) -> None:
    import websockets
    from websockets.asyncio.client import connect

    client = ScriptedClient("v3", random.Random(spec["seed"] + index), AppendCache("v3"))
    w0, w1 = spec["w0"], spec["w1"]
    sent_at: dict[int, float] = {}
    commit: dict[str, float] = {}  # the open commit's send time, while its ack ("ack") and first audio ("audio") wait
    async with connect(url, max_size=None, ping_interval=None, open_timeout=60, close_timeout=10,
                       compression=None) as ws:
        first = json.loads(await ws.recv())
        if first.get("type") != "session.created":
            stats.errors.append(f"session {index}: {first}")
            return
        await ws.send(session_update("v3", f"Be brief (session {index})."))
        while (event := json.loads(await ws.recv()))["type"] != "session.updated":
            if event["type"] == "error":
                stats.errors.append(f"session {index}: {event['error']}")
                return

        async def reader() -> None:
            async for text in ws:
                now = time.monotonic()
                if text.startswith('{"type":"voicechat.metrics"'):
                    m = json.loads(text)
                    sent = sent_at.pop(m.get("transport_frame"), None) if m.get("transport_frame") is not None else None
                    if m.get("frame") is None or not w0 <= now < w1:
                        continue
                    ts = m.get("turn_state") or {}
                    model = ts.get("model") or {}
                    stats.positions += 1
                    kind = ts.get("kind", "?")
                    stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
                    stats.step_ms.append(m["server_step_ms"])
                    stats.inference_ms.append(m.get("inference_ms") or 0.0)
                    late = ts.get("late_ms") or 0.0
                    stats.late_ms.append(late)
                    if late >= LATE_MS:
                        stats.late += 1
                        second = int(now - w0)
                        stats.late_seconds[second] = stats.late_seconds.get(second, 0) + 1
                    stats.over_budget += bool(m.get("over_budget"))
                    stats.held_ms.append(model.get("held_ms", 0.0))
                    batch = model.get("stage0_batch")
                    if isinstance(batch, int) and batch > 0:
                        stats.stage0_batch[batch] = stats.stage0_batch.get(batch, 0.0) + 1.0 / batch
                    together = model.get("perceived_with")
                    if isinstance(together, int) and together > 0:
                        stats.perceived_with[together] = stats.perceived_with.get(together, 0.0) + 1.0 / together
                    size = model.get("tick_size")
                    if isinstance(size, int):
                        stats.tick_size[size] = stats.tick_size.get(size, 0) + 1
                    if sent is not None:
                        stats.e2e_ms.append((now - sent) * 1000.0)
                    stats.trace.append({"session": index, "at_s": round(now - w0, 4), "frame": m.get("frame"),
                                        "kind": kind, "step_ms": m["server_step_ms"],
                                        "inference_ms": m.get("inference_ms"), "late_ms": late,
                                        "e2e_ms": None if sent is None else round((now - sent) * 1000.0, 2),
                                        "model": model})
                    continue
                if commit and w0 <= now < w1:
                    if "ack" in commit and '"input_audio_buffer.committed"' in text[:60]:
                        stats.committed_ms.append((now - commit.pop("ack")) * 1000.0)
                    elif "audio" in commit and '"response.output_audio.delta"' in text[:60]:
                        stats.response_start_ms.append((now - commit.pop("audio")) * 1000.0)
                if '"type":"error"' in text[:40] and w0 <= now < w1:
                    stats.errors.append(f"session {index}: {text[:300]}")
                if '"response.done"' in text and w0 <= now < w1:
                    stats.responses += 1
                for reply in client.observe(text):
                    await ws.send(reply)

        reading = asyncio.create_task(reader())
        frame = 0
        tick = 0
        start = spec["t0"] + (index / spec["sessions"] * FRAME_SECONDS if spec["spread"] else 0.0)
        try:
            while True:
                due = start + tick * FRAME_SECONDS
                tick += 1
                if due >= spec["end"] or reading.done():
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # real-time pacing on an absolute schedule
                try:
                    for text in client.tick():
                        if '"input_audio_buffer.append"' in text:
                            sent_at[frame] = time.monotonic()
                            frame += 1
                        elif '"input_audio_buffer.commit"' in text:
                            commit["ack"] = commit["audio"] = time.monotonic()
                        await ws.send(text)
                except websockets.ConnectionClosed as exc:
                    stats.errors.append(f"session {index}: closed {exc}")
                    break
            try:
                await ws.send(json.dumps({"type": "session.stop", "event_id": "stop"}))
                await asyncio.wait_for(reading, 30)
            except (asyncio.TimeoutError, Exception):
                pass
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


def process_cpu(server) -> dict[str, float]:
    """CPU seconds of every process of the server, by role."""
    import psutil

    roles = {pid: f"stage{stage}" for stage, pid in server.stage_pids().items()}
    root = psutil.Process(server.process.pid)
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        role = "api" if proc.pid == root.pid else roles.get(proc.pid) or roles.get(proc.ppid()) or "other"
        out[role] = out.get(role, 0.0) + times.user + times.system
    return out


def logged_batches(log: Path) -> dict[int, dict[int, int]]:
    """The last cumulative forward counts each stage logged."""
    last: dict[int, dict[int, int]] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = BATCH_LINE.search(line)
        if match:
            last[int(match.group(1))] = {int(k): int(v) for k, v in ast.literal_eval(match.group(2)).items()}
    return last


def trial(server, n: int, args: argparse.Namespace) -> dict:
    stats = Stats()
    t0 = time.monotonic() + CONNECT_S
    spec = {"seed": 7, "sessions": n, "spread": args.spread, "t0": t0, "w0": t0 + args.warmup,
            "w1": t0 + args.warmup + args.window, "end": t0 + args.warmup + args.window + 0.5}
    marks: dict[str, dict] = {}

    async def run() -> None:
        async def mark(at: float, name: str) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            marks[name] = {"cpu": process_cpu(server), "batches": logged_batches(server.log_path)}

        await asyncio.gather(*(one_session(server.ws + "/v1/voicechat", i, spec, stats) for i in range(n)),
                             mark(spec["w0"], "w0"), mark(spec["w1"] + 2.5, "w1"))

    asyncio.run(run())
    if args.trace is not None:
        with args.trace.open("a") as out:
            for row in sorted(stats.trace, key=lambda r: r["at_s"]):
                out.write(json.dumps({"slot_ms": args.slot_now, "audio_lag": args.lag_now, "sessions": n, **row})
                          + "\n")
    window_s = args.window
    cpu = {role: marks["w1"]["cpu"].get(role, 0.0) - marks["w0"]["cpu"].get(role, 0.0) for role in marks["w1"]["cpu"]}
    total_cpu = sum(cpu.values())
    per_position = {role: round(s * 1000.0 / stats.positions, 2) for role, s in cpu.items()} if stats.positions else {}
    batches = {}
    for stage, counts in marks["w1"]["batches"].items():
        before = marks["w0"]["batches"].get(stage, {})
        batches[f"stage{stage}"] = {k: v - before.get(k, 0) for k, v in sorted(counts.items()) if v - before.get(k, 0)}
    return {
        "sessions": n,
        "window_s": window_s,
        "positions": stats.positions,
        "late": stats.late,
        "late_by_second": dict(sorted(stats.late_seconds.items())),
        "over_budget": stats.over_budget,
        "responses": stats.responses,
        "errors": stats.errors[:10],
        "error_count": len(stats.errors),
        "kinds": stats.kinds,
        "step_ms": spread(stats.step_ms),
        "inference_ms": spread(stats.inference_ms),
        "e2e_ms": spread(stats.e2e_ms),
        "committed_ms": spread(stats.committed_ms),
        "response_start_ms": spread(stats.response_start_ms),
        "late_ms": spread(stats.late_ms),
        "held_ms": spread(stats.held_ms),
        "tick_size": dict(sorted(stats.tick_size.items())),
        "stage0_forwards_by_requests": {k: round(v) for k, v in sorted(stats.stage0_batch.items())},
        "stage0_perceptions_by_frames": {k: round(v) for k, v in sorted(stats.perceived_with.items())},
        "logged_forwards_by_requests": batches,
        "server_cpu_cores": round(total_cpu / window_s, 3),
        "cpu_ms_per_session_position": round(total_cpu * 1000.0 / stats.positions, 2) if stats.positions else None,
        "cpu_ms_per_session_position_by_process": per_position,
    }


def derived_deploy(path: Path, slot_ms: float | None, max_sessions: int, root: Path | None = None,
                   audio_lag: int | None = None, settings: list[str] = ()) -> Path:
    import yaml

    from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY

    source = CPU_DEPLOY if root is None else root / "vllm_omni_voicechat/omni/deploy/voicechat-cpu.yaml"
    deploy = yaml.safe_load(source.read_text())
    if slot_ms is not None:
        deploy["voicechat"]["tick_slot_ms"] = slot_ms
    if audio_lag is not None:
        deploy["voicechat"]["audio_lag_positions"] = audio_lag
    for setting in settings:
        key, _, value = setting.partition("=")
        deploy["voicechat"][key] = yaml.safe_load(value)
    # a whole trial in one session: 80 s at up to ~16 positions a second (Stage 0's request: the guard + a prompt;
    # the talker's still fits: 37 + 3 x 2,000 <= the CPU YAML's Stage-1 max_model_len)
    deploy["voicechat"]["max_session_model_frames"] = max(2000, deploy["voicechat"].get("max_session_model_frames", 0))
    stage0 = next(stage for stage in deploy["stages"] if stage["stage_id"] == 0)
    stage0["max_model_len"] = stage0["max_num_batched_tokens"] = max(4096, stage0.get("max_model_len") or 0)
    sessions = max(max_sessions, deploy["duplex_session"]["max_sessions"])
    deploy["duplex_session"]["max_sessions"] = sessions
    deploy["active_stream_window"] = max(sessions, deploy.get("active_stream_window") or 0)
    for stage in deploy["stages"]:
        stage["max_num_seqs"] = max(sessions, stage.get("max_num_seqs") or 1)
    path.write_text(yaml.safe_dump(deploy, sort_keys=False))
    return path


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for series in report["series"]:
        rows = series["trials"]
        xs = [r["sessions"] for r in rows]
        label = f"tick {series['slot_ms']:g} ms" if series["slot_ms"] else "no tick"
        ax1.plot(xs, [r["cpu_ms_per_session_position"] for r in rows], marker="o", label=label)
        ax2.plot(xs, [r["step_ms"]["p99"] for r in rows], marker="o", label=f"{label}: step p99")
        ax2.plot(xs, [r["e2e_ms"]["p50"] for r in rows], marker="x", linestyle="--", label=f"{label}: e2e p50")
    ax1.set_xlabel("concurrent real-time sessions")
    ax1.set_ylabel("server CPU ms per session-position")
    ax1.set_title("CPU per position (all engine processes)")
    ax1.legend()
    ax2.axhline(BUDGET_MS, color="grey", linewidth=0.8)
    ax2.set_xlabel("concurrent real-time sessions")
    ax2.set_ylabel("ms (log)")
    ax2.set_yscale("log")
    ax2.set_title("step p99 and e2e p50 (the 80 ms budget in grey)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--window", type=float, default=60.0, help="measured seconds per trial (default 60)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the window (default 10)")
    parser.add_argument("--slots", type=float, nargs="+", default=[40.0, 0.0],
                        help="tick slots in ms, one engine each (default 40 0; 0 = no batching)")
    parser.add_argument("--audio-lags", type=int, nargs="+", default=[None],
                        help="Stage-2 lags in positions, one engine each per slot (default: the deploy YAML's)")
    parser.add_argument("--spread", action="store_true", help="spread the sessions' phases across one frame")
    parser.add_argument("--server-root", type=Path, help="serve this checkout's code (and its CPU deploy YAML)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment")
    parser.add_argument("--voicechat", action="append", default=[], metavar="KEY=VALUE",
                        help="a voicechat.* setting of the deploy YAML (a YAML value)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_concurrency.json"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: beside --out)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="write every measured position (JSON lines: trial, session, arrival, late, tick)")
    args = parser.parse_args()

    from vllm_omni_voicechat.omni.local_server import engine_available, engine_server
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    reason = engine_available()
    if reason:
        print(f"engine_concurrency: {reason}", file=sys.stderr)
        return 2
    report: dict = {"machine": machine_info(), "timestamp": now_utc(), "late_ms": LATE_MS, "budget_ms": BUDGET_MS,
                    "parameters": {"sessions": args.sessions, "window_s": args.window, "warmup_s": args.warmup,
                                   "slots_ms": args.slots, "audio_lags": args.audio_lags, "spread": args.spread,
                                   "server_root": str(args.server_root) if args.server_root else None,
                                   "env": args.env, "voicechat": args.voicechat}, "series": []}
    extra_env = dict(item.split("=", 1) for item in args.env)
    if args.server_root is not None:
        import os

        extra_env["PYTHONPATH"] = os.pathsep.join([str(args.server_root.resolve()), os.environ.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "tiny")
        for index, (slot, lag) in enumerate((slot, lag) for slot in args.slots for lag in args.audio_lags):
            logs = Path(tmp) / f"{index}-slot{slot:g}-lag{lag}"
            logs.mkdir()
            series: dict = {"slot_ms": slot, "audio_lag": lag, "trials": []}
            deploy = derived_deploy(logs / "deploy.yaml", slot if args.server_root is None else None,
                                    max(args.sessions), args.server_root, lag, args.voicechat)
            args.slot_now, args.lag_now = slot, lag
            with engine_server(checkpoint, logs, deploy=deploy, extra_env=extra_env) as server:
                series["startup_s"] = round(server.started_s, 1)
                for n in args.sessions:
                    result = trial(server, n, args)
                    series["trials"].append(result)
                    print(f"slot {slot:g} ms, lag {lag}, {n} sessions: {result['positions']} positions, "
                          f"late {result['late']}, step p50/p99 {result['step_ms']['p50']}/{result['step_ms']['p99']} "
                          f"ms, inference p50 {result['inference_ms']['p50']} ms, e2e p50/p99 "
                          f"{result['e2e_ms']['p50']}/{result['e2e_ms']['p99']} ms, commit -> committed / first "
                          f"audio p50 {result['committed_ms']['p50']}/{result['response_start_ms']['p50']} ms, "
                          f"{result['cpu_ms_per_session_position']} CPU ms per session-position "
                          f"({result['server_cpu_cores']} cores), stage-0 forwards {result['stage0_forwards_by_requests']}"
                          f", errors {result['error_count']}", flush=True)
                    time.sleep(3)
            series["shutdown_s"] = round(server.stop_s or 0.0, 1)
            report["series"].append(series)

    rows = [("tick", "lag", "sessions", "positions", "late", "over 80", "step p50/p99", "e2e p50/p99", "held p50/max",
             "CPU ms/pos", "api/s0/s1/s2", "stage-0 forwards by requests", "stage 1", "stage 2")]
    for series in report["series"]:
        for r in series["trials"]:
            by = r["cpu_ms_per_session_position_by_process"]
            logged = r["logged_forwards_by_requests"]
            rows.append((f"{series['slot_ms']:g} ms" if series["slot_ms"] else "off", str(series.get("audio_lag")),
                         str(r["sessions"]),
                         str(r["positions"]), str(r["late"]), str(r["over_budget"]),
                         f"{r['step_ms']['p50']}/{r['step_ms']['p99']}", f"{r['e2e_ms']['p50']}/{r['e2e_ms']['p99']}",
                         f"{r['held_ms']['p50']}/{r['held_ms']['max']}", str(r["cpu_ms_per_session_position"]),
                         "/".join(str(by.get(k, "-")) for k in ("api", "stage0", "stage1", "stage2")),
                         str(r["stage0_forwards_by_requests"]), str(logged.get("stage1", {})),
                         str(logged.get("stage2", {}))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    ratios = {}
    for series in report["series"]:
        by_n = {r["sessions"]: r["cpu_ms_per_session_position"] for r in series["trials"]}
        if 1 in by_n and by_n[1]:
            key = f"slot_{series['slot_ms']:g}" + (f"_lag_{series['audio_lag']}" if series.get("audio_lag") else "")
            ratios[key] = {f"{n}_over_1": round(v / by_n[1], 3) for n, v in by_n.items()
                                                     if v is not None and n != 1}
    report["cpu_per_position_ratios"] = ratios
    print("CPU per session-position, N sessions over 1:", json.dumps(ratios))
    out = write_report(report, args.out)
    plot(report, args.plot or out.with_suffix(".png"))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
