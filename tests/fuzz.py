"""Protocol fuzzing (docs/reliability.md, "Fuzzing"): generated client streams against the sans-I/O sessions.

An *episode* is one session (``V3Session`` or ``TieredSession`` over ``SessionCore`` and the simulator, on a
virtual clock) fed a random stream of valid, invalid and hostile client events interleaved with model positions,
delayed prefill/synthesis completions and, for the tiered dialect, socket drops, resumes (right, stale or bogus
cursors and tokens), takeovers and grace expiry. Every server event goes through a :class:`TraceChecker` per socket
(and, tiered, one more over the client's de-duplicated view across sockets). An episode records:

- a **crash**: any exception escaping the session code;
- a **hang**: the session does not go idle within its position/timer budget once the client stops;
- a **violation**: a trace invariant broken;
- **unusable**: after recoverable errors only, a valid turn does not get its response.

Everything is driven by one ``random.Random(seed)``: a failure is reproduced by ``(dialect, seed, episode)``.
A test harness, not part of the package: it does no I/O; ``benchmarks/fuzz.py`` and ``tests/test_fuzz_*.py`` drive
it.
"""

from __future__ import annotations

import base64
import json
import random
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.ids import SeededIds
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.shell.clock import VirtualClock
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer
from vllm_omni_voicechat.trace.checker import TraceChecker
from vllm_omni_voicechat.wire.tiered import parser as tiered_parser
from vllm_omni_voicechat.wire.tiered.connection import TieredOptions, TieredSession
from vllm_omni_voicechat.wire.transport import CloseTransport, WireText
from vllm_omni_voicechat.wire.v3 import V3Options, V3Session

WORDS = ["hello", "hi there", "yes", "what time is it", "ok", "tell me about the sea", 'call lookup {"q": "x"}']
TOOLS_OPENAI = [{"type": "function", "function": {"name": "lookup", "description": "look something up",
                                                  "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
TOOLS_TIERED = [{"type": "function", "name": "lookup", "description": "look something up",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
# Model-side behaviours an episode may draw (most episodes: a well-behaved model).
BEHAVIOURS: list[tuple[str, dict]] = [
    ("fail_at_position", {"fail_at_position": 25}),
    ("never_reach_fence", {"never_reach_fence": True}),
    ("sotc_on_eou", {"sotc_on_eou": True}),
    ("self_start_response", {"self_start_response_at": 6}),
    ("self_start_function", {"self_start_function_at": 6}),
    ("stalled_response", {"stalled_response": "silent"}),
    ("endless_response", {"endless_response": True}),
    ("ignore_eou", {"ignore_eou": True}),
    ("chained_calls", {"chained_calls": 3}),
    ("function_never_finishes", {"function_never_finishes": True}),
]
JUNK: list[Any] = [None, True, False, 0, -1, 1, 2**63, 1.5, float("inf"), "", "x", "16000", [], [1], {}, {"a": 1}]


@dataclass
class FuzzStats:
    dialect: str
    seed: int
    episodes: int = 0
    client_events: int = 0
    server_events: int = 0
    positions: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)
    errors_by_code: Counter = field(default_factory=Counter)
    fatal_by_code: Counter = field(default_factory=Counter)
    endings: Counter = field(default_factory=Counter)
    transport: Counter = field(default_factory=Counter)
    usability_checks: int = 0
    behaviours: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.hangs or self.violations or self.unusable)

    def summary(self) -> dict:
        return {
            "dialect": self.dialect, "seed": self.seed, "episodes": self.episodes,
            "client_events": self.client_events, "server_events": self.server_events, "positions": self.positions,
            "crashes": len(self.crashes), "hangs": len(self.hangs), "violations": len(self.violations),
            "unusable": len(self.unusable), "usability_checks": self.usability_checks,
            "errors_by_code": dict(self.errors_by_code.most_common()),
            "fatal_by_code": dict(self.fatal_by_code.most_common()),
            "endings": dict(self.endings.most_common()), "transport": dict(self.transport.most_common()),
            "behaviours": dict(self.behaviours.most_common()),
            "first_failures": (self.crashes + self.hangs + self.violations + self.unusable)[:20],
        }


class _Crash(Exception):
    pass


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


# ==================================================================================================== episode base


class _Episode:
    """Drives one sans-I/O session; subclasses add the dialect's events and checks."""

    dialect = ""

    def __init__(self, rng: random.Random, stats: FuzzStats, label: str) -> None:
        self.rng = rng
        self.stats = stats
        self.label = label
        self.clock = VirtualClock()
        behaviour = SimBehaviour()
        self.behaviour_name = "default"
        if rng.random() < 0.15:
            self.behaviour_name, kw = rng.choice(BEHAVIOURS)
            behaviour = SimBehaviour(**kw)
        stats.behaviours[self.behaviour_name] += 1
        self.model = SimulatorModel(behaviour)
        self.synth = SimulatorSynthesizer()
        self.max_frames = rng.choice([80, 400]) if rng.random() < 0.05 else 3000
        if self.behaviour_name in ("endless_response", "function_never_finishes"):
            self.max_frames = 400  # they end only at the position limit: keep the episode short
        self.ended: str | None = None
        self.recoverable_errors = 0
        self.turn_ids = 0
        self.published: list[str] = []
        self.answered: set[str] = set()
        self.core: SessionCore
        self.session: Any
        self.host: SyncDriver

    # ------------------------------------------------------------------ plumbing

    def host_session(self, session: Any) -> None:
        """Drive ``session`` with the synchronous host: prefills and syntheses complete at random later points."""
        self.session = session
        self.host = SyncDriver(session, self.model, synthesizer=self.synth, clock=self.clock, step_seconds=0.01,
                               on_event=self.deliver, defer_effects=True, keep=False)

    def call(self, fn, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except _Crash:
            raise
        except Exception as exc:  # the session code must never raise
            raise _Crash(f"{self.label}: {getattr(fn, '__name__', fn)} raised {type(exc).__name__}: {exc}\n"
                         + "".join(traceback.format_exc(limit=-4))) from exc

    def dispatch(self, outputs: list) -> None:
        self.call(self.host.dispatch, outputs)

    def deliver(self, output: Any) -> None:
        if isinstance(output, CloseTransport):
            self.on_close(output.code)
        else:
            self.on_event(output)

    @property
    def pending(self) -> list:
        """Prefills and syntheses in flight."""
        return self.host.pending

    def complete_pending(self, all_: bool = False) -> bool:
        """Complete one (or every) prefill / synthesis in flight; False when none was."""
        return self.call(self.host.complete_pending, every=all_)

    def step(self, max_positions: int, *, timers: bool) -> bool:
        """Run up to ``max_positions`` positions; True when the session went idle (nothing left to do)."""
        if self.ended is not None:
            return True
        before = self.host.positions
        try:
            self.call(self.host.run, max_positions=max_positions, advance_time=timers, max_wakeups=4000,
                      stop_when=self.lease_only)
        finally:
            self.stats.positions += self.host.positions - before
        return self.host.went_idle

    def lease_only(self) -> bool:
        """Only a deadline of the session's lease is left to wait for (v3: the silent client's; tiered: below)."""
        return self.core.idle

    def drain(self) -> bool:
        ok = self.step(self.max_frames + 600, timers=True)
        if not ok and self.ended is None and not self.session.closed:
            ok = self.step(1, timers=True) and True  # exactly at the budget: idle after all?
        if not ok and self.ended is None and not self.session.closed:
            self.stats.hangs.append(f"{self.label}: not idle after {self.max_frames + 600} positions / 4000 timers "
                                    f"(behaviour {self.behaviour_name})")
            self.ended = "hang"
        return ok

    def speech_appends(self, text: str) -> list[bytes]:
        pcm = render_speech(text) + bytes(INPUT_FRAME_BYTES * 2)
        out, i = [], 0
        while i < len(pcm):
            n = self.rng.choice([640, 2560, 2560, 5120, 10_240])
            out.append(pcm[i:i + n])
            i += n
        return out

    def pcm_chunk(self) -> bytes:
        kind = self.rng.random()
        if kind < 0.5:
            word = self.rng.choice(WORDS)
            pcm = render_speech(word)
            a = self.rng.randrange(0, max(1, len(pcm) // 2)) * 2
            return pcm[a:a + self.rng.choice([640, 2560, 5120, 20_480])]
        n = self.rng.randrange(0, 4 * INPUT_FRAME_BYTES // 2) * 2
        if kind < 0.8:
            return bytes(n)
        return bytes(self.rng.getrandbits(8) for _ in range(min(n, 2048))) + bytes(max(0, n - 2048))

    def junk(self) -> Any:
        return self.rng.choice(JUNK)

    def mutate(self, event: dict) -> dict:
        """A valid event with one field dropped, retyped or added."""
        event = dict(event)
        keys = [k for k in event if k != "type"] or ["event_id"]
        k = self.rng.choice(keys)
        r = self.rng.random()
        if r < 0.3:
            event.pop(k, None)
        elif r < 0.8:
            event[k] = self.junk()
        else:
            event[self.rng.choice(["extra", "zzz", "metadata"])] = self.junk()
        return event

    def hostile_frame(self) -> str | bytes:
        r = self.rng.random()
        if r < 0.12:
            return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randrange(1, 64)))
        if r < 0.25:
            text = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})
            return text[: self.rng.randrange(0, len(text))]
        if r < 0.35:
            return self.rng.choice(["[]", "42", '"x"', "null", "true", "3.5", "NaN", "{}", '{"type": null}'])
        if r < 0.45:
            depth = self.rng.choice([50, 1000, 100_000])
            return "[" * depth + "]" * depth
        if r < 0.55:
            return json.dumps({"type": self.junk()})
        if r < 0.65:
            return json.dumps({"type": "x" * self.rng.choice([1, 200, 5000]), "event_id": "h"})
        if r < 0.75:  # a huge payload
            return json.dumps({"type": "input_audio_buffer.append", "event_id": "huge",
                               "audio": "A" * self.rng.choice([65_536] * 5 + [1_000_000]), "encoding": "pcm16",
                               "sample_rate": 16000, "channels": 1})
        if r < 0.85:
            return json.dumps({"type": "session.update", "event_id": "hu", "session": {"instructions": "i" * 200_000}})
        # valid UTF-8 text whose JSON escapes decode to lone surrogates (a raw lone surrogate cannot cross a
        # WebSocket: text frames are UTF-8)
        return self.rng.choice(['{"type": "\\ud800", "event_id": "\\udfff"}',
                                ('{"type": "session.update", "event_id": "\\ud800", '
                                 '"session": {"instructions": "\\udfff", "protocol_version": 3}}')])

    # ------------------------------------------------------------------ episode loop

    def run(self, budget: int) -> int:
        """Generate about ``budget`` client events; returns how many were sent."""
        sent = 0
        try:
            self.open()
            while sent < budget and self.ended is None and not self.session.closed:
                r = self.rng.random()
                if r < 0.18:
                    self.step(self.rng.randrange(1, 40), timers=self.rng.random() < 0.3)
                    continue
                if r < 0.22 and self.pending:
                    self.complete_pending()
                    continue
                sent += self.act()
            if self.ended is None and not self.session.closed:
                self.finale()
        except _Crash as crash:
            self.stats.crashes.append(str(crash))
            self.ended = "crash"
        self.stats.client_events += sent
        self.stats.episodes += 1
        self.stats.endings[self.ended or ("closed" if self.session.closed else "open")] += 1
        return sent

    def finale(self) -> None:
        """Drain, prove the session still serves a valid turn (when errors were recoverable), then end it."""
        if not self.drain():
            return
        if self.ended is None and not self.session.closed and self.recoverable_errors:
            self.stats.usability_checks += 1
            self.valid_turn()
        if self.ended is None and not self.session.closed:
            self.finish()

    # hooks
    def open(self) -> None: ...
    def act(self) -> int: ...
    def on_event(self, event: Any) -> None: ...
    def on_close(self, code: int) -> None: ...
    def valid_turn(self) -> None: ...
    def finish(self) -> None: ...


# ==================================================================================================== v3


class V3Episode(_Episode):
    dialect = "v3"

    def open(self) -> None:
        self.core = SessionCore(SessionConfig(
            session_id="S", settlement_blank_frames=3, max_session_model_frames=self.max_frames,
            typed_input_ready=True, function_call_timeout_s=30.0, function_recovery_max_frames=256))
        self.host_session(V3Session(self.core, V3Options(single_client=False)))
        self.checker = TraceChecker("v3", name=self.label)
        self.next_turn = 1
        self.open_turn: int | None = None
        self.jobs = 0
        self.configured = False
        self.tools = False
        self.events: list[dict] = []
        self.dispatch(self.call(self.session.start, self.clock.now))
        if self.rng.random() < 0.9:
            self.send(self.update(first=True))
            if self.rng.random() < 0.7:
                self.complete_pending(all_=True)

    def update(self, *, first: bool = False) -> dict:
        session: dict[str, Any] = {"protocol_version": 3}
        if self.rng.random() < 0.5:
            session["tools"] = TOOLS_OPENAI
        if self.rng.random() < 0.3:
            session["instructions"] = self.rng.choice(["Be brief.", None, ""])
        if self.rng.random() < 0.3:
            session["capabilities"] = {"function_output_model_output": self.rng.choice([None, "client_authored_v1"])}
        return {"type": "session.update", "event_id": f"u{self.rng.randrange(1000)}", "session": session}

    def on_event(self, out: Any) -> None:
        if not isinstance(out, WireText):
            raise _Crash(f"{self.label}: a v3 output that is not WireText: {out!r:.200}")
        try:  # UTF-8 on the wire
            out.text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Crash(f"{self.label}: server event not sendable as UTF-8 text {out.text!r:.200}: {exc}") from exc
        self.stats.server_events += 1
        self.checker.server_event(out.text)
        event = out.json()
        self.events.append(event)
        type_ = event["type"]
        if type_ == "error":
            body = event["error"]
            self.stats.errors_by_code[body.get("code")] += 1
            if body.get("fatal"):
                self.stats.fatal_by_code[body.get("code")] += 1
            else:
                self.recoverable_errors += 1
        elif type_ == "session.updated":
            self.configured = True
            self.tools = bool(event["session"].get("tools"))
        elif type_ == "response.function_call_arguments.done":
            self.published.append(event["call_id"])

    def on_close(self, code: int) -> None:
        self.checker.transport_closed(code)
        self.ended = f"close {code}"

    def send(self, message: dict | str | bytes) -> None:
        frame = message if isinstance(message, (str, bytes)) else json.dumps(message)
        self.checker.client_event(frame)
        self.dispatch(self.call(self.session.receive, frame, self.clock.now))
        if self.ended is None and not self.session.held_messages and not self.core.typed.waiting:
            # Answered at once unless it waits behind an unfinished barrier (a prefill, a turn ack) or a typed
            # request waits for the job that already mutated the model (§9): then it is answered once that is
            # through, and the episode's end checks it.
            self.checker.settled()

    def append_event(self, pcm: bytes) -> dict:
        return {"type": "input_audio_buffer.append", "event_id": f"a{self.rng.randrange(10_000)}",
                "encoding": "pcm16", "sample_rate": 16000, "channels": 1, "audio": b64(pcm)}

    def act(self) -> int:
        r = self.rng.random()
        if r < 0.30:
            self.send(self.append_event(self.pcm_chunk()))
        elif r < 0.42:  # a whole polite turn (a polite client waits for a typed job and commits its open turn)
            if self.core.input_active and self.core.turns.open_client_turn_id is None:
                self.drain()
                if self.ended is not None or self.session.closed:
                    return 0
            open_id = self.core.turns.open_client_turn_id
            if open_id is not None:
                self.send({"type": "input_audio_buffer.commit", "event_id": "pc", "client_turn_id": open_id})
            k, self.next_turn = self.next_turn, self.next_turn + 1
            self.send({"type": "input_audio_buffer.turn_start", "event_id": f"ts{k}", "client_turn_id": k})
            chunks = self.speech_appends(self.rng.choice(WORDS))
            for pcm in chunks:
                self.send(self.append_event(pcm))
            self.send({"type": "input_audio_buffer.commit", "event_id": f"tc{k}", "client_turn_id": k})
            self.open_turn = None
            return 2 + len(chunks)
        elif r < 0.45:
            if self.open_turn is None:
                k, self.next_turn = self.next_turn, self.next_turn + 1
                self.open_turn = k
            else:
                k = self.open_turn if self.rng.random() < 0.5 else self.rng.randrange(1, self.next_turn + 1)
                self.open_turn = None if k == self.open_turn else self.open_turn
            kind = "turn_start" if self.open_turn == k else "commit"
            self.send({"type": f"input_audio_buffer.{kind}", "event_id": f"b{self.rng.randrange(100)}",
                       "client_turn_id": k})
        elif r < 0.53:
            self.jobs += 1
            job = self.rng.choice([f"j{self.jobs}", f"j{self.jobs}", "j1", "", 7, None, "x" * 129])
            text = self.rng.choice(["hi", "tell me a joke", "ok then", "", "   ", 3, "y" * 1001])
            self.send({"type": "input_text.request", "event_id": f"t{self.jobs}", "job_id": job, "text": text})
        elif r < 0.58:
            pending = [c for c in self.published if c not in self.answered]
            call = self.rng.choice(pending) if pending and self.rng.random() < 0.8 else f"call_{self.rng.randrange(9)}"
            output: Any = self.rng.choice(['{"ok": true}', "sunny", "", "o" * 17_000, 5, None])
            item: Any = {"type": "function_call_output", "call_id": call, "output": output}
            if self.rng.random() < 0.2:
                item["model_output"] = self.rng.choice(["short", "m" * 17_000, ""])
            if self.rng.random() < 0.1:
                item = self.rng.choice([None, [], {"type": "message"}, "x"])
            self.send({"type": "conversation.item.create", "event_id": f"f{self.rng.randrange(100)}", "item": item})
            if isinstance(output, str) and 0 < len(output) < 100 and call in pending:
                self.answered.add(call)
        elif r < 0.61:
            self.send(self.update() if self.rng.random() < 0.7 else self.mutate(self.update()))
        elif r < 0.615:
            self.send({"type": "session.stop", "event_id": "stop"})
        elif r < 0.62:
            self.disconnect()
        elif r < 0.635:  # out-of-order / malformed barriers: fatal protocol violations
            self.send(self.rng.choice([
                {"type": "input_audio_buffer.commit", "event_id": "oo", "client_turn_id": self.next_turn + 50},
                {"type": "input_audio_buffer.turn_start", "client_turn_id": self.next_turn},
                {"type": "input_audio_buffer.turn_start", "event_id": "", "client_turn_id": 1},
                {"type": "input_audio_buffer.commit", "event_id": "z", "client_turn_id": self.junk()},
                {"type": "input_audio_buffer.turn_start", "event_id": "z", "client_turn_id": 0},
            ]))
        elif r < 0.80:
            self.send(self.bad_append())
        elif r < 0.88:
            base = self.rng.choice([self.append_event(self.pcm_chunk()), self.update(),
                                    {"type": "input_text.request", "event_id": "m", "job_id": "jm", "text": "hi"},
                                    {"type": "conversation.item.create", "event_id": "m",
                                     "item": {"type": "function_call_output", "call_id": "c", "output": "o"}},
                                    {"type": "session.stop", "event_id": "m"}])
            if base["type"] == "session.stop" and self.rng.random() < 0.8:
                base = {"type": "response.cancel", "event_id": "m"}
            self.send(self.mutate(base))
        else:
            self.send(self.hostile_frame())
        return 1

    def bad_append(self) -> dict:
        event = self.append_event(self.pcm_chunk() or b"\x00\x00")
        r = self.rng.random()
        if r < 0.15:
            event["encoding"] = self.rng.choice(["opus", "PCM16", None, 16])
        elif r < 0.3:
            event["sample_rate"] = self.rng.choice([24000, "16000", 16000.0, True, None])
        elif r < 0.4:
            event["channels"] = self.rng.choice([2, 0, "1", True])
        elif r < 0.5:
            event["audio"] = self.rng.choice(["", None])
        elif r < 0.75:
            event["audio"] = self.rng.choice(["$$$$", "AAA", "AAAA AAAA", "AAAAA===", "QUJD\n", "AAE=", "4pyT", 12])
        else:
            event["audio"] = b64(bytes(self.rng.choice([40_962, 65_536, 40_961])))
        return event

    def disconnect(self) -> None:
        self.dispatch(self.call(self.session.disconnect, self.clock.now))
        self.checker.transport_closed(None)
        self.ended = "disconnect"

    def valid_turn(self) -> None:
        if not self.configured:
            self.send({"type": "session.update", "event_id": "fix", "session": {"protocol_version": 3}})
            if not self.drain() or self.ended is not None:
                return
        if self.core.turns.open_client_turn_id is not None:
            self.send({"type": "input_audio_buffer.commit", "event_id": "fixc",
                       "client_turn_id": self.core.turns.open_client_turn_id})
            if not self.drain() or self.ended is not None:
                return
        k = max(self.next_turn, 1000)
        self.next_turn = k + 1
        mark = len(self.events)
        self.send({"type": "input_audio_buffer.turn_start", "event_id": "vt", "client_turn_id": k})
        for pcm in self.speech_appends("hello there"):
            self.send(self.append_event(pcm))
        self.send({"type": "input_audio_buffer.commit", "event_id": "vc", "client_turn_id": k})
        for _ in range(10):  # answer any tool call the model makes, until the turn's response is done
            if not self.drain() or self.ended is not None:
                return
            pending = [c for c in self.published if c not in self.answered]
            if not pending:
                break
            for call in pending:
                self.answered.add(call)
                self.send({"type": "conversation.item.create", "event_id": "vf",
                           "item": {"type": "function_call_output", "call_id": call, "output": "fine"}})
        new = self.events[mark:]
        turn = next((e["turn_id"] for e in new if e["type"] == "input_audio_buffer.committed"
                     and e.get("client_turn_id") == k), None)
        created = [e["response_id"] for e in new if e["type"] == "response.created" and e.get("turn_id") == turn]
        done = [e for e in new if e["type"] == "response.done" and e.get("response_id") in created]
        if turn is None or not created or not done:
            fatal = [e["error"]["code"] for e in new if e["type"] == "error" and e["error"].get("fatal")]
            if self.session.closed and fatal:
                return  # a model-side fault ended it (the behaviour drew one); not an unusable session
            self.stats.unusable.append(
                f"{self.label}: after {self.recoverable_errors} recoverable errors a valid turn got "
                f"committed={turn is not None} created={bool(created)} done={bool(done)} "
                f"(behaviour {self.behaviour_name}; last types {[e['type'] for e in new][-8:]})")

    def finish(self) -> None:
        self.send({"type": "session.stop", "event_id": "bye"})
        if self.ended is None:
            self.drain()
        self.checker.settled()


# ==================================================================================================== tiered


@dataclass
class _Socket:
    checker: TraceChecker
    sent_through: int = 0


class TieredEpisode(_Episode):
    dialect = "tiered"

    def open(self) -> None:
        self.lane = "openai" if self.rng.random() < 0.25 else "full"
        autostart = self.rng.random() < 0.4
        self.core = SessionCore(SessionConfig(
            session_id="duplex-S", settlement_blank_frames=3, max_session_model_frames=self.max_frames,
            typed_input_ready=True, function_call_timeout_s=30.0, function_recovery_max_frames=256,
            turn_policy="model", gate_open_after=1))
        self.host_session(TieredSession(self.core, TieredOptions(
            lane=self.lane, model="nvidia/nemotron-voicechat", autostart=autostart, max_sessions=4,
            disconnect_grace_s=30.0, journal_max_bytes=self.rng.choice([8 << 20, 8 << 20, 64 << 10]),
            journal_ttl_s=60.0, ids=SeededIds(self.label))))  # reproducible resume tokens
        dialect = "tiered-openai" if self.lane == "openai" else "tiered"
        self.dialect_name = dialect
        self.view = TraceChecker(dialect, stream="session", name=f"{self.label} (client view)")  # type: ignore[arg-type]
        self.sockets = 0
        self.all_sockets: list[TraceChecker] = []
        self.socket: _Socket | None = self.new_socket()
        self.client_last = 0
        self.token: str | None = None
        self.seen_created = False
        self.events: list[dict] = []
        self.responses: list[str] = []
        self.items: list[str] = []
        self.dispatch(self.call(self.session.start, self.clock.now))
        if not autostart and self.rng.random() < 0.8:
            self.send(self.update())

    def new_socket(self) -> _Socket:
        self.sockets += 1
        checker = TraceChecker(self.dialect_name, name=f"{self.label} socket {self.sockets}")  # type: ignore[arg-type]
        self.all_sockets.append(checker)
        return _Socket(checker)

    def lease_only(self) -> bool:
        return self.core.idle and self.session.detached_at is None

    def update(self) -> dict:
        session: dict[str, Any] = {}
        r = self.rng.random
        if r() < 0.4:
            session["tools"] = TOOLS_TIERED
        if r() < 0.3:
            session["instructions"] = self.rng.choice(["Be brief.", "", "i"])
        if r() < 0.2:
            session["turn_detection"] = self.rng.choice([None, {"type": "server_vad"}, {"type": "semantic_vad"},
                                                         {"type": "server_vad", "interrupt_response": False}])
        if r() < 0.15:
            session["extra_body"] = {"auto_response": self.rng.choice([True, False])}
        if r() < 0.1:
            session["overlap_policy"] = self.rng.choice(["listen_only", "barge_in_on_speech", "bogus"])
        if r() < 0.1:
            session["playback_commit_policy"] = self.rng.choice(["ack_only", "commit_all_on_done"])
        if r() < 0.1:
            session["modalities"] = self.rng.choice([["text"], ["audio", "text"], ["video"]])
        if r() < 0.05:
            session["input_audio_format"] = self.rng.choice(["pcm16", "g711_ulaw", "mp3"])
        return {"type": "session.update", "event_id": f"u{self.rng.randrange(1000)}", "session": session}

    # ------------------------------------------------------------------ delivery

    def on_event(self, out: Any) -> None:
        if not isinstance(out, WireText):
            raise _Crash(f"{self.label}: a tiered output that is not WireText: {out!r:.200}")
        try:
            out.text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Crash(f"{self.label}: server event not sendable as UTF-8 text {out.text!r:.200}: {exc}") from exc
        self.stats.server_events += 1
        sock = self.socket
        if sock is None or (out.seq is not None and out.seq <= sock.sent_through):
            return  # detached: the journal keeps it
        sock.checker.server_event(out.text)
        if out.seq is not None:
            sock.sent_through = out.seq
        self.receive_client_side(out)

    def receive_client_side(self, out: WireText) -> None:
        """What the client does with a delivered event: de-duplicate by seq (as DuplexClient does)."""
        event = out.json()
        if out.seq is not None:
            if out.seq <= self.client_last:
                self.stats.transport["duplicate_dropped"] += 1
                return
            self.client_last = out.seq
            self.view.server_event(out.text)
        elif event["type"] == "session.created" and not self.seen_created:
            self.seen_created = True
            self.view.server_event(out.text)
        self.events.append(event)
        type_ = event["type"]
        if "resume_token" in event:
            self.token = event["resume_token"]
        if type_ == "error":
            body = event["error"] if isinstance(event["error"], dict) else {"code": event.get("code")}
            self.stats.errors_by_code[body.get("code")] += 1
            if body.get("retryable") is False:
                self.stats.fatal_by_code[body.get("code")] += 1
            else:
                self.recoverable_errors += 1
        elif type_ == "response.created":
            self.responses.append(event["response_id"])
        elif type_ == "response.function_call_arguments.done":
            self.published.append(event["call_id"])
        elif type_ in ("conversation.item.added",):
            self.items.append(event["item"]["id"])

    def on_close(self, code: int) -> None:
        attached = self.socket is not None
        if self.socket is not None:
            self.socket.checker.transport_closed(code)
            self.socket = None
        self.view.transport_closed(code if attached else None)  # detached: the client never sees this close
        self.ended = f"close {code}" if attached else f"ended detached ({code})"

    def send(self, message: dict | str | bytes) -> None:
        if self.socket is None:
            return  # nowhere to send: the client is reconnecting
        frame = message if isinstance(message, (str, bytes)) else json.dumps(message)
        self.socket.checker.client_event(frame)
        self.view.client_event(frame)
        self.dispatch(self.call(self.session.receive, frame, self.clock.now))
        if self.ended is None and self.socket is not None:
            self.socket.checker.settled()

    # ------------------------------------------------------------------ transport faults

    def drop(self) -> None:
        sock = self.socket
        if sock is None:
            return
        self.stats.transport["drops"] += 1
        sock.checker.transport_closed(None)
        self.socket = None
        if not self.session.resumable:
            self.dispatch(self.call(self.session.disconnect, self.clock.now))
            self.ended = "disconnect"
            return
        self.dispatch(self.call(self.session.detach, self.clock.now))

    def resume(self, *, cursor: int | None = None, token: str | None = None) -> bool:
        if not self.session.resumable or self.token is None:
            return False
        cursor = self.client_last if cursor is None else cursor
        request = {"type": "session.resume", "event_id": f"r{self.sockets}", "session_id": self.session.session_id,
                   "resume_token": token or self.token, "last_received_server_event_seq": cursor}
        sock = self.new_socket()
        frame = json.dumps(request)
        sock.checker.client_event(frame)
        parsed = tiered_parser.parse(frame)
        assert isinstance(parsed, tiered_parser.SessionResume), parsed
        outcome = self.call(self.session.resume, parsed, self.clock.now)
        if outcome.ok and cursor > self.client_last:
            # the client claimed events it never received: its own loss, not the server's
            self.stats.transport["cursor_ahead_accepted"] += 1
            self.view.skip_to(cursor + 1)
            self.client_last = cursor
        if not outcome.ok:
            self.stats.transport["resume_refused"] += 1
            for o in outcome.outputs:
                sock.checker.server_event(o.text)
                event = o.json()
                if event["type"] == "error":
                    self.stats.errors_by_code[event["error"]["code"]] += 1
                else:
                    self.stats.transport[event["type"]] += 1
            sock.checker.transport_closed(1000)
            return False
        old, self.socket = self.socket, sock
        if old is not None:
            self.stats.transport["takeovers"] += 1
            if outcome.replaced is not None:
                old.checker.server_event(outcome.replaced.text)
            old.checker.transport_closed(1000)
        else:
            self.stats.transport["resumes"] += 1
        sock.sent_through = 0
        for o in outcome.outputs:
            sock.checker.server_event(o.text)
            if o.seq is not None:
                sock.sent_through = max(sock.sent_through, o.seq)
            self.receive_client_side(o)
        return True

    # ------------------------------------------------------------------ client events

    def append_event(self, pcm: bytes, **extra: Any) -> dict:
        return {"type": "input_audio_buffer.append", "event_id": f"a{self.rng.randrange(10_000)}", "audio": b64(pcm),
                **extra}

    def act(self) -> int:
        if self.socket is None:
            r = self.rng.random()
            if r < 0.6:
                self.resume()
            elif r < 0.7:
                self.resume(cursor=self.rng.choice([0, self.client_last + 5, max(0, self.client_last - 3)]))
            elif r < 0.75:
                self.resume(token="rt_bogus")
            elif r < 0.8:  # the grace runs out
                self.clock.advance(31.0)
                self.step(0, timers=False)
                if self.ended is None and self.session.closed:
                    self.ended = "expired"
            else:
                self.step(self.rng.randrange(1, 30), timers=False)
            return 0
        r = self.rng.random()
        if r < 0.28:
            self.send(self.append_event(self.pcm_chunk()))
        elif r < 0.38:
            chunks = self.speech_appends(self.rng.choice(WORDS))
            for pcm in chunks:
                self.send(self.append_event(pcm))
            if self.rng.random() < 0.7:
                self.send({"type": "input_audio_buffer.commit", "event_id": "tc"})
            return len(chunks) + 1
        elif r < 0.52:
            self.send(self.valid_other())
        elif r < 0.56:
            self.send(self.update() if self.rng.random() < 0.7 else self.mutate(self.update()))
        elif r < 0.60:
            self.drop()
        elif r < 0.61:
            self.resume()  # a second socket takes over while attached
        elif r < 0.615:
            self.send({"type": self.rng.choice(["session.close", "close"]), "event_id": "bye"})
        elif r < 0.75:
            self.send(self.bad_append())
        elif r < 0.85:
            self.send(self.mutate(self.valid_other()))
        else:
            self.send(self.hostile_frame())
        return 1

    def valid_other(self) -> dict:
        rid = self.rng.choice(self.responses) if self.responses and self.rng.random() < 0.8 else "resp_x"
        item = self.rng.choice(self.items) if self.items and self.rng.random() < 0.8 else "item_x"
        pending = [c for c in self.published if c not in self.answered]
        call = self.rng.choice(pending) if pending and self.rng.random() < 0.8 else "call_x"
        choices = [
            {"type": "input_audio_buffer.commit"},
            {"type": "input_audio_buffer.commit", "is_speech": False},
            {"type": "input_audio_buffer.clear"},
            {"type": "input.cancel"},
            {"type": "response.create"},
            {"type": "response.cancel"},
            {"type": "response.cancel", "response_id": rid},
            {"type": "output_audio_buffer.clear"},
            {"type": "barge_in"},
            {"type": "turn.signal", "event": self.rng.choice(["barge_in", "response.cancel", "custom"])},
            {"type": "playback.ack", "response_id": rid, "played_ms": self.rng.choice([0, 80, 500, 10**9]),
             "truncate": self.rng.random() < 0.3},
            {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                          "content": [{"type": "input_text", "text": "hi there"}]}},
            {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call,
                                                          "output": self.rng.choice(["fine", "o" * 17_000])}},
            {"type": "conversation.item.retrieve", "item_id": item},
            {"type": "conversation.item.delete", "item_id": item},
            {"type": "conversation.item.truncate", "item_id": item, "content_index": 0,
             "audio_end_ms": self.rng.choice([0, 100, 10**7])},
            {"type": "session.heartbeat"},
            {"type": "session.event_ack", "server_event_seq": self.rng.choice(
                [0, self.client_last, max(0, self.client_last - 2), self.client_last + 10])},
            {"type": "input.text.append", "text": self.rng.choice(["hello", "", "t" * 1001])},
            {"type": "session.resume", "session_id": "x", "resume_token": "y"},
        ]
        event = dict(self.rng.choice(choices))
        if event["type"] == "conversation.item.create" and event["item"]["type"] == "function_call_output" \
                and event["item"]["output"] == "fine" and call in pending:
            self.answered.add(call)
        if self.rng.random() < 0.7:
            event["event_id"] = f"e{self.rng.randrange(10_000)}"
        return event

    def bad_append(self) -> dict:
        event = self.append_event(self.pcm_chunk() or b"\x00\x00")
        r = self.rng.random()
        if r < 0.35:
            event["audio"] = self.rng.choice(["$$$$", "AAA", "AAAA AAAA", "AAAAA===", "QUJD\n", "4pyT=", 12, None])
        elif r < 0.55:
            event["format"] = self.rng.choice(["opus", "pcm_f32le", "g711_alaw", 3, "pcm16"])
        elif r < 0.75:
            event["sample_rate_hz"] = self.rng.choice([8000, 24000, 0, -1, "16000", 44_100])
        elif r < 0.85:
            event["audio"] = b64(bytes(self.rng.choice([1, 3, 3_000_001])))
        else:
            event["video_frames"] = self.rng.choice([["x"], "x", [1]])
        return event

    # ------------------------------------------------------------------ finale

    def valid_turn(self) -> None:
        if self.socket is None and not self.resume():
            return  # the session could not be resumed (a refused cursor ends this client's view)
        if self.ended is not None or self.session.closed:
            return
        mark = len(self.events)
        for pcm in self.speech_appends("hello there"):
            self.send(self.append_event(pcm, format="pcm16", sample_rate_hz=16000))
        self.send({"type": "input_audio_buffer.commit", "event_id": "vc"})
        for _ in range(10):
            if not self.drain() or self.ended is not None or self.socket is None:
                return
            pending = [c for c in self.published if c not in self.answered]
            created = [e for e in self.events[mark:] if e["type"] == "response.created"]
            if not pending and created:
                break
            for call in pending:
                self.answered.add(call)
                self.send({"type": "conversation.item.create", "event_id": "vf",
                           "item": {"type": "function_call_output", "call_id": call, "output": "fine"}})
            self.send({"type": "response.create", "event_id": "vr"})  # auto_response:false, or after a tool
        new = self.events[mark:]
        created = {e["response_id"] for e in new if e["type"] == "response.created"}
        done = {e["response_id"] for e in new if e["type"] == "response.done"}
        if not created or not (created & done):
            if self.session.closed:
                return
            self.stats.unusable.append(
                f"{self.label}: after {self.recoverable_errors} recoverable errors a valid turn got "
                f"created={sorted(created)} done={sorted(done)} (lane {self.lane}, behaviour {self.behaviour_name}; "
                f"last types {[e['type'] for e in new][-10:]})")

    def finish(self) -> None:
        if self.socket is None and not self.resume():
            return
        self.send({"type": "session.close", "event_id": "bye"})
        if self.ended is None:
            self.drain()
        if self.socket is not None:
            self.socket.checker.settled()


# ==================================================================================================== runner


def collect(stats: FuzzStats, checkers: list[TraceChecker]) -> None:
    for c in checkers:
        c.finish()
        for v in c.violations:
            stats.violations.append(f"{c.name}: {v}")


def fuzz(dialect: str, *, seed: int, events: int, episode_events: tuple[int, int] = (5, 120)) -> FuzzStats:
    """Run episodes until about ``events`` client events were generated."""
    stats = FuzzStats(dialect, seed)
    rng = random.Random(seed)
    n = 0
    while stats.client_events < events:
        label = f"{dialect} seed={seed} episode={n}"
        episode_rng = random.Random(rng.getrandbits(64))
        ep: _Episode = V3Episode(episode_rng, stats, label) if dialect == "v3" else TieredEpisode(episode_rng, stats, label)
        ep.run(episode_rng.randint(*episode_events))
        checkers = [ep.checker] if isinstance(ep, V3Episode) else [ep.view, *ep.all_sockets]  # type: ignore[attr-defined]
        collect(stats, checkers)
        n += 1
    return stats


__all__ = ["FuzzStats", "TieredEpisode", "V3Episode", "fuzz"]
