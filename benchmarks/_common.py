"""Shared pieces of the capacity and overhead benchmarks: statistics, reports, plots, a timed model port and the
scripted client.

The scripted client is the one workload every benchmark here runs, whichever stack serves it: a reactive
full-duplex talker whose microphone never stops (one 80 ms append per tick), which says a short phrase, waits
(streaming silence) until the response is done, pauses, and says the next one. The model-owned dialects (tiered,
vLLM-Omni's runner) get no barriers; v3 gets ``turn_start`` / ``commit`` around each phrase.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:  # allow running from a checkout without installing the package
    import vllm_omni_voicechat  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_omni_voicechat.audio.frames import FRAME_SECONDS, INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.bench.workload import split_frames

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_US = FRAME_SECONDS * 1e6

WORDS = ["hello", "there", "how", "are", "you", "doing", "today", "I", "would", "like", "to", "know", "the", "weather", "in", "Paris", "tomorrow", "please", "can", "you", "tell", "me", "a", "short", "story", "about", "a", "cat", "and", "a", "dog", "who", "live", "near", "the", "sea", "what", "time", "is", "it", "now", "thanks", "that", "sounds", "great", "let", "us", "talk", "about", "music", "books", "travel", "food"]


# ====================================================================== statistics and reports


def summarize_us(samples_us: Any) -> dict:
    """count, mean, p50, p90, p99, max (microseconds)."""
    a = np.asarray(samples_us, dtype=np.float64)
    if a.size == 0:
        return {"count": 0, "mean_us": None, "p50_us": None, "p90_us": None, "p99_us": None, "max_us": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"count": int(a.size), "mean_us": round(float(a.mean()), 2), "p50_us": round(float(p50), 2),
            "p90_us": round(float(p90), 2), "p99_us": round(float(p99), 2), "max_us": round(float(a.max()), 2)}


def machine_info() -> dict:
    info = {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "numpy": np.__version__}
    if hasattr(os, "sched_getaffinity"):
        info["allowed_cpus"] = sorted(os.sched_getaffinity(0))
    return info


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def write_report(report: dict, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    report.setdefault("timestamp", now_utc())
    report.setdefault("machine", machine_info())
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out


def pyplot():
    """matplotlib's pyplot on the file-only backend (None when matplotlib is missing: the JSON still lands)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the bench extra installs it
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)
        return None
    return plt


def proc_cpu(pid: int | str = "self") -> tuple[float, int]:
    """(CPU seconds, user + system over all threads; threads) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[17])


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident set size from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ====================================================================== the scripted client


class TimedModel:
    """A model port whose ``step`` and ``prefill`` time is accumulated: the model cost a benchmark subtracts."""

    def __init__(self, model: Any, clock: Callable[[], int] = time.thread_time_ns) -> None:
        self.model = model
        self.clock = clock
        self.ns = 0
        """Time in ``step`` and ``prefill``."""
        self.steps = 0

    def prefill(self, prompt: Any) -> None:
        clock = self.clock
        t0 = clock()
        self.model.prefill(prompt)
        self.ns += clock() - t0

    def step(self, position: Any) -> Any:
        clock = self.clock
        t0 = clock()
        result = self.model.step(position)
        self.ns += clock() - t0
        self.steps += 1
        return result

    def abort(self) -> None:
        self.model.abort()


def pcm16_to_f32(pcm: bytes) -> bytes:
    return (np.frombuffer(pcm, "<i2").astype("<f4") / 32768.0).tobytes()


class AppendCache:
    """Client append texts, built once per distinct frame (client work is not what is measured)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self._texts: dict[bytes, str] = {}

    def text(self, frame: bytes) -> str:
        t = self._texts.get(frame)
        if t is None:
            if self.dialect == "v3":
                body = {"type": "input_audio_buffer.append", "encoding": "pcm16", "sample_rate": 16000, "channels": 1,
                        "audio": base64.b64encode(frame).decode()}
            else:  # tiered and vLLM-Omni: the Nemotron preset's float32 16 kHz input
                body = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16_to_f32(frame)).decode()}
            t = self._texts[frame] = json.dumps(body)
        return t


SILENCE = bytes(INPUT_FRAME_BYTES)


def speech_frames(phrase: str) -> list[bytes]:
    return split_frames(render_speech(phrase))


def v3_append(pcm: bytes) -> str:
    """A v3 ``input_audio_buffer.append`` of 16 kHz mono PCM16."""
    return json.dumps({"type": "input_audio_buffer.append", "encoding": "pcm16", "sample_rate": 16000,
                       "channels": 1, "audio": base64.b64encode(pcm).decode()})


WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CITIES = ("Paris", "Oslo", "Lima", "Rome")
MIX = ("voice", "voice", "typed", "tool")
"""The turn kinds of the mixed talker (``ScriptedClient(..., mix=True)``), drawn with equal odds."""


def session_update(dialect: str, instructions: str = "Be brief.", tools: list | None = None) -> str:
    if dialect == "v3":
        session: dict[str, Any] = {"protocol_version": 3, "instructions": instructions}
        if tools:
            session["tools"] = tools
        return json.dumps({"type": "session.update", "event_id": "u1", "session": session})
    session = {"modalities": ["audio", "text"], "instructions": instructions, "input_audio_format": "pcm_f32le",
               "sample_rate_hz": 16000, "output_audio_format": "pcm16", "extra_body": {"auto_response": True}}
    if tools:
        session["tools"] = tools
    return json.dumps({"type": "session.update", "session": session})


@dataclass
class ClientStats:
    turns: int = 0
    responses_done: int = 0
    frames: int = 0
    wait_timeouts: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    function_outputs: int = 0


class ScriptedClient:
    """One talker: ``tick()`` returns this 80 ms tick's client texts; ``observe(text)`` sees each server event and
    returns what the client answers at once (a function call's output).

    pause (0.3-1 s of silence) -> phrase (2-5 words of simulator speech) -> silence until ``response.done`` (at most
    ``max_wait`` frames) -> pause ... The microphone streams every tick, so responses ride on real frames. With
    ``mix`` (the session configured with ``WEATHER``) a turn is one of ``MIX``: a spoken phrase, a typed one, or a
    spoken function call (``call get_weather {...}``) whose output the client sends back and whose post-tool
    answer it waits for (two ``response.done``). A v3 talker mutes its microphone from a typed request until the
    injection finished: the server drops appends meanwhile (server-side half duplex), which would leave the
    client's frame count ahead of the server's ``transport_frame``.
    """

    def __init__(self, dialect: str, rng: random.Random, cache: AppendCache, *, max_wait: int = 120,
                 mix: bool = False) -> None:
        self.dialect = dialect
        self.rng = rng
        self.cache = cache
        self.max_wait = max_wait
        self.mix = mix
        self.stats = ClientStats()
        self._queue: list[tuple[bytes, list[str], list[str]]] = []  # (frame, texts before, texts after)
        self._waiting = 0  # response.done still awaited for this turn
        self._waited = 0
        self._turn = 0
        self._muted = False
        self.kind = "voice"
        """The current turn's kind."""
        self._pause()
        self._phrase()

    def _pause(self) -> None:
        for _ in range(self.rng.randint(4, 12)):
            self._queue.append((SILENCE, [], []))

    def _phrase(self) -> None:
        kind = self.kind = self.rng.choice(MIX) if self.mix else "voice"
        self._turn += 1
        self.stats.turns += 1
        self.stats.kinds[kind] = self.stats.kinds.get(kind, 0) + 1
        k = self._turn
        self._waiting, self._waited = (2 if kind == "tool" else 1), 0
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(2, 5)))
        if kind == "typed":
            typed = ({"type": "input_text.request", "event_id": f"t{k}", "job_id": f"job{k}", "text": words}
                     if self.dialect == "v3" else {"type": "input.text.append", "event_id": f"t{k}", "text": words})
            self._queue.append((SILENCE, [json.dumps(typed)], []))
            return
        if kind == "tool":
            words = f'call get_weather {{"city": "{self.rng.choice(CITIES)}"}}'
        frames = speech_frames(words) + [SILENCE]  # trailing silence ends the last word
        for i, f in enumerate(frames):
            before, after = [], []
            if self.dialect == "v3":
                if i == 0:
                    before.append(json.dumps({"type": "input_audio_buffer.turn_start", "event_id": f"s{k}",
                                              "client_turn_id": k}))
                if i == len(frames) - 1:
                    after.append(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"c{k}",
                                             "client_turn_id": k}))
            self._queue.append((f, before, after))

    def observe(self, text: str) -> list[str]:
        if self._muted and ('"input_text.injection_finished"' in text or '"error"' in text[:40]):
            self._muted = False
        if '"response.done"' in text:
            self.stats.responses_done += 1
            self._waiting = max(0, self._waiting - 1)
        elif '"response.function_call_arguments.done"' in text:
            e = json.loads(text)
            self.stats.function_outputs += 1
            output = {"type": "conversation.item.create", "event_id": f"out_{e['call_id']}",
                      "item": {"type": "function_call_output", "call_id": e["call_id"],
                               "output": json.dumps({"city": "Paris", "temp_c": 21})}}
            if self.dialect == "v3":
                return [json.dumps(output)]
            return [json.dumps(output), json.dumps({"type": "response.create", "event_id": f"rc_{e['call_id']}"})]
        return []

    @property
    def waiting(self) -> bool:
        """The current turn's answer (both, for a function call) is not done yet."""
        return bool(self._waiting)

    def tick(self) -> list[str]:
        if not self._queue:
            if self._waiting and self._waited < self.max_wait:
                self._waited += 1
                if self._muted:
                    return []
                self.stats.frames += 1
                return [self.cache.text(SILENCE)]
            if self._waiting:
                self.stats.wait_timeouts += 1
                self._waiting = 0
            self._pause()
            self._phrase()
        frame, before, after = self._queue.pop(0)
        if self.dialect == "v3" and before and '"input_text.request"' in before[0]:
            self._muted = True  # from the request's tick on (its own frame is not sent)
        if self._muted:
            return [*before, *after]
        self.stats.frames += 1
        return [*before, self.cache.text(frame), *after]


def scripted_frames(rng: random.Random, seconds: float, *, answer_frames: int = 45) -> tuple[list[bytes], int]:
    """A fixed (non-reactive) microphone stream of ``seconds``: pause, phrase, ``answer_frames`` of silence for
    the response, ... Returns the 80 ms PCM16 frames and the number of phrases. The silence after each phrase
    is long enough for the simulator's reply, so responses are never barged into."""
    frames: list[bytes] = []
    turns = 0
    total = round(seconds / FRAME_SECONDS)
    while len(frames) < total:
        frames += [SILENCE] * rng.randint(4, 12)
        frames += speech_frames(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))))
        frames += [SILENCE] * answer_frames
        turns += 1
    return frames[:total], turns
