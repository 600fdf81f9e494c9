"""Verify our Stage-0 thinker on a GPU with the real checkpoint: RNNT weights, a live turn, a tool call, the
per-position budget. Not run in CI (it needs the 11 B checkpoint and a GPU); docs/thinker.md shows the expected
output.

    python examples/gpu_verify_thinker.py --model /models/NVIDIA-NemotronLabs-VoiceChat-11B \\
        --wav question.wav --tool-wav what_time.wav --serve

Steps (each prints PASS/FAIL; the JSON report goes to ``--out``):

1. ``checkpoint``: ``vllm-omni-voicechat verify-checkpoint``'s report (``omni/checkpoint_report.py``; safetensors
   headers only, no weights read): per stage the tensors consumed, every missing or unexpected tensor with its
   shape, the RNNT decoder + joint tensors our loader maps (``omni/thinker/checkpoint.py:local_rnnt_name``) and the
   ``rnnt_tokenizer/`` vocabulary. Any problem fails the step.
2. ``self_test`` (a local ``--model`` folder, unless ``--skip-self-test``): the start-up self-test. In a child
   process (its GPU memory is freed before serving) Stage 0 is built and loaded the way a stage worker does it,
   then ``--self-test-wav`` (default ``--wav``: known speech) goes through perception + RNNT one 80 ms position at
   a time; the transcript must not be empty (all-blank RNNT output means the RNNT weights or the frame it reads
   are wrong even though the load passed).
3. ``serve`` (with ``--serve``): ``vllm-omni serve MODEL --omni --deploy-config deploy/voicechat.yaml`` (Stage 0
   on ``VoiceChatRealtimeThinkerForConditionalGeneration``), waiting for ``/health``. Without ``--serve`` the
   server at ``--url`` is used.
4. ``live_turn``: one v3 microphone turn from ``--wav`` (16 kHz mono or anything ``read_wav`` takes), streamed in
   real time: the RNNT transcript is not empty, the commit settles to the fence and the response completes with
   text and audio.
5. ``tool_turn``: a session offering ``get_time``; the ``--tool-wav`` question ("What time is it?") must make the
   model call it; the client answers ``{"time": "12:34"}``; the response completes (whether it says 12:34 is
   reported, not required: the model decides).
6. ``budget``: every ``voicechat.metrics`` position of both sessions: ``server_step_ms`` p50/p95/max against the
   80 ms budget (PASS when p95 <= 80) and ``inference_ms`` (submit to Stage-0 token).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni_voicechat.audio.wav import load_wav_16k
from vllm_omni_voicechat.client import V3Client
from vllm_omni_voicechat.omni.checkpoint_report import verify_checkpoint

REPO = Path(__file__).resolve().parents[1]
GET_TIME = {"type": "function", "function": {"name": "get_time", "description": "The current local time.",
                                            "parameters": {"type": "object", "properties": {}}}}
TOOL_RESULT = {"time": "12:34"}
FRAME_IN = 1280  # 16 kHz samples per 80 ms position
TAIL_POSITIONS = 6  # 480 ms of silence after the speech: the RNNT's last word settles
SELF_TEST_MARK = "SELF_TEST_JSON "


def report(results: dict[str, Any], name: str, ok: bool, **facts: Any) -> bool:
    results[name] = {"ok": ok, **facts}
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
    return ok


def check_checkpoint(model: str, results: dict[str, Any]) -> bool:
    folder = Path(model)
    if not folder.is_dir():
        return report(results, "checkpoint", True, skipped="--model is not a local folder")
    r = verify_checkpoint(folder)
    missing = {n: shape for stage in r.stages.values() for n, shape in stage.missing.items()}
    return report(results, "checkpoint", r.ok, tensors=r.tensors,
                  consumed={k: len(v.consumed) for k, v in r.stages.items()}, missing=missing,
                  unexpected=r.unexpected, mismatched=r.mismatched, rnnt_mapped=len(r.rnnt),
                  shapes={k: v["shape"] for k, v in r.rnnt.items()}, vocabulary=r.vocabulary["files"])


# ---- the start-up self-test: known speech through perception + RNNT -----------------------------------------------


def speech_positions(pcm16: bytes, tail: int = TAIL_POSITIONS) -> list[dict[str, Any]]:
    """16 kHz mono PCM16 as the thinker's per-position duplex inputs (pcm_f32le, the last frame zero-padded), then
    ``tail`` silent positions."""
    samples = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    count = -(-samples.size // FRAME_IN) + tail
    frames = np.zeros(count * FRAME_IN, dtype="<f4")
    frames[: samples.size] = samples
    return [{"source_input_seq": i + 1,
             "payload": {"format": "pcm_f32le", "sample_rate_hz": 16000,
                         "audio": base64.b64encode(frames[i * FRAME_IN:(i + 1) * FRAME_IN].tobytes()).decode()}}
            for i in range(count)]


def rnnt_transcript(model: Any, stream: Any, positions: list[dict[str, Any]], device: Any) -> dict[str, Any]:
    """Each position through the thinker's streaming perception and its RNNT (``stream``: an ``RnntStream``)."""
    session: dict[str, Any] = {}
    text, tokens, blanks = "", 0, 0
    for duplex in positions:
        model._duplex_stable_frame(session, duplex, device)
        evidence, emitted = stream.step(model._rnnt_frame(session))
        text += evidence.text_delta
        tokens += len(emitted)
        blanks += bool(evidence.blank)
    return {"transcript": text, "positions": len(positions), "tokens": tokens, "blank_positions": blanks}


def judge_self_test(result: dict[str, Any]) -> bool:
    return result.get("error") is None and bool(result.get("transcript", "").strip()) and result["tokens"] > 0


def load_thinker(model: str) -> tuple[Any, Any]:
    """Stage 0 as a stage worker builds it (the deploy YAML's architecture, dtypes and text tokenizer; a short
    max_model_len), on the platform's device."""
    import socket

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_omni.engine.arg_utils import OmniEngineArgs

    from vllm_omni_voicechat.omni.thinker import ARCHITECTURE, register_architecture

    import yaml

    register_architecture()
    stage0 = next(st for st in yaml.safe_load((REPO / "deploy" / "voicechat.yaml").read_text())["stages"]
                  if st["stage_id"] == 0)
    args = OmniEngineArgs(model=model, model_arch=ARCHITECTURE, model_stage="thinker", stage_id=0,
                          dtype="bfloat16", mamba_ssm_cache_dtype="float32", max_model_len=2048, max_num_seqs=1,
                          enforce_eager=True, enable_prefix_caching=False, worker_cls="auto",
                          tokenizer=stage0["tokenizer"])
    vllm_config = args.create_engine_config()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="nccl")
        ensure_model_parallel_initialized(1, 1)
        thinker = get_model_loader(vllm_config.load_config).load_model(vllm_config=vllm_config,
                                                                        model_config=vllm_config.model_config)
    return thinker.eval(), torch.device(vllm_config.device_config.device)


def self_test_child(model: str, wav: str) -> int:
    try:
        from vllm_omni_voicechat.omni.thinker.rnnt import RnntStream

        thinker, device = load_thinker(model)
        stream = RnntStream(thinker.rnnt, thinker._vocabulary())
        result: dict[str, Any] = rnnt_transcript(thinker, stream, speech_positions(load_wav_16k(wav)), device)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as the step's failure
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(SELF_TEST_MARK + json.dumps(result), flush=True)
    return 0


def parse_self_test(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith(SELF_TEST_MARK)]
    if not lines:
        return {"error": "the self-test process printed no result"}
    return json.loads(lines[-1][len(SELF_TEST_MARK):])


def check_self_test(model: str, wav: str, results: dict[str, Any], *, skip: bool, timeout_s: float) -> bool:
    if skip or not Path(model).is_dir():
        why = "--skip-self-test" if skip else "--model is not a local folder"
        return report(results, "self_test", True, skipped=why)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--self-test-child", "--model", model, "--wav", wav,
           "--tool-wav", wav]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")})
    result = parse_self_test(done.stdout)
    if "error" in result:
        result["stderr_tail"] = done.stderr[-2000:]
    return report(results, "self_test", judge_self_test(result), **result)


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
    p.add_argument("--self-test-wav", default=None, help="known speech for the self-test (default: --wav)")
    p.add_argument("--skip-self-test", action="store_true")
    p.add_argument("--self-test-timeout", type=float, default=1800.0)
    p.add_argument("--self-test-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.self_test_child:
        return self_test_child(args.model, args.wav)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    ok = check_checkpoint(args.model, results)
    if ok:  # a checkpoint with missing or unexpected tensors would only fail (or mislead) the load
        ok &= check_self_test(args.model, args.self_test_wav or args.wav, results, skip=args.skip_self_test,
                              timeout_s=args.self_test_timeout)
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
