#!/usr/bin/env python
"""Runtime overhead of the Stage 0 runner + session core, against the simulator model step.

Hosts :class:`~vllm_omni_voicechat.session.core.SessionCore` on the synchronous host (``SyncDriver``) through a
timing wrapper with the same driving interface, so that every core call is timed on its own, through scripted
full-duplex conversations on the host's virtual clock, which advances one frame (80 ms) per position:

* configure (the ``Prefill`` effect is fulfilled with ``model.prefill`` + ``core.prefilled``);
* voice turns: ``StartTurn`` -> simulator speech (``render_speech``) with leading/trailing silence appended in
  80 ms chunks, one chunk per position -> ``CommitTurn`` -> run until the response completes, either with the
  client still streaming silence (the response rides on real frames) or with the microphone stopped (paced
  response-silence positions);
* pauses: silence chunks between turns (real positions once the input gate is open);
* barge-ins: ``StartTurn`` a few positions into an open response (cancel tail, then the new turn);
* typed-input turns: ``RequestTypedInput`` -> ``StartSynthesis`` effect fulfilled with the simulator
  synthesizer and ``core.synthesis_done``.

Per model position it records

* ``core``: time in ``core.receive`` (appends and barriers), ``core.poll``, ``core.complete`` and the shell
  completions (``core.prefilled``, ``core.synthesis_done``) since the previous position, excluding the model step
  and the work of fulfilling effects (prefill, synthesis), which belong to the model and the synthesizer;
* ``in-run model``: ``SimulatorModel.step`` inside that run;

and afterwards replays every session's recorded position inputs into a fresh simulator (same prompt) to time
``SimulatorModel.step`` alone (the **baseline**). All timings use ``time.perf_counter_ns`` on one thread, pinned
to one CPU where the platform allows it; the garbage collector is left on and its activity is reported.

Usage::

    python benchmarks/runtime_overhead.py                 # ~20,000 positions
    python benchmarks/runtime_overhead.py --quick         # ~2,000 positions (smoke run)
    python benchmarks/runtime_overhead.py --positions 50000 --seed 7 --out /tmp/overhead.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:  # allow running from a checkout without installing the package
    import vllm_omni_voicechat  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS, INPUT_FRAME_BYTES, SILENT_INPUT_FRAME
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt
from vllm_omni_voicechat.runner.stage0 import Position
from vllm_omni_voicechat.session.commands import (
    AppendAudio,
    Command,
    CommitTurn,
    Configure,
    RequestTypedInput,
    StartTurn,
    Stop,
)
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore, Tick
from vllm_omni_voicechat.session.events import Output, ResponseDone
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

DEFAULT_POSITIONS = 20_000
QUICK_POSITIONS = 2_000
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "runtime_overhead.json"
SESSION_POSITIONS = (1_500, 2_500)  # positions per session before it is stopped (the guard is 12,000)

_clock = time.perf_counter_ns

WORDS = (
    "hello there how are you doing today I would like to know the weather in Paris tomorrow please "
    "can you tell me a short story about a cat and a dog who live near the sea what time is it now "
    "thanks that sounds great let us talk about music books travel food and the best way to learn "
    "a new language quickly remind me to call my sister at six"
).split()


# ====================================================================== statistics


def summarize(samples_ns: list[int] | np.ndarray) -> dict:
    """count, mean/p50/p90/p99/max in microseconds and positions per second (1 / mean)."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    if a.size == 0:
        return {"count": 0, "mean_us": None, "p50_us": None, "p90_us": None, "p99_us": None, "max_us": None,
                "positions_per_second": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    mean = float(a.mean())
    return {
        "count": int(a.size),
        "mean_us": round(mean, 3),
        "p50_us": round(float(p50), 3),
        "p90_us": round(float(p90), 3),
        "p99_us": round(float(p99), 3),
        "max_us": round(float(a.max()), 3),
        "positions_per_second": round(1e6 / mean, 1) if mean > 0 else None,
    }


def timer_overhead_ns(n: int = 20_000) -> float:
    """Median cost of one back-to-back ``perf_counter_ns`` pair (what a measured interval always includes)."""
    c = _clock
    d = []
    for _ in range(n):
        t0 = c()
        t1 = c()
        d.append(t1 - t0)
    return float(np.median(d))


# ====================================================================== the scripted conversation driver


@dataclass
class SessionRecord:
    prompt: SessionPrompt
    ops: list = field(default_factory=list)  # PositionInput, or None for an abort


class TimedCore:
    """The session core behind the driving interface, each call timed: the core time not yet attributed to a
    position accumulates per entry point until ``complete`` closes the position."""

    def __init__(self, conv: "Conversation", core: SessionCore) -> None:
        self.conv = conv
        self.core = core
        self.session_id = core.session_id

    @property
    def closed(self) -> bool:
        return self.core.closed

    def receive(self, command: Command, now: float) -> list[Output]:
        t0 = _clock()
        out = self.core.receive(command, now)
        self.conv.recv_ns += _clock() - t0
        return out

    def poll(self, now: float) -> Tick:
        t0 = _clock()
        tick = self.core.poll(now)
        self.conv.poll_ns += _clock() - t0
        return tick

    def complete(self, position: Position, result, now: float) -> list[Output]:
        t1 = _clock()
        out = self.core.complete(position, result, now)
        t2 = _clock()
        self.conv.on_position(position, result, t2 - t1)
        return out

    def fail(self, position: Position, error: BaseException, now: float) -> list[Output]:
        return self.core.fail(position, error, now)

    def prefilled(self, now: float) -> list[Output]:
        t0 = _clock()
        out = self.core.prefilled(now)  # the prefill itself is model work: not core overhead
        self.conv.recv_ns += _clock() - t0
        return out

    def prefill_failed(self, error: BaseException, now: float) -> list[Output]:
        return self.core.prefill_failed(error, now)

    def synthesis_done(self, job_id: str, pcm16: bytes, now: float) -> list[Output]:
        t0 = _clock()
        out = self.core.synthesis_done(job_id, pcm16, now)
        self.conv.recv_ns += _clock() - t0
        return out

    def synthesis_failed(self, job_id: str, error: BaseException, now: float) -> list[Output]:
        return self.core.synthesis_failed(job_id, error, now)

    def disconnect(self, now: float) -> list[Output]:
        return self.core.disconnect(now)


class RecordedModel:
    """The simulator with its steps timed and its inputs recorded for the baseline replay (None: an abort)."""

    def __init__(self, record: SessionRecord) -> None:
        self.model = SimulatorModel()
        self.record = record
        self.last_step_ns = 0

    def prefill(self, prompt: SessionPrompt) -> None:
        self.model.prefill(prompt)

    def step(self, inp: PositionInput):
        t0 = _clock()
        result = self.model.step(inp)
        self.last_step_ns = _clock() - t0
        self.record.ops.append(inp)
        return result

    def abort(self) -> None:
        self.model.abort()
        self.record.ops.append(None)


class TimedSynthesizer:
    """The simulator synthesizer with each synthesis timed (synthesizer work: not core overhead)."""

    def __init__(self, synth: SimulatorSynthesizer, samples: list[int]) -> None:
        self.synth = synth
        self.samples = samples

    def synthesize(self, text: str) -> bytes:
        t0 = _clock()
        pcm = self.synth.synthesize(text)
        self.samples.append(_clock() - t0)
        return pcm


class Conversation:
    """Drives one :class:`SessionCore` + :class:`SimulatorModel` pair on the synchronous host; times every core
    call."""

    def __init__(self, bench: "Bench", session_no: int, prompt: SessionPrompt) -> None:
        self.b = bench
        self.core = SessionCore(SessionConfig(session_id=f"bench{session_no}"))
        self.record = SessionRecord(prompt)
        self.model = RecordedModel(self.record)
        self.host = SyncDriver(TimedCore(self, self.core), self.model,
                               synthesizer=TimedSynthesizer(bench.synth, bench.synth_ns),
                               step_seconds=FRAME_SECONDS)
        self.positions = 0
        self.client_turn = 0
        self.jobs = 0
        # core time not yet attributed to a position, split by entry point
        self.recv_ns = 0
        self.poll_ns = 0

    def send(self, cmd: Command) -> None:
        self.host.send(cmd)
        self._tally()

    def _tally(self) -> None:
        """Count what the host collected (untimed), then let it go."""
        b = self.b
        for event in self.host.events:
            b.events[type(event).__name__] += 1
            if isinstance(event, ResponseDone):
                b.responses[event.status] += 1
        for effect in self.host.effects:
            b.effects[type(effect).__name__] += 1
        self.host.events.clear()
        self.host.effects.clear()

    def on_position(self, position: Position, result, complete_ns: int) -> None:
        """A position completed: its core time is everything since the previous one."""
        b = self.b
        core_ns = self.recv_ns + self.poll_ns + complete_ns
        if b.measuring:
            b.model_ns.append(self.model.last_step_ns)
            b.core_ns.append(core_ns)
            b.recv_ns.append(self.recv_ns)
            b.poll_ns.append(self.poll_ns)
            b.complete_ns.append(complete_ns)
            b.kinds.append(position.kind.value)
            b.controls.append(result.agent.control.value)
        self.recv_ns = self.poll_ns = 0
        self.positions += 1
        b.positions += 1

    def pump(self, *, until_idle: bool, max_positions: int = 100_000) -> int:
        """Run the positions that are due; with ``until_idle`` jump the clock to paced deadlines too."""
        before = self.host.positions
        self.host.run(max_positions=max_positions, advance_time=until_idle)
        self._tally()
        return self.host.positions - before

    # --- client behaviour -----------------------------------------------------------------------------

    def stream(self, pcm: bytes) -> None:
        """Append ``pcm`` in 80 ms chunks, running the due positions after each (a real-time client)."""
        for i in range(0, len(pcm), INPUT_FRAME_BYTES):
            self.send(AppendAudio(pcm[i : i + INPUT_FRAME_BYTES]))
            if self.core.closed:
                return
            self.pump(until_idle=False)

    def silence(self, frames: int) -> None:
        self.stream(SILENT_INPUT_FRAME * frames)

    def utterance(self, rng: random.Random) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))

    def finish_response(self, *, mic_streaming: bool) -> None:
        """Run until the session is idle again (the response completed)."""
        if not mic_streaming:
            self.pump(until_idle=True)
            return
        guard = 0
        while not self.core.idle and not self.core.closed and guard < 500:
            self.silence(1)
            guard += 1
        self.pump(until_idle=True)

    def voice_turn(self, rng: random.Random, *, barge_in: bool = False) -> None:
        self.client_turn += 1
        turn = self.client_turn
        self.send(StartTurn(turn, f"ev_start_{turn}"))
        lead = rng.randint(0, 2)
        trail = rng.randint(1, 5)  # client VAD hangover
        speech = render_speech(self.utterance(rng), 16_000)
        # odd tail lengths exercise the commit padding position
        cut = rng.choice((0, 0, 0, 2 * rng.randint(1, 600)))
        audio = SILENT_INPUT_FRAME * lead + speech + SILENT_INPUT_FRAME * trail + bytes(cut)
        self.stream(audio)
        self.send(CommitTurn(turn, f"ev_commit_{turn}"))
        self.b.scenario["voice_turns"] += 1
        if barge_in:
            # run into the response, then the user talks over it
            into = rng.randint(2, 8)
            guard = 0
            while self.core.response is None and not self.core.closed and guard < 200:
                if self.pump(until_idle=True, max_positions=1) == 0:
                    break
                guard += 1
            for _ in range(into):
                if self.core.response is None:
                    break
                if rng.random() < 0.5:
                    self.silence(1)  # the mic is still streaming
                else:
                    self.pump(until_idle=True, max_positions=1)
            if self.core.response is not None:
                self.b.scenario["barge_ins"] += 1
                self.voice_turn(rng, barge_in=False)
                return
        self.finish_response(mic_streaming=rng.random() < 0.5)

    def typed_turn(self, rng: random.Random) -> None:
        self.jobs += 1
        self.send(RequestTypedInput(f"job_{self.jobs}", self.utterance(rng)))
        self.b.scenario["typed_turns"] += 1
        self.pump(until_idle=True)

    def converse(self, rng: random.Random, budget: int) -> None:
        self.send(Configure(self.record.prompt))
        self.silence(rng.randint(2, 6))  # held by the closed input gate (no positions)
        self.voice_turn(rng)
        while self.positions < budget and self.b.positions < self.b.target and not self.core.closed:
            self.silence(rng.randint(0, 8))  # a pause: real silence positions
            r = rng.random()
            if r < 0.12:
                self.typed_turn(rng)
            elif r < 0.32:
                self.voice_turn(rng, barge_in=True)
            else:
                self.voice_turn(rng)
        self.send(Stop())
        self.pump(until_idle=True)
        # core work after the last position (the stop) is charged to that position
        if self.b.measuring and self.b.core_ns and (self.recv_ns or self.poll_ns):
            extra = self.recv_ns + self.poll_ns
            self.b.core_ns[-1] += extra
            self.b.recv_ns[-1] += self.recv_ns
            self.b.poll_ns[-1] += self.poll_ns
        self.recv_ns = self.poll_ns = 0
        if self.core.closed:
            self.b.scenario["sessions_closed"] += 1


class Bench:
    def __init__(self, target: int, seed: int) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.synth = SimulatorSynthesizer()
        self.measuring = False
        self.positions = 0
        self._reset()

    def _reset(self) -> None:
        self.model_ns: list[int] = []
        self.core_ns: list[int] = []
        self.recv_ns: list[int] = []
        self.poll_ns: list[int] = []
        self.complete_ns: list[int] = []
        self.kinds: list[str] = []
        self.controls: list[str] = []
        self.baseline_ns: list[int] = []
        self.baseline_controls: list[str] = []
        self.synth_ns: list[int] = []
        self.events: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.responses: Counter[str] = Counter()
        self.scenario: Counter[str] = Counter()

    def replay(self, record: SessionRecord, *, measure: bool) -> None:
        """The baseline: the same position inputs into a fresh simulator, ``step`` timed alone."""
        model = SimulatorModel()
        model.prefill(record.prompt)
        step = model.step
        out_ns = self.baseline_ns
        out_ctl = self.baseline_controls
        for inp in record.ops:
            if inp is None:
                model.abort()
                continue
            t0 = _clock()
            result = step(inp)
            t1 = _clock()
            if measure:
                out_ns.append(t1 - t0)
                out_ctl.append(result.agent.control.value)

    def run(self, positions: int, *, measure: bool) -> None:
        self.measuring = measure
        self.positions = 0
        self.target = positions
        session_no = 0
        while self.positions < positions:
            session_no += 1
            prompt = SessionPrompt(f"You are a helpful voice assistant (benchmark session {session_no}).")
            conv = Conversation(self, session_no, prompt)
            conv.converse(self.rng, self.rng.randint(*SESSION_POSITIONS))
            self.scenario["sessions"] += 1
            self.replay(conv.record, measure=measure)
        self.measuring = False


# ====================================================================== reporting


def machine_info(pinned: int | None) -> dict:
    info = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "pinned_cpu": pinned,
    }
    if _ALLOWED_CPUS is not None:
        info["allowed_cpus_before_pinning"] = _ALLOWED_CPUS
    return info


_ALLOWED_CPUS: list[int] | None = None


def pin_to_one_cpu(cpu: int | None) -> int | None:
    global _ALLOWED_CPUS
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = _ALLOWED_CPUS = sorted(os.sched_getaffinity(0))
    target = cpu if cpu is not None else allowed[-1]
    try:
        os.sched_setaffinity(0, {target})
    except OSError:
        return None
    return target


def gc_counts() -> list[int]:
    return [s["collections"] for s in gc.get_stats()]


ROWS = (
    ("baseline_model_step", "baseline: model.step alone"),
    ("inrun_model_step", "model.step in the driven run"),
    ("core_overhead", "runner + session core"),
    ("core_poll", "  core.poll"),
    ("core_complete", "  core.complete"),
    ("core_receive", "  core.receive + completions"),
    ("total_per_position", "total (model + core)"),
)


def print_table(report: dict) -> None:
    s = report["series"]
    head = f"{'series (per position)':<32}{'count':>8}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>10}{'pos/s':>10}"
    print(head)
    print("-" * len(head))
    for key, label in ROWS:
        r = s[key]
        print(
            f"{label:<32}{r['count']:>8}{r['mean_us']:>9.1f}{r['p50_us']:>9.1f}{r['p90_us']:>9.1f}"
            f"{r['p99_us']:>9.1f}{r['max_us']:>10.1f}{r['positions_per_second']:>10.0f}"
        )
    print("(times in microseconds; pos/s = 1e6 / mean, one core)")
    r = report["ratios"]
    print(
        f"core overhead / baseline model step: mean {r['core_over_baseline_mean']:.3f}, "
        f"p50 {r['core_over_baseline_p50']:.3f}, p99 {r['core_over_baseline_p99']:.3f}"
    )
    print(
        f"core overhead / in-run model step:   mean {r['core_over_inrun_model_mean']:.3f}, "
        f"p50 {r['core_over_inrun_model_p50']:.3f}"
    )
    print(f"total / baseline model step:         mean {r['total_over_baseline_mean']:.3f}")
    print(f"core share of a position's 80 ms budget: mean {r['core_share_of_80ms_budget_mean']:.5f}")
    by = report["core_overhead_by_kind"]
    print("core overhead by position kind: " + ", ".join(
        f"{k} {v['count']}x {v['mean_us']:.1f}us" for k, v in sorted(by.items(), key=lambda kv: -kv[1]["count"])
    ))
    g = report["gc"]
    print(
        f"gc enabled: {g['enabled']} (thresholds {tuple(g['thresholds'])}; "
        f"collections during the measured run: {g['collections_during_measured_run']}); "
        f"timer pair overhead ~{report['parameters']['timer_pair_overhead_ns']:.0f} ns"
    )


def build_report(bench: Bench, args, pinned, warmup, gc_delta, elapsed, timer_ns) -> dict:
    model = np.asarray(bench.model_ns, dtype=np.int64)
    core = np.asarray(bench.core_ns, dtype=np.int64)
    base = np.asarray(bench.baseline_ns, dtype=np.int64)
    series = {
        "baseline_model_step": summarize(base),
        "inrun_model_step": summarize(model),
        "core_overhead": summarize(core),
        "core_poll": summarize(bench.poll_ns),
        "core_complete": summarize(bench.complete_ns),
        "core_receive": summarize(bench.recv_ns),
        "total_per_position": summarize(model + core),
    }
    by_kind: dict[str, list[int]] = {}
    for k, ns in zip(bench.kinds, bench.core_ns):
        by_kind.setdefault(k, []).append(ns)
    by_kind_summary = {}
    for k, v in by_kind.items():
        s = summarize(v)
        by_kind_summary[k] = {"count": s["count"], "mean_us": s["mean_us"], "p50_us": s["p50_us"], "p99_us": s["p99_us"]}
    b, c, m, t = series["baseline_model_step"], series["core_overhead"], series["inrun_model_step"], series["total_per_position"]
    ratios = {
        "core_over_baseline_mean": round(c["mean_us"] / b["mean_us"], 4),
        "core_over_baseline_p50": round(c["p50_us"] / b["p50_us"], 4),
        "core_over_baseline_p99": round(c["p99_us"] / b["p99_us"], 4),
        "core_over_inrun_model_mean": round(c["mean_us"] / m["mean_us"], 4),
        "core_over_inrun_model_p50": round(c["p50_us"] / m["p50_us"], 4),
        "total_over_baseline_mean": round(t["mean_us"] / b["mean_us"], 4),
        "core_share_of_80ms_budget_mean": round(c["mean_us"] / (FRAME_SECONDS * 1e6), 6),
    }
    scenario = dict(bench.scenario)
    scenario.update(
        {
            "positions": len(bench.core_ns),
            "positions_by_kind": dict(Counter(bench.kinds)),
            "responses": dict(bench.responses),
            "events": dict(sorted(bench.events.items())),
            "effects": dict(sorted(bench.effects.items())),
            "synthesis_calls": len(bench.synth_ns),
            "synthesis_mean_us": summarize(bench.synth_ns)["mean_us"],
            "baseline_replay_matches": bench.controls == bench.baseline_controls,
        }
    )
    return {
        "benchmark": "runtime_overhead",
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(pinned),
        "parameters": {
            "positions": args.positions,
            "quick": args.quick,
            "seed": args.seed,
            "warmup_positions": warmup,
            "frame_seconds": FRAME_SECONDS,
            "virtual_clock": "advances one frame per position; paced deadlines are jumped to when the mic is idle",
            "timer": "time.perf_counter_ns",
            "timer_pair_overhead_ns": timer_ns,
            "gc_enabled": gc.isenabled(),
        },
        "series": series,
        "ratios": ratios,
        "core_overhead_by_kind": by_kind_summary,
        "scenario": scenario,
        "gc": {
            "enabled": gc.isenabled(),
            "thresholds": list(gc.get_threshold()),
            "collections_during_measured_run": gc_delta,
        },
        "elapsed_s": round(elapsed, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--positions", type=int, default=None, help=f"measured model positions (default {DEFAULT_POSITIONS:,})")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_POSITIONS:,} positions")
    p.add_argument("--seed", type=int, default=0, help="conversation script seed (default 0)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path (default %(default)s)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up positions (default: 10%% of the run, 300..2,000)")
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last allowed one)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    args = p.parse_args(argv)
    if args.positions is None:
        args.positions = QUICK_POSITIONS if args.quick else DEFAULT_POSITIONS
    if args.positions < 1:
        p.error("--positions must be >= 1")
    warmup = args.warmup if args.warmup is not None else min(2_000, max(300, args.positions // 10))

    pinned = None if args.no_pin else pin_to_one_cpu(args.cpu)
    started = time.perf_counter()
    timer_ns = timer_overhead_ns()

    bench = Bench(args.positions, args.seed)
    if warmup > 0:
        bench.run(warmup, measure=False)  # imports, caches, branch predictors, allocator pools
    bench._reset()
    gc0 = gc_counts()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    bench.run(args.positions, measure=True)
    wall1, cpu1 = time.perf_counter(), time.process_time()
    gc_delta = [b - a for a, b in zip(gc0, gc_counts())]
    # CPU time / wall time of the measured phase: well below 1 means other processes took the core
    contention = {
        "measured_wall_s": round(wall1 - wall0, 3),
        "measured_cpu_s": round(cpu1 - cpu0, 3),
        "cpu_share": round((cpu1 - cpu0) / (wall1 - wall0), 3),
    }
    elapsed = time.perf_counter() - started

    report = build_report(bench, args, pinned, warmup, gc_delta, elapsed, timer_ns)
    report["contention"] = contention
    sc = report["scenario"]
    print(
        f"runtime overhead: {sc['positions']:,} positions in {sc['sessions']} sessions "
        f"({sc['voice_turns']} voice turns, {sc.get('barge_ins', 0)} barge-ins, {sc['typed_turns']} typed turns; "
        f"responses {sc['responses']}), seed {args.seed}, pinned cpu {pinned}, "
        f"python {report['machine']['python']}"
    )
    print_table(report)
    if not sc["baseline_replay_matches"]:
        print("WARNING: the baseline replay diverged from the driven run", file=sys.stderr)
    print(f"measured phase: {contention['measured_cpu_s']:.2f} s CPU in {contention['measured_wall_s']:.2f} s wall "
          f"(cpu share {contention['cpu_share']:.2f})")
    if contention["cpu_share"] < 0.9:
        print("WARNING: the process got under 90% of its core: other load inflated the tails; rerun on a quiet "
              "machine or compare p50 figures", file=sys.stderr)
    if sc["events"].get("Error") or sc.get("sessions_closed", 0) != sc["sessions"]:
        print("WARNING: a session reported an error or did not close cleanly", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
