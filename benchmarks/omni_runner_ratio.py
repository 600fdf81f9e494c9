#!/usr/bin/env python
"""Our tiered server stack against vLLM-Omni 0.30.0's own duplex session runner: the same workload, the same fake
model cost, in the same run; reported as a ratio of CPU per 80 ms position (model excluded).

Needs ``vllm_omni`` (run it with the omni venv's Python; ``run_all.py`` spawns it there, or skips it with a
message when there is none).

The workload: ``--sessions`` concurrent sessions, each streaming the same fixed microphone script
(``_common.scripted_frames``: pauses, simulator-speech phrases, silence for the reply) as float32 16 kHz 80 ms
appends (the Nemotron preset's input), the wire texts built once beforehand. Every session gets its whole
script at once and each stack runs it as fast as it can on one asyncio loop; the measured figure is process CPU
time (all threads) from the first append to the last position, minus the time of the simulator model
(``SimulatorModel.step`` and its prefill, timed where each stack calls it), divided by the positions run.

* **ours**: per session ``TieredSession`` (model turn policy, as ``server/app.py`` builds it) hosted by the
  asyncio ``SessionShell`` with an inline executor (no thread hop), its sink counting the encoded events. Per
  client text: JSON parse + validation, audio conversion, the session core and runner, the projector, the
  journal (which encodes each event once). The model-owned EOU comes from the core's settlement fence.
* **vLLM-Omni**: per session the real ``DuplexSessionManager`` -> ``DuplexSessionRunner`` (mailbox, append
  tasks, model channel, emitter, Realtime projector) with vLLM-Omni's in-tree ``NemotronVoiceChatDuplexPlugin``
  (its PCM buffer, append planner, Stage-0 decision and data plane; only the checkpoint tokenizer is faked) over
  a fake ``DuplexStagePort`` whose ``submit`` runs the simulator on the append's PCM and hands the Stage-0 token
  and the Stage-2 audio packet back through ``runner.on_stage_output``, as the orchestrator does. Per client
  text: ``json.loads`` + ``RealtimeEnvelope.translate`` (the serving layer's command translation), dispatch,
  and on the way out ``event.to_realtime()`` + one compact ``json.dumps`` (the journal's sizing encode; the
  serving layer encodes a second time to send, which is *not* charged). The simulator decides EOU itself after
  the same blank fence (``legacy_turn_blanks``), because this runner sends the model no turn controls.

Not compared: sockets, the orchestrator thread and its stage pools (vLLM-Omni), uvicorn (ours).

Usage::

    /tmp/omni-venv/bin/python benchmarks/omni_runner_ratio.py             # 1 and 10 sessions x 20 s of audio
    /tmp/omni-venv/bin/python benchmarks/omni_runner_ratio.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import (
    RESULTS,
    AppendCache,
    TimedModel,
    machine_info,
    pyplot,
    scripted_frames,
    session_update,
    write_report,
)

from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.settlement import DEFAULT_FENCE
from vllm_omni_voicechat.shell.aio import SessionShell
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.wire.tiered.connection import TieredOptions, TieredSession
from vllm_omni_voicechat.wire.transport import WireText

DEFAULT_OUT = RESULTS / "omni_runner_ratio.json"
_clock = time.thread_time_ns  # the simulator runs on the loop thread in both stacks
PAD, BOS, EOS = 12, 1, 2


def _close_text() -> str:
    return json.dumps({"type": "session.close"})


class InlineExecutor(concurrent.futures.Executor):
    """Runs the model call in place: no thread hop on either side (vLLM-Omni's fake port is inline too)."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - delivered to the awaiting shell
            future.set_exception(exc)
        return future


# ====================================================================== ours


def _drained(shell: SessionShell) -> bool:
    """Every queued client text handled and every frame run."""
    core = shell.core.core
    return shell.inbox_empty and core.configured and not core.work and core.runner.in_flight is None


async def run_ours(scripts: list[list[str]]) -> dict:
    models: list[TimedModel] = []
    counts = {"events": 0, "bytes": 0, "responses": 0, "audio_deltas": 0}
    executor = InlineExecutor()
    shells = []
    for i, texts in enumerate(scripts):
        core = SessionCore(SessionConfig(session_id=f"duplex-ours-{i}", turn_policy="model", gate_open_after=1))
        protocol = TieredSession(core, TieredOptions(lane="full", model="voicechat", max_sessions=len(scripts)))

        def sink(item: Any) -> None:
            if isinstance(item, WireText):
                counts["events"] += 1
                counts["bytes"] += len(item.text)
                if '"response.done"' in item.text:
                    counts["responses"] += 1
                elif '"response.output_audio.delta"' in item.text:
                    counts["audio_deltas"] += 1

        for item in protocol.start(time.monotonic()):  # as server/app.py does before the shell runs
            sink(item)
        model = TimedModel(SimulatorModel(), _clock)
        models.append(model)
        shell = SessionShell(protocol, model, sink, executor=executor)
        shells.append(shell)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    tasks = [asyncio.ensure_future(s.run()) for s in shells]
    for shell, texts in zip(shells, scripts):
        for text in texts:
            shell.submit(text)
    deadline = time.monotonic() + 600
    while not all(_drained(s) for s in shells):
        if time.monotonic() > deadline or any(s.core.closed for s in shells):
            raise RuntimeError("our sessions did not drain their scripts")
        await asyncio.sleep(0.002)  # benchmark idle wait; the shells run in between
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for shell in shells:
        shell.submit(_close_text())
    await asyncio.gather(*tasks)
    return _result("ours", cpu, wall, sum(m.ns for m in models), sum(m.steps for m in models), counts)


# ====================================================================== vLLM-Omni's runner


def _omni_stack() -> SimpleNamespace:
    """vLLM-Omni's classes (imported late: only this part needs the omni venv)."""
    from vllm.sampling_params import SamplingParams
    from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
    from vllm_omni.engine.duplex.contracts import (
        DuplexOutputContext,
        DuplexRequestIdentity,
        DuplexStagePort,
        DuplexStageSubmissionResult,
    )
    from vllm_omni.engine.duplex.messages import (
        CloseDuplexSessionMessage,
        DuplexSessionCommandMessage,
        OpenDuplexSessionMessage,
    )
    from vllm_omni.engine.duplex.session.manager import DuplexSessionManager
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
    from vllm_omni.entrypoints.duplex.realtime_input import RealtimeEnvelope
    from vllm_omni.entrypoints.duplex_omni import DuplexOmni
    from vllm_omni.model_executor.models.nemotron_voicechat.duplex.plugin import NemotronVoiceChatDuplexPlugin

    return SimpleNamespace(
        SamplingParams=SamplingParams, DuplexSessionRuntimeConfig=DuplexSessionRuntimeConfig,
        DuplexOutputContext=DuplexOutputContext, DuplexRequestIdentity=DuplexRequestIdentity,
        DuplexStagePort=DuplexStagePort, DuplexStageSubmissionResult=DuplexStageSubmissionResult,
        CloseDuplexSessionMessage=CloseDuplexSessionMessage, DuplexSessionCommandMessage=DuplexSessionCommandMessage,
        OpenDuplexSessionMessage=OpenDuplexSessionMessage, DuplexSessionManager=DuplexSessionManager,
        encode_audio=encode_audio, RealtimeEnvelope=RealtimeEnvelope, DuplexOmni=DuplexOmni,
        NemotronVoiceChatDuplexPlugin=NemotronVoiceChatDuplexPlugin)


class FakeTokenizer:
    """The checkpoint tokenizer seam (no weights on this machine)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + (ord(c) % 500) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


SPECIAL_IDS = {"nvc_text_bos_id": BOS, "nvc_text_eos_id": EOS, "nvc_text_pad_id": PAD, "nvc_function_sotc_id": 20,
               "nvc_function_eotc_id": 21, "nvc_function_eotr_id": 22, "nvc_tokenizer_ref": "fake/tokenizer"}


def make_port(o: SimpleNamespace, meter: list[int]):
    class SimulatorStagePort(o.DuplexStagePort):
        """Stage 0 + Stage 2 played by the simulator, one instance per Stage-0 request; outputs come back through
        ``runner.on_stage_output`` on the next loop turn, shaped like the orchestrator's request outputs."""

        def __init__(self) -> None:
            self.manager = None
            self.sims: dict[str, SimulatorModel] = {}
            self.submits = 0
            self.target = 0
            self.done = asyncio.Event()

        @property
        def stage_count(self) -> int:
            return 3

        def sampling_defaults(self):
            sp = o.SamplingParams
            return (sp(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0),
                    sp(temperature=0.0, max_tokens=16383, stop_token_ids=[1], detokenize=False, seed=0),
                    sp(temperature=0.0, max_tokens=1, detokenize=False, seed=0))

        def ensure_request(self, ctx) -> None:
            pass

        async def submit(self, submission):
            ctx = submission.context
            rid = ctx.request_id
            duplex = submission.prompt["model_intermediate_buffer"]["duplex"]
            audio_in = duplex["payload"]["audio"]
            f32 = np.frombuffer(base64.b64decode(audio_in) if isinstance(audio_in, str) else audio_in, "<f4")
            # what the thinker's audio frontend gets; the same conversion our tiered converter makes
            pcm16 = np.clip(np.rint(f32 * 32768.0), -32768, 32767).astype("<i2").tobytes()
            t0 = _clock()
            sim = self.sims.get(rid)
            if sim is None:
                sim = self.sims[rid] = SimulatorModel(SimBehaviour(legacy_turn_blanks=DEFAULT_FENCE))
                sim.prefill(SessionPrompt("Be brief."))
            result = sim.step(PositionInput(pcm16))
            meter[0] += _clock() - t0
            meter[1] += 1
            token = result.agent.token_id if result.agent.token_id is not None else PAD
            audio = np.frombuffer(result.audio, "<i2").astype(np.float32) / 32768.0
            runner = self.manager.runner_for_request_id(rid)
            identity = o.DuplexRequestIdentity(session_id=ctx.session_id, fence=ctx.fence)
            meta = {"nvc_function_token": [PAD]}

            def output(tokens: list[int], mm: dict) -> SimpleNamespace:
                completion = SimpleNamespace(token_ids=tokens, cumulative_token_ids=None, finish_reason=None,
                                             multimodal_output=mm, text="")
                return SimpleNamespace(request_id=rid, finished=False, outputs=[completion], multimodal_output=mm,
                                       error=None, prompt_token_ids=[])

            def deliver() -> None:
                if runner is not None:
                    runner.on_stage_output(0, output([token], meta), None, request_id=rid, context=o.DuplexOutputContext(
                        identity=identity, final_stage_id=2, segment_finished=True, segment_token_ids=(token,),
                        segment_output_metadata=meta))
                    runner.on_stage_output(2, output([], {"audio": audio, "sr": 22050}), None, request_id=rid,
                                           context=o.DuplexOutputContext(
                                               identity=identity, final_stage_id=2, segment_finished=True,
                                               segment_token_ids=(), segment_output_metadata={}))
                self.submits += 1
                if self.submits >= self.target:
                    self.done.set()

            asyncio.get_running_loop().call_soon(deliver)
            return o.DuplexStageSubmissionResult(request_id=rid, stage_id=ctx.stage_id, replica_id=0)

        async def cleanup(self, request_ids, *, abort: bool = False) -> None:
            pass

        async def abort_requests(self, request_ids) -> None:
            pass

    return SimulatorStagePort()


async def run_upstream(scripts: list[list[str]], update: str) -> dict:
    o = _omni_stack()
    meter = [0, 0]
    counts = {"events": 0, "bytes": 0, "responses": 0, "audio_deltas": 0}
    plugin = o.NemotronVoiceChatDuplexPlugin(o.encode_audio)

    async def tokenizer_runtime(model_config):
        return dict(SPECIAL_IDS), FakeTokenizer()

    plugin._tokenizer_runtime = tokenizer_runtime  # the checkpoint tokenizer seam
    port = make_port(o, meter)
    output_q: asyncio.Queue = asyncio.Queue()
    result_q: asyncio.Queue = asyncio.Queue()
    manager = o.DuplexSessionManager(
        plugin=plugin, stage_port=port, output_sink=output_q, result_sink=result_q,
        runtime_config=o.DuplexSessionRuntimeConfig(max_sessions=max(len(scripts), 1)),
        model_config=SimpleNamespace(max_model_len=8192, hf_config=SimpleNamespace(stt_cfg={})))
    port.manager = manager
    seqs: dict[str, int] = {}

    async def pump() -> None:  # the serving layer's event pump: to_realtime + the journal's compact encode
        while True:
            message = await output_q.get()
            if message is None:
                return
            payload = message.event.to_realtime()
            seq = seqs[message.session_id] = seqs.get(message.session_id, 0) + 1
            text = json.dumps({**payload, "server_event_seq": seq}, separators=(",", ":"), ensure_ascii=False)
            counts["events"] += 1
            counts["bytes"] += len(text)
            kind = payload.get("type")
            if kind == "response.done":
                counts["responses"] += 1
            elif kind == "response.output_audio.delta":
                counts["audio_deltas"] += 1

    pump_task = asyncio.ensure_future(pump())
    envelopes, ids = [], []
    for i in range(len(scripts)):
        envelope = o.RealtimeEnvelope()
        handshake = envelope.first_message(json.loads(update))
        config = o.DuplexOmni._resolve_session_config(handshake.session_payload, model="m")
        sid = f"duplex-{i:032x}"
        manager.dispatch(o.OpenDuplexSessionMessage(control_id=f"open{i}", session_id=sid, session_config=config))
        result = await result_q.get()
        if not result.ok:
            raise RuntimeError(f"open failed: {result.error_message}")
        envelopes.append(envelope)
        ids.append(sid)
    port.target = sum(len(s) for s in scripts)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for sid, envelope, texts in zip(ids, envelopes, scripts):
        for text in texts:
            command = envelope.translate(json.loads(text))
            manager.dispatch(o.DuplexSessionCommandMessage(session_id=sid, command=command))
    await asyncio.wait_for(port.done.wait(), 600)
    for _ in range(20):  # let the last outputs through the mailboxes and the pump
        await asyncio.sleep(0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for i, sid in enumerate(ids):
        manager.dispatch(o.CloseDuplexSessionMessage(control_id=f"close{i}", session_id=sid))
        await result_q.get()
    await output_q.put(None)
    await pump_task
    await manager.shutdown()
    return _result("vllm_omni_runner", cpu, wall, meter[0], meter[1], counts)


def _result(name: str, cpu_s: float, wall_s: float, model_ns: int, positions: int, counts: dict) -> dict:
    over = cpu_s * 1e6 - model_ns / 1000.0
    return {
        "stack": name,
        "positions": positions,
        "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 3),
        "model_s": round(model_ns / 1e9, 3),
        "overhead_per_position_us": round(over / max(positions, 1), 2),
        "model_per_position_us": round(model_ns / 1000.0 / max(positions, 1), 2),
        "cpu_share": round(cpu_s / wall_s, 3) if wall_s else None,
        **counts,
    }


def run(sessions: int, seconds: float, seed: int, repeats: int) -> dict:
    rng = random.Random(seed)
    cache = AppendCache("tiered")
    scripts, turns = [], 0
    for _ in range(sessions):
        frames, t = scripted_frames(random.Random(rng.random()), seconds)
        scripts.append([session_update("tiered")] + [cache.text(f) for f in frames])
        turns += t
    appends = [s[1:] for s in scripts]
    rounds = []
    # warm-up of both (imports, lazily built tables), then alternate so drift hits both alike
    asyncio.run(run_ours(scripts[:1]))
    asyncio.run(run_upstream(appends[:1], scripts[0][0]))
    for _ in range(repeats):
        ours = asyncio.run(run_ours(scripts))
        theirs = asyncio.run(run_upstream(appends, scripts[0][0]))
        rounds.append({"ours": ours, "vllm_omni_runner": theirs,
                       "ratio": round(theirs["overhead_per_position_us"] / ours["overhead_per_position_us"], 3)})
    best = min(rounds, key=lambda r: r["ours"]["overhead_per_position_us"] + r["vllm_omni_runner"]["overhead_per_position_us"])
    ratios = sorted(r["ratio"] for r in rounds)
    return {"sessions": sessions, "seconds_per_session": seconds, "turns": turns, "frames": sum(len(a) for a in appends),
            "rounds": rounds, "ours": best["ours"], "vllm_omni_runner": best["vllm_omni_runner"],
            "ratio": ratios[len(ratios) // 2]}


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels, over, model = [], [], []
    for level in report["levels"]:
        for key, label in (("ours", "ours (tiered)"), ("vllm_omni_runner", "vLLM-Omni runner")):
            labels.append(f"{label}\n{level['sessions']} sess.")
            over.append(level[key]["overhead_per_position_us"])
            model.append(level[key]["model_per_position_us"])
    xs = range(len(labels))
    ax.bar(xs, over, label="server overhead (CPU)")
    ax.bar(xs, model, bottom=over, label="simulator model", alpha=0.5)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("CPU per 80 ms position (µs)")
    ax.set_title("same workload, same simulator: ours vs vLLM-Omni 0.30.0 runner", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_line(report: dict) -> str:
    parts = [f"{lv['sessions']} sessions: ours {lv['ours']['overhead_per_position_us']:.0f} us vs vLLM-Omni runner "
             f"{lv['vllm_omni_runner']['overhead_per_position_us']:.0f} us per position, ratio {lv['ratio']:.2f}x"
             for lv in report["levels"]]
    return "vLLM-Omni runner / ours (CPU per position, model excluded): " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--seconds", type=float, default=None, help="audio per session (default 20; --quick 4)")
    ap.add_argument("--repeats", type=int, default=None, help="alternating rounds per level (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    logging.getLogger("vllm_omni").setLevel(logging.WARNING)
    seconds = args.seconds or (4.0 if args.quick else 20.0)
    repeats = args.repeats or (1 if args.quick else 3)
    started = time.perf_counter()
    from importlib.metadata import version

    import vllm_omni  # noqa: F401  (fail early and clearly outside the omni venv)

    levels = [run(n, seconds, args.seed, repeats) for n in args.sessions]
    report = {
        "benchmark": "omni_runner_ratio",
        "parameters": {"sessions": args.sessions, "seconds_per_session": seconds, "repeats": repeats,
                       "seed": args.seed, "quick": args.quick, "vllm_omni": version("vllm-omni"),
                       "measure": "process CPU time (all threads) from first append to last position, minus the "
                                  "simulator's step + prefill time, per position; ratio = vLLM-Omni / ours "
                                  "(median over rounds)"},
        "levels": levels,
        "elapsed_s": round(time.perf_counter() - started, 2),
        "machine": machine_info(),
        "pid": os.getpid(),
    }
    write_report(report, args.out)
    plot(report, args.out.with_suffix(".png"))
    print(summary_line(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
