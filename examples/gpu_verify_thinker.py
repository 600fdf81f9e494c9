"""Verify our Stage-0 thinker on a GPU with the real checkpoint: RNNT weights, a live turn, a tool call, the
per-position budget. Not run in CI (it needs the 11 B checkpoint and a GPU); docs/thinker.md shows the expected
output.

    python examples/gpu_verify_thinker.py --model /models/NVIDIA-NemotronLabs-VoiceChat-11B \\
        --wav question.wav --tool-wav what_time.wav --serve

Steps (each prints PASS/FAIL; the JSON report goes to ``--out``):

1. ``checkpoint``: the checkpoint's safetensors headers (no weights read) hold the RNNT decoder + joint tensors our
   loader maps (``omni/thinker/rnnt.py:local_rnnt_name``) and the ``rnnt_tokenizer/`` vocabulary.
2. ``serve`` (with ``--serve``): ``vllm-omni serve MODEL --omni --deploy-config deploy/voicechat.yaml`` (Stage 0
   on ``VoiceChatRealtimeThinkerForConditionalGeneration``), waiting for ``/health``. Without ``--serve`` the
   server at ``--url`` is used.
3. ``live_turn``: one v3 microphone turn from ``--wav`` (16 kHz mono or anything ``read_wav`` takes), streamed in
   real time: the RNNT transcript is not empty, the commit settles to the fence and the response completes with
   text and audio.
4. ``tool_turn``: a session offering ``get_time``; the ``--tool-wav`` question ("What time is it?") must make the
   model call it; the client answers ``{"time": "12:34"}``; the response completes (whether it says 12:34 is
   reported, not required: the model decides).
5. ``budget``: every ``voicechat.metrics`` position of both sessions: ``server_step_ms`` p50/p95/max against the
   80 ms budget (PASS when p95 <= 80) and ``inference_ms`` (submit to Stage-0 token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni_voicechat.audio.wav import load_wav_16k
from vllm_omni_voicechat.client import V3Client
from vllm_omni_voicechat.omni.thinker.checkpoint import local_rnnt_name

REPO = Path(__file__).resolve().parents[1]
GET_TIME = {"type": "function", "function": {"name": "get_time", "description": "The current local time.",
                                            "parameters": {"type": "object", "properties": {}}}}
TOOL_RESULT = {"time": "12:34"}
RNNT_GROUPS = ("embed.", "lstm.", "enc.", "pred.", "out.")


def report(results: dict[str, Any], name: str, ok: bool, **facts: Any) -> bool:
    results[name] = {"ok": ok, **facts}
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
    return ok


def safetensors_names(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from every safetensors header (8-byte length + JSON; no weights are read)."""
    names: dict[str, list[int]] = {}
    for path in sorted(folder.rglob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        names.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return names


def check_checkpoint(model: str, results: dict[str, Any]) -> bool:
    folder = Path(model)
    if not folder.is_dir():
        return report(results, "checkpoint", True, skipped="--model is not a local folder")
    names = safetensors_names(folder)
    mapped = {local: (name, names[name]) for name in names if (local := local_rnnt_name(name)) is not None}
    rnntish = sorted(n for n in names if "rnnt" in n.lower() and local_rnnt_name(n) is None)
    vocab = sorted(p.name for p in (folder / "rnnt_tokenizer").glob("*")) if (folder / "rnnt_tokenizer").is_dir() else []
    groups = {g: any(k.startswith(g) for k in mapped) for g in RNNT_GROUPS}
    shapes = {k: v[1] for k, v in sorted(mapped.items())}
    return report(results, "checkpoint", all(groups.values()) and bool(vocab), tensors=len(names),
                  rnnt_mapped=len(mapped), groups=groups, rnnt_unmapped=rnntish[:8], vocabulary=vocab,
                  shapes=shapes)


def serve(model: str, port: int, out: Path, timeout_s: float) -> subprocess.Popen:
    log = (out.parent / "gpu_verify_serve.log").open("w")
    cmd = ["vllm-omni", "serve", model, "--omni", "--port", str(port),
           "--deploy-config", str(REPO / "deploy" / "voicechat.yaml")]
    print("starting:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm-omni serve exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    print("health:", r.read().decode()[:400], flush=True)
                    return proc
        except OSError:
            pass
        time.sleep(2)  # ok: polling a starting server process
    proc.terminate()
    raise SystemExit(f"no /health within {timeout_s:.0f} s; see {log.name}")


async def one_turn(url: str, pcm: bytes, *, tools: bool) -> dict[str, Any]:
    async def get_time(arguments: dict[str, Any]) -> str:
        return json.dumps(TOOL_RESULT)

    async with await V3Client.connect(url, tools={"get_time": get_time} if tools else None) as client:
        await client.configure(instructions="You are a helpful voice assistant. Answer briefly.",
                               tools=[GET_TIME] if tools else None)
        started = time.perf_counter()
        await client.start_turn(1)
        await client.send_audio(pcm + bytes(2560 * 6), paced=True)  # the utterance plus 480 ms of silence
        committed_at = time.perf_counter()
        turn_id = await client.commit(1)
        response = await client.response_for(turn_id)
        await client.response_done(response.response_id, timeout=120.0)
        first_audio = next((e for e in client.events if e["type"] == "response.output_audio.delta"), None)
        runs = list(client.tool_runs.values())
        metrics = [e for e in client.events if e["type"] == "voicechat.metrics"]
        turn = client.turns.get(turn_id)
        return {
            "transcript": turn.transcript if turn else "",
            "text": response.text,
            "status": response.status,
            "reason": response.reason,
            "audio_s": round(len(response.audio) / 2 / 22_050, 2),
            "first_audio": first_audio is not None,
            "turn_s": round(time.perf_counter() - started, 2),
            "commit_to_done_s": round(time.perf_counter() - committed_at, 2),
            "calls": [{"name": r.name, "arguments": r.arguments, "outcome": r.outcome} for r in runs],
            "metrics": [{k: m.get(k) for k in ("frame", "inference_ms", "server_step_ms", "over_budget")}
                        for m in metrics],
        }


def percentile(xs: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs, dtype=np.float64), q)), 2) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (or HF id) of NVIDIA-NemotronLabs-VoiceChat-11B")
    p.add_argument("--wav", required=True, help="a spoken question (any WAV; resampled to 16 kHz mono)")
    p.add_argument("--tool-wav", required=True, help='a spoken "What time is it?"')
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/voicechat")
    p.add_argument("--serve", action="store_true", help="start vllm-omni serve with deploy/voicechat.yaml first")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--serve-timeout", type=float, default=1200.0)
    p.add_argument("--out", default=str(REPO / "out" / "gpu_verify_thinker.json"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    ok = check_checkpoint(args.model, results)
    proc = serve(args.model, args.port, out, args.serve_timeout) if args.serve else None
    url = f"ws://127.0.0.1:{args.port}/v1/voicechat" if args.serve else args.url
    try:
        live = asyncio.run(one_turn(url, load_wav_16k(args.wav), tools=False))
        ok &= report(results, "live_turn", bool(live["transcript"].strip()) and live["status"] == "completed"
                     and bool(live["text"].strip()) and live["audio_s"] > 0,
                     **{k: v for k, v in live.items() if k != "metrics"})
        tool = asyncio.run(one_turn(url, load_wav_16k(args.tool_wav), tools=True))
        called = [c for c in tool["calls"] if c["name"] == "get_time"]
        ok &= report(results, "tool_turn", bool(called) and called[0]["outcome"] == "applied"
                     and tool["status"] == "completed", said_result="12" in tool["text"] and "34" in tool["text"],
                     **{k: v for k, v in tool.items() if k != "metrics"})
        steps = [m for m in live["metrics"] + tool["metrics"] if m["server_step_ms"] is not None]
        server = [float(m["server_step_ms"]) for m in steps]
        infer = [float(m["inference_ms"]) for m in steps if m["inference_ms"] is not None]
        ok &= report(results, "budget", bool(server) and percentile(server, 95) <= 80.0, positions=len(server),
                     server_step_ms_p50=percentile(server, 50), server_step_ms_p95=percentile(server, 95),
                     server_step_ms_max=round(max(server), 2) if server else None,
                     inference_ms_p50=percentile(infer, 50), inference_ms_p95=percentile(infer, 95),
                     over_budget=sum(bool(m["over_budget"]) for m in steps))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"{'ALL PASS' if ok else 'SOME CHECKS FAILED'}; report: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
