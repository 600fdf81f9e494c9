"""The "second session waits for the first" stall, reproduced: short overlapping sessions on a real engine on CPU that
has already served others, pair after pair, measuring how long the second session waits for its first position.

Each pair: session A connects and starts a burst-fed turn (speech, commit, its response); while A's positions run,
session B connects and does the same (the server's own time for that first position, ``server_step_ms``, is kept
too). A session's first position is its turn start -> its first position's metrics arriving at the client (the
receive loop's stamp; a lone session's takes ~20 ms here). When its ``committed`` ack came is kept beside it
(``burst_committed_s``): the ack follows the burst's last position and its settlement, so it measures how fast the
engine works through a whole burst (two bursts at once share the engine), not a wait; until 2026-12-06 it was taken
for the first position (the wait for the first metrics returned only after the commit). B's wait for A is B's first
position less a lone session's (the median of the warm-up sessions, served one at a time before the pairs). The
client's own event loop lag is measured beside it (a 10 ms ticker), and the kernel's log is read for stall reports
(workqueue lockups, starved RCU kthreads) when it can be read. A server that is on time answers B as fast as a lone
session, whatever A does.

    .engine-venv/bin/python benchmarks/engine_stall.py [--pairs 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, now_utc, write_report  # noqa: E402

WAIT_BOUND_S = 0.3


def speech() -> bytes:
    from vllm_omni_voicechat.audio.speech import render_speech

    return bytes(2560) * 2 + render_speech("what time is it") + bytes(2560) * 4


async def one_turn(url: str, name: str, started: asyncio.Event | None = None) -> dict:
    from vllm_omni_voicechat.client.talk import TimedV3Client

    loop = asyncio.get_running_loop()
    async with await TimedV3Client.connect(url + "/v1/voicechat") as c:
        await c.configure(f"Stall probe {name}.")
        turn = await c.start_turn(1)
        sent = loop.time()
        if started is not None:
            started.set()
        await c.send_audio(speech(), paced=False)
        await c.commit(1)
        committed = loop.time() - sent
        first = await c.wait_for(lambda e: e["type"] == "voicechat.metrics" and e.get("frame") is not None,
                                 timeout=120)
        # When the first position's metrics arrived (stamped by the receive loop), not when this wait returned:
        # the wait returns after the commit, i.e. after the whole burst.
        waited = c.arrivals[next(i for i, e in enumerate(c.events) if e is first)] - sent
        response = await c.response_for(turn, timeout=120)
        await c.response_done(response.response_id, timeout=120)
        await c.stop()
        model = (first.get("turn_state") or {}).get("model") or {}
        return {"first_position_s": round(waited, 3), "burst_committed_s": round(committed, 3),
                "first_step_ms": first["server_step_ms"],
                "first_held_ms": model.get("held_ms"), "first_stage0_batch": model.get("stage0_batch"),
                "errors": [e["error"]["code"] for e in c.errors]}


async def pair(url: str) -> dict:
    lag = {"max_s": 0.0}

    async def ticker():
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            lag["max_s"] = max(lag["max_s"], time.monotonic() - t - 0.01)

    tick = asyncio.create_task(ticker())
    a_started = asyncio.Event()
    a = asyncio.create_task(one_turn(url, "A", started=a_started))
    await a_started.wait()
    await asyncio.sleep(0.2)  # A's positions are running
    b = await one_turn(url, "B")
    a = await a
    tick.cancel()
    return {"a": a, "b": b, "client_loop_lag_max_s": round(lag["max_s"], 3)}


def kernel_stall_reports() -> int | None:
    """Stall reports in the kernel's log (None when it cannot be read)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    keys = ("workqueue lockup", "rcu_preempt kthread starved", "stalled CPU-bound worker", "hung_task")
    return sum(any(k in line for k in keys) for line in out.stdout.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--warm-sessions", type=int, default=5,
                        help="lone sessions served before the pairs, the baseline (default 5)")
    parser.add_argument("--tick-slot-ms", type=float, default=None, help="override the CPU YAML's engine tick slot")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_stall.json"))
    args = parser.parse_args()

    from vllm_omni_voicechat.omni.local_server import engine_available, engine_server
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    reason = engine_available()
    if reason:
        print(f"engine_stall: {reason}", file=sys.stderr)
        return 2
    kernel_before = kernel_stall_reports()
    report: dict = {"machine": machine_info(), "timestamp": now_utc(), "bound_s": WAIT_BOUND_S, "pairs": []}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "tiny")
        kw = {}
        if args.tick_slot_ms is not None:
            import yaml

            from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY

            deploy = yaml.safe_load(CPU_DEPLOY.read_text())
            deploy["voicechat"]["tick_slot_ms"] = args.tick_slot_ms
            kw["deploy"] = Path(tmp) / "deploy.yaml"
            kw["deploy"].write_text(yaml.safe_dump(deploy, sort_keys=False))
        report["tick_slot_ms"] = args.tick_slot_ms
        with engine_server(checkpoint, Path(tmp), **kw) as server:
            report["startup_s"] = round(server.started_s, 1)
            lone = [asyncio.run(one_turn(server.ws, f"warm {i}")) for i in range(args.warm_sessions)]
            alone = [r["first_position_s"] for r in lone]
            baseline = sorted(alone)[len(alone) // 2]
            report["lone_first_position_s"] = {"each": alone, "median": baseline,
                                               "first_step_ms": [r["first_step_ms"] for r in lone]}
            print(f"a lone session's first position: {alone} s (median {baseline})", flush=True)
            for i in range(args.pairs):
                result = asyncio.run(pair(server.ws))
                result["b_waited_for_a_s"] = round(max(0.0, result["b"]["first_position_s"] - baseline), 3)
                report["pairs"].append(result)
                print(f"pair {i + 1}: B's first position {result['b']['first_position_s']} s, "
                      f"{result['b_waited_for_a_s']} s more than alone (A {result['a']['first_position_s']} s), "
                      f"client loop lag max {result['client_loop_lag_max_s']} s", flush=True)
    kernel_after = kernel_stall_reports()
    waits = [p["b_waited_for_a_s"] for p in report["pairs"]]
    report["summary"] = {
        "pairs": len(waits), "second_session_wait_max_s": max(waits), "over_bound": sum(w > WAIT_BOUND_S for w in waits),
        "second_session_first_position_max_s": max(p["b"]["first_position_s"] for p in report["pairs"]),
        "second_session_burst_committed_max_s": max(p["b"]["burst_committed_s"] for p in report["pairs"]),
        "lone_burst_committed_s": [r["burst_committed_s"] for r in lone],
        "second_session_first_step_ms_max": max(p["b"]["first_step_ms"] for p in report["pairs"]),
        "errors": sum(len(p["a"]["errors"]) + len(p["b"]["errors"]) for p in report["pairs"]),
        "client_loop_lag_max_s": max(p["client_loop_lag_max_s"] for p in report["pairs"]),
        "kernel_stall_reports": None if kernel_before is None or kernel_after is None else kernel_after - kernel_before,
    }
    print(report["summary"])
    print(f"report: {write_report(report, args.out)}")
    return 0 if report["summary"]["over_bound"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
