"""What open sessions cost the real engine on CPU while nobody speaks: N v3 sessions each run one spoken turn to its
``response.done`` and then stay open and silent; over a ``--window`` the server's CPU is read by process and by
thread (``vllm-omni serve``, the tiny checkpoint, deploy/voicechat-cpu.yaml).

Idle open sessions are where waiting loops show: the model does no work, so whatever the stages spend is polling.
``--connectors`` serves the engine once per chunk connector named (default: ours, then vLLM-Omni's
``SharedMemoryConnector``), in alternating order with ``--rounds``, everything else as deployed. Run in the engine
venv (scripts/install_omni_cpu.sh VENV --engine):

    .engine-venv/bin/python benchmarks/engine_idle.py [--sessions 4] [--window 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, now_utc, session_update, speech_frames, v3_append, write_report  # noqa: E402

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS  # noqa: E402

TURN_TIMEOUT_S = 120.0


def cpu_by_thread(server) -> dict[str, dict[int, float]]:
    """CPU seconds of every thread of every server process, by role (api, stage0..2)."""
    import psutil

    roles = {pid: f"stage{stage}" for stage, pid in server.stage_pids().items()}
    root = psutil.Process(server.process.pid)
    out: dict[str, dict[int, float]] = {}
    for proc in [root, *root.children(recursive=True)]:
        role = "api" if proc.pid == root.pid else roles.get(proc.pid) or "other"
        try:
            threads = proc.threads()
        except psutil.NoSuchProcess:
            continue
        out.setdefault(role, {}).update({t.id: t.user_time + t.system_time for t in threads})
    return out


async def one_turn_then_idle(url: str, index: int, turned: asyncio.Event, count: list[int], n: int,
                             release: asyncio.Event) -> None:
    import websockets

    async with websockets.connect(url, max_size=None, ping_interval=None, open_timeout=60) as ws:
        await ws.recv()
        await ws.send(session_update("v3", f"Be brief (session {index})."))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        await ws.send(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": f"s{index}",
                                  "client_turn_id": 1}))
        for frame in speech_frames("hello there"):
            await ws.send(v3_append(frame))
            await asyncio.sleep(FRAME_SECONDS)  # real-time pacing
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"c{index}", "client_turn_id": 1}))
        while json.loads(await ws.recv())["type"] != "response.done":
            pass
        count.append(index)
        if len(count) == n:
            turned.set()
        await release.wait()  # open and silent until the window is read


def trial(checkpoint: Path, logs: Path, connector: str | None, args: argparse.Namespace) -> dict:
    import yaml

    from engine_concurrency import derived_deploy
    from vllm_omni_voicechat.omni.local_server import engine_server

    logs.mkdir(parents=True)
    deploy = derived_deploy(logs / "deploy.yaml", None, args.sessions)
    if connector is not None:
        data = yaml.safe_load(deploy.read_text())
        for spec in data["connectors"].values():
            spec["name"] = connector
        deploy.write_text(yaml.safe_dump(data, sort_keys=False))
    named = {spec["name"] for spec in yaml.safe_load(deploy.read_text())["connectors"].values()}
    with engine_server(checkpoint, logs, deploy=deploy) as server:
        async def run() -> dict:
            turned, release, count = asyncio.Event(), asyncio.Event(), []
            sessions = [asyncio.create_task(one_turn_then_idle(server.ws + "/v1/voicechat", i, turned, count,
                                                               args.sessions, release))
                        for i in range(args.sessions)]
            await asyncio.wait_for(turned.wait(), TURN_TIMEOUT_S)
            await asyncio.sleep(2.0)  # the last response's tail
            before, t0 = cpu_by_thread(server), time.monotonic()
            await asyncio.sleep(args.window)
            after, elapsed = cpu_by_thread(server), time.monotonic() - t0
            release.set()
            await asyncio.gather(*sessions, return_exceptions=True)
            return {"before": before, "after": after, "elapsed": elapsed}

        marks = asyncio.run(run())
    cores: dict[str, float] = {}
    busiest: dict[str, list[float]] = {}
    for role, threads in marks["after"].items():
        deltas = sorted(((cpu - marks["before"].get(role, {}).get(tid, 0.0)) / marks["elapsed"]
                         for tid, cpu in threads.items()), reverse=True)
        cores[role] = round(sum(deltas), 4)
        busiest[role] = [round(d, 4) for d in deltas[:3]]
    return {"connector": sorted(named), "sessions": args.sessions, "window_s": round(marks["elapsed"], 2),
            "cores": cores, "cores_total": round(sum(cores.values()), 4), "busiest_threads_cores": busiest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0, help="measured idle seconds (default 20)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the connectors in alternating order")
    parser.add_argument("--connectors", nargs="+", default=["deployed", "SharedMemoryConnector"],
                        help="chunk connectors to serve with ('deployed': the deploy YAML's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_idle.json"))
    args = parser.parse_args()

    from vllm_omni_voicechat.omni.local_server import engine_available
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    reason = engine_available()
    if reason:
        print(f"engine_idle: {reason}", file=sys.stderr)
        return 2
    report: dict = {"machine": machine_info(), "timestamp": now_utc(),
                    "parameters": {"sessions": args.sessions, "window_s": args.window, "rounds": args.rounds,
                                   "connectors": args.connectors}, "trials": []}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "tiny")
        for round_ in range(args.rounds):
            for name in args.connectors:
                result = trial(checkpoint, Path(tmp) / f"{round_}-{name}", None if name == "deployed" else name, args)
                report["trials"].append(result)
                print(f"{'/'.join(result['connector'])}: {args.sessions} idle sessions, server "
                      f"{result['cores_total']} cores ({json.dumps(result['cores'])}), busiest threads "
                      f"{json.dumps(result['busiest_threads_cores'])}", flush=True)
    out = write_report(report, args.out)
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
