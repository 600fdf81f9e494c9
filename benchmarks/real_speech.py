"""What the simulator's real-speech mode costs per 80 ms position (sim/real_speech.py: PocketSphinx hears,
eSpeak NG speaks), against its simulator speech in the same run, and so how many real-speech sessions 2 cores carry.

One session (the session core and the model, stepped synchronously, no sockets) takes spoken turns: a question, the
answer spoken back, a pause; the same script in both modes (eSpeak NG's rendering of the questions in real mode, the
simulator's tone rendering in simulator mode). Measured: the process's CPU time per position (``time.process_time``;
eSpeak NG's own process time counted from its children), the ear's and mouth's share.

    .venv/bin/python benchmarks/real_speech.py              # 8 turns per mode
    .venv/bin/python benchmarks/real_speech.py --turns 2 --out /tmp/real_speech.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, now_utc, write_report

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS, INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, StartTurn
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.sim.real_speech import check_available, espeak

QUESTIONS = ["hello there how are you doing", "what is the local time", "please tell me a short story about a cat",
             "thank you very much"]


def cpu_s() -> float:
    children = os.times()
    return time.process_time() + children.children_user + children.children_system


def one_mode(real: bool, turns: int) -> dict:
    model = SimulatorModel(real_speech=real)
    steps_ms: list[float] = []
    step = model.step

    def timed(position):  # the model's own share: the ear on every position, the mouth when a reply starts
        before = cpu_s()
        result = step(position)
        steps_ms.append((cpu_s() - before) * 1e3)
        return result

    model.step = timed
    core = SessionCore(SessionConfig(session_id="S", settlement_blank_frames=10))
    driver = SyncDriver(core, model, step_seconds=FRAME_SECONDS)
    driver.send(Configure(SessionPrompt("Be brief.", ())))
    driver.run()
    audio = {q: (espeak(q, 16_000).tobytes() if real else render_speech(q)) + bytes(4 * INPUT_FRAME_BYTES)
             for q in QUESTIONS}
    start_positions, start_cpu, start_wall = driver.positions, cpu_s(), time.perf_counter()
    for k in range(1, turns + 1):
        question = QUESTIONS[(k - 1) % len(QUESTIONS)]
        driver.send(StartTurn(k, f"s{k}"))
        driver.send(AppendAudio(audio[question]))
        driver.send(CommitTurn(k, f"c{k}"))
        driver.run()
    positions = driver.positions - start_positions
    model_ms = np.asarray(steps_ms[-positions:])
    cpu = cpu_s() - start_cpu
    return {"mode": "real" if real else "simulator", "turns": turns, "positions": positions,
            "cpu_ms_per_position": round(cpu / positions * 1e3, 3),
            "wall_ms_per_position": round((time.perf_counter() - start_wall) / positions * 1e3, 3),
            "model_step_ms": {"mean": round(float(model_ms.mean()), 3),
                              "p50": round(float(np.percentile(model_ms, 50)), 3),
                              "p99": round(float(np.percentile(model_ms, 99)), 3),
                              "max": round(float(model_ms.max()), 3)},
            "sessions_per_2_cores": round(2 * FRAME_SECONDS / (cpu / positions), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "real_speech.json")
    args = parser.parse_args()
    check_available()
    rows = [one_mode(False, args.turns), one_mode(True, args.turns)]
    sim, real = rows
    report = {"benchmark": "real_speech", "timestamp": now_utc(), "parameters": {"turns": args.turns}, "rows": rows,
              "ratio_real_to_simulator": round(real["cpu_ms_per_position"] / sim["cpu_ms_per_position"], 1)}
    for r in rows:
        print(f"{r['mode']:>9}: {r['positions']} positions, CPU {r['cpu_ms_per_position']:.2f} ms a position "
              f"(wall {r['wall_ms_per_position']:.2f}); model step p50 / p99 / max {r['model_step_ms']['p50']:.2f} / "
              f"{r['model_step_ms']['p99']:.2f} / {r['model_step_ms']['max']:.2f} ms; real-time sessions on 2 "
              f"cores (the session and model, no sockets): {r['sessions_per_2_cores']:g}")
    print(f"real speech costs {report['ratio_real_to_simulator']:g}x the simulator speech's CPU a position")
    print(f"wrote {write_report(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
