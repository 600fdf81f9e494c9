"""Per-position latency of the real engine on CPU next to the simulator: what one 80 ms position costs
through ``vllm-omni serve`` (vLLM's CPU build, vLLM-Omni's three Nemotron VoiceChat stages, our plugin and thinker)
on the tiny checkpoint, at 1 and 2 concurrent sessions, and the same workload on the standalone simulator server.

Every session is a v3 client over a real WebSocket streaming real-time paced 80 ms appends: a few user turns of
simulator speech, each committed and answered. Per position (from the server's ``voicechat.metrics``):

* ``stage0_ms``: the append submitted -> the Stage-0 output (token + our thinker's evidence) back (``inference_ms``);
* ``packet_delay_ms``: Stage-0 output -> the position's Stage-2 audio packet (``server_step_ms - inference_ms``);
* ``server_step_ms``: the whole position on the server;
* ``e2e_ms`` (real frames only): the client wrote the append -> the client received that position's metrics
  (socket, framing, both event loops, the engine; the client and server share this machine's clock).

* ``audio_e2e_ms`` (real frames only): the client wrote append k -> the client received position k + L's metrics,
  which carry the audio of position k when the deployment's ``audio_lag_positions`` is L (at L = 0, ``e2e_ms``).

``--audio-lag 0 1`` runs the engine once per lag (a derived deploy YAML each, everything else as deployed): at
lag L a position waits for Stage 0 and for the packet of L positions earlier, so the stages overlap.

Also: server start-up (process start -> our ``/health`` ready, three stages loaded and warmed), positions over the
80 ms budget. Run in the engine venv (scripts/install_omni_cpu.sh VENV --engine):

    .engine-venv/bin/python benchmarks/engine_positions.py [--turns 3] [--audio-lag 0 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, now_utc, write_report  # noqa: E402

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES  # noqa: E402

BUDGET_MS = 80.0


def summarize(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)

    return {"count": len(values), "mean": round(statistics.fmean(values), 2), "p50": pct(0.5), "p90": pct(0.9),
            "p99": pct(0.99), "max": round(ordered[-1], 2)}


async def one_session(ws_url: str, turns: int, index: int, lag: int = 0) -> dict:
    from vllm_omni_voicechat.audio.speech import render_speech
    from vllm_omni_voicechat.client import V3Client

    loop = asyncio.get_running_loop()
    received_at: dict[int, float] = {}  # transport frame -> when its position's metrics reached the client
    async with await V3Client.connect(ws_url + "/v1/voicechat") as client:

        async def stamp() -> None:
            async for event in client.iter_events():
                if event["type"] == "voicechat.metrics" and event.get("transport_frame") is not None:
                    received_at.setdefault(event["transport_frame"], loop.time())

        stamper = asyncio.create_task(stamp())
        await client.configure(f"You are helpful (session {index}).")
        for turn in range(1, turns + 1):
            turn_id = await client.start_turn(turn)
            audio = bytes(INPUT_FRAME_BYTES * 3) + render_speech("what time is it today") + bytes(INPUT_FRAME_BYTES * 5)
            await client.send_audio(audio, paced=True)
            await client.commit(turn)
            response = await client.response_for(turn_id, timeout=120)
            await client.response_done(response.response_id, timeout=120)
        await client.stop()
        stamper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stamper
        sent_at = [s.at for s in client.sent if s.type == "input_audio_buffer.append"]  # transport frame k = k-th
        metrics = [e for e in client.events if e["type"] == "voicechat.metrics" and e.get("frame") is not None]
        errors = [e for e in client.events if e["type"] == "error"]
    e2e = [(at - sent_at[k]) * 1000 for k, at in received_at.items() if k < len(sent_at)]
    audio_e2e = [(at - sent_at[k - lag]) * 1000 for k, at in received_at.items() if lag <= k < len(sent_at)]
    return {"metrics": metrics, "e2e_ms": e2e, "audio_e2e_ms": audio_e2e, "errors": errors}


async def run_sessions(ws_url: str, sessions: int, turns: int, lag: int = 0) -> dict:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_session(ws_url, turns, i, lag) for i in range(sessions)))
    metrics = [m for r in results for m in r["metrics"]]
    slowest = max(((m["server_step_ms"], i, m["frame"]) for i, r in enumerate(results) for m in r["metrics"]),
                  default=None)
    stage0 = [m["inference_ms"] for m in metrics]
    step = [m["server_step_ms"] for m in metrics]
    return {
        "sessions": sessions,
        "wall_s": round(time.perf_counter() - t0, 2),
        "positions": len(metrics),
        "errors": [e["error"]["code"] for r in results for e in r["errors"]],
        "over_budget": sum(s > BUDGET_MS for s in step),
        "slowest": None if slowest is None else {"server_step_ms": slowest[0], "session": slowest[1],
                                                 "frame": slowest[2]},
        "stage0_ms": summarize(stage0),
        "packet_delay_ms": summarize([s - i for s, i in zip(step, stage0)]),
        "server_step_ms": summarize(step),
        "e2e_ms": summarize([x for r in results for x in r["e2e_ms"]]),
        "audio_e2e_ms": summarize([x for r in results for x in r["audio_e2e_ms"]]),
    }


def lag_deploy(path: Path, lag: int) -> Path:
    """The packaged CPU deploy YAML with ``voicechat.audio_lag_positions: lag``."""
    import yaml

    from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY

    deploy = yaml.safe_load(CPU_DEPLOY.read_text())
    deploy["voicechat"]["audio_lag_positions"] = lag
    path.write_text(yaml.safe_dump(deploy, sort_keys=False))
    return path


@contextlib.contextmanager
def simulator_server():
    from vllm_omni_voicechat.server import ServerConfig
    from vllm_omni_voicechat.server.inprocess import InProcessServer

    with InProcessServer(ServerConfig.simulator(max_sessions=4)) as server:
        yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3, help="user turns per session (default 3)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2], help="concurrent sessions (default 1 2)")
    parser.add_argument("--audio-lag", type=int, nargs="+", default=[0],
                        help="audio_lag_positions values to run the engine with (default 0)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_positions.json"))
    args = parser.parse_args()

    from vllm_omni_voicechat.omni.local_server import engine_available, engine_server
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    reason = engine_available()
    if reason:
        print(f"engine_positions: {reason}", file=sys.stderr)
        return 2
    report: dict = {"machine": machine_info(), "timestamp": now_utc(), "budget_ms": BUDGET_MS,
                    "parameters": {"turns": args.turns, "sessions": args.sessions, "audio_lag": args.audio_lag},
                    "simulator": {}}
    homes = [("engine" if lag == 0 else f"engine_lag{lag}", lag) for lag in args.audio_lag]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "tiny")
        for home, lag in homes:
            logs = Path(tmp) / home
            logs.mkdir()
            report[home] = {"audio_lag": lag}
            with engine_server(checkpoint, logs, deploy=lag_deploy(logs / "deploy.yaml", lag)) as server:
                report[home]["startup_s"] = round(server.started_s, 1)
                report[home]["warmup"] = server.health.get("warmup")
                for n in args.sessions:
                    report[home][f"sessions_{n}"] = asyncio.run(run_sessions(server.ws, n, args.turns, lag))
            report[home]["shutdown_s"] = round(server.stop_s or 0.0, 1)
    with simulator_server() as url:
        for n in args.sessions:
            report["simulator"][f"sessions_{n}"] = asyncio.run(run_sessions(url, n, args.turns))

    rows = [("series", "sessions", "positions", "stage0 p50/p99", "packet p50/p99", "step p50/p99", "e2e p50/p99",
             "audio e2e p50/p99", "over 80 ms", "errors")]
    for home in [h for h, _ in homes] + ["simulator"]:
        for n in args.sessions:
            r = report[home][f"sessions_{n}"]

            def pp(key: str) -> str:
                s = r[key]
                return f"{s.get('p50', '-')}/{s.get('p99', '-')}"

            rows.append((home, str(n), str(r["positions"]), pp("stage0_ms"), pp("packet_delay_ms"),
                         pp("server_step_ms"), pp("e2e_ms"), pp("audio_e2e_ms"), str(r["over_budget"]),
                         str(len(r["errors"]))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    first = homes[0][0]
    e1 = report[first]["sessions_1"]["server_step_ms"].get("p50") if 1 in args.sessions else None
    s1 = report["simulator"]["sessions_1"]["server_step_ms"].get("p50") if 1 in args.sessions else None
    if e1 and s1:
        report["ratios"] = {"engine_over_simulator_step_p50": round(e1 / s1, 1),
                            "engine_step_p50_over_budget": round(e1 / BUDGET_MS, 2)}
        print(f"{first} step p50 = {report['ratios']['engine_over_simulator_step_p50']}x the simulator's, "
              f"{report['ratios']['engine_step_p50_over_budget']}x the 80 ms budget")
        for home, lag in homes[1:]:
            step = report[home]["sessions_1"]["server_step_ms"].get("p50")
            if step:
                report["ratios"][f"{home}_step_p50_over_{first}"] = round(step / e1, 2)
                print(f"{home} step p50 = {round(step / e1, 2)}x {first}'s")
    for home, _ in homes:
        print(f"{home} start-up {report[home]['startup_s']} s, shutdown {report[home]['shutdown_s']} s")
    print(f"report: {write_report(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
