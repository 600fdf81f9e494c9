"""Property-based tests (hypothesis) of frame reassembly and of the session core driven by random clients.

1. ``FrameAssembler`` reassembles any even-length chunking into exact 2,560-byte frames.
2. Random interleavings of client commands against the simulator keep the protocol invariants
   (response brackets, turn / typed-input acknowledgements, closure, position numbering and the guard).
3. The core's native event sequence does not depend on how the microphone stream is chunked.

Known bugs found by these properties are pinned by ``xfail(strict=True)`` regression tests at the end; the
random-interleaving checker excuses exactly those patterns (see ``_Checker``) so that the rest stays checked.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES, OUTPUT_FRAME_BYTES, FrameAssembler, dbfs
from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.model.port import SessionPrompt, ToolSpec
from vllm_omni_voicechat.session.commands import (
    AppendAudio,
    CommitTurn,
    Configure,
    RequestTypedInput,
    StartTurn,
    Stop,
)
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import (
    AudioDelta,
    AudioDone,
    Error,
    NativeEvent,
    PositionMetrics,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SpeechStarted,
    SpeechStopped,
    TextDone,
    TranscriptCompleted,
    TurnCommitted,
    TurnStarted,
    TypedAccepted,
    TypedInjectionFinished,
    TypedInjectionStarted,
    TypedRejected,
)
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

FB = INPUT_FRAME_BYTES
assert FB == 2560

# =========================================================================================== 1. frame reassembly


@st.composite
def _even_chunks(draw):
    data = draw(st.binary(min_size=0, max_size=4 * FB))
    if len(data) % 2:
        data = data[:-1]
    sizes = draw(st.lists(st.integers(0, FB + FB // 2).map(lambda n: n - n % 2), max_size=40))
    chunks, pos = [], 0
    for size in sizes:
        if pos >= len(data):
            break
        chunks.append(data[pos : pos + size])
        pos += size
    if pos < len(data):
        chunks.append(data[pos:])
    return data, chunks


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([FB, FB, FB, 2, FB - 2, 2 * FB, 0]), max_size=12), st.integers(0, 2**32 - 1))
def test_frame_reassembly_of_whole_frames(sizes, seed):
    """The usual append is exactly one frame: it comes back as it was sent (no copy) when nothing is pending, and
    every frame still equals the stream's slice whatever came before."""
    data = np.random.default_rng(seed).bytes(sum(sizes))  # the content only has to differ between frames
    asm, frames, pos = FrameAssembler(), [], 0
    for size in sizes:
        chunk = data[pos : pos + size]
        pending = asm.pending_bytes
        out = asm.push(chunk)
        if size == FB and pending == 0:
            assert out == [chunk] and out[0] is chunk
        frames.extend(out)
        pos += size
    n = len(data) // FB
    assert b"".join(frames) == data[: n * FB] and all(len(f) == FB for f in frames)


@settings(max_examples=300, deadline=None)
@given(_even_chunks(), st.booleans())
def test_frame_reassembly(data_chunks, use_pad):
    data, chunks = data_chunks
    asm = FrameAssembler()
    frames: list[bytes] = []
    fed = 0
    for chunk in chunks:
        out = asm.push(chunk)
        fed += len(chunk)
        assert all(len(f) == FB for f in out)
        frames.extend(out)
        n = len(frames)
        assert b"".join(frames) == data[: n * FB]
        assert asm.pending_bytes == fed - n * FB
        assert 0 <= asm.pending_bytes < FB
    assert fed == len(data)
    n = len(data) // FB
    assert len(frames) == n
    assert b"".join(frames) == data[: n * FB]
    remainder = data[n * FB :]
    assert asm.pending_bytes == len(remainder)
    if use_pad:
        tail = asm.pad()
        if remainder:
            assert tail == remainder + bytes(FB - len(remainder))
        else:
            assert tail is None
        assert asm.pending_bytes == 0
        assert asm.pad() is None
    else:
        assert asm.discard() == len(remainder)
        assert asm.pending_bytes == 0


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, INPUT_FRAME_BYTES, OUTPUT_FRAME_BYTES, INPUT_FRAME_BYTES + 2]), st.data())
def test_dbfs_is_the_rms_level_and_zero_frames_are_minus_infinity(size, data):
    """The level of any PCM16 chunk; the all-zero frames (a memcmp, no maths) and any digital silence: -inf."""
    samples = data.draw(st.lists(st.sampled_from([0, 0, 0, 1, -1, 32767, -32768, 1000]), min_size=size // 2,
                                 max_size=size // 2))
    pcm = np.asarray(samples, dtype="<i2").tobytes()
    ms = sum(v * v for v in samples) / len(samples)
    expect = -math.inf if ms == 0 else 10 * math.log10(ms / 32768**2)
    assert dbfs(pcm) == pytest.approx(expect)
    assert dbfs(bytes(size)) == -math.inf and dbfs(b"") == -math.inf


@given(st.binary(max_size=3 * FB), st.integers(0, FB).map(lambda n: 2 * n + 1))
def test_frame_assembler_rejects_odd_chunks(prefix, odd_len):
    asm = FrameAssembler()
    prefix = prefix[: len(prefix) - len(prefix) % 2]
    asm.push(prefix)
    before = asm.pending_bytes
    with pytest.raises(ValueError):
        asm.push(bytes(odd_len))
    # the failed push leaves the assembler untouched
    assert asm.pending_bytes == before


# =========================================================================================== session helpers

WORDS = ["hello", "hi there", "yes", "no thanks", "what time is it", "ok"]
PROMPTS = [
    SessionPrompt(),
    SessionPrompt("Be brief."),
    SessionPrompt("Use tools.", (ToolSpec("lookup"),)),
]


def _noise(seed: int, nbytes: int, amplitude: int) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(-amplitude, amplitude + 1, size=nbytes // 2, dtype=np.int16).astype("<i2").tobytes()


@st.composite
def _pcm(draw) -> bytes:
    """Simulator speech of a short word, silence or noise; random even lengths incl. partial frames."""
    kind = draw(st.sampled_from(["speech", "speech", "silence", "noise"]))
    if kind == "speech":
        pcm = render_speech(draw(st.sampled_from(WORDS)))
        cut = draw(st.sampled_from(["whole", "whole", "prefix"]))
        if cut == "prefix":
            n = draw(st.integers(0, len(pcm) // 2)) * 2
            pcm = pcm[:n]
        return pcm
    n = draw(st.integers(0, 3 * FB // 2)) * 2
    if kind == "silence":
        return bytes(n)
    return _noise(draw(st.integers(0, 2**16)), n, draw(st.sampled_from([30, 3000, 20000])))


_job_id = st.one_of(
    st.sampled_from(["j1", "j2", "j3", "j4"]),  # duplicates
    st.sampled_from(["", "x" * 129, 7, None]),  # invalid
)
_text = st.one_of(
    st.sampled_from(["hi", "tell me a joke", "ok then"]),
    st.sampled_from(["", "   ", 3, "y" * 1001]),  # empty / not text / too long
)
_eid = st.sampled_from(["e1", "e2", "e3"])
# "fresh" = the next unused client turn id, "open" = the open (else the last started) one; ints repeat/conflict.
_start_id = st.sampled_from(["fresh"] * 6 + [1, 2, 3])
_commit_id = st.sampled_from(["open"] * 8 + [1, 2, 3])

_action = st.one_of(
    st.tuples(st.just("start"), _start_id, _eid),
    st.tuples(st.just("commit"), _commit_id, _eid),
    st.tuples(st.just("append"), _pcm()),
    st.tuples(st.just("append"), _pcm()),
    st.tuples(st.just("turn"), st.sampled_from(WORDS)),  # start fresh + speech + commit
    st.tuples(st.just("turn"), st.sampled_from(WORDS)),
    st.tuples(st.just("typed"), _job_id, _text),
    st.tuples(st.just("typed"), st.sampled_from(["j1", "j2", "j3", "j4"]), st.sampled_from(["hi", "ok then"])),
    st.tuples(st.just("stop")),
    st.tuples(st.just("run"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("run"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("run"), st.integers(1, 40), st.just(True)),
    st.tuples(st.just("configure"), st.integers(0, len(PROMPTS) - 1)),
)


@dataclass
class _Ids:
    """Resolves symbolic client turn ids ("fresh" / "open") against the session."""

    next_fresh: int = 10
    last_started: int | None = None

    def start(self, k) -> int:
        if k == "fresh":
            k, self.next_fresh = self.next_fresh, self.next_fresh + 1
        self.last_started = k
        return k

    def commit(self, k, core: SessionCore) -> int:
        if k == "open":
            open_id = core.turns.open_client_turn_id
            k = open_id if open_id is not None else (self.last_started if self.last_started is not None else 1)
        return k


def _commands(action, ids: _Ids, d: SyncDriver, polite: bool, typed_busy: bool) -> list:
    """The commands of one action. A polite client avoids protocol conflicts (that fail the session): it
    commits its open turn before starting another, waits for an active typed job before a turn, and only
    commits a turn it has open."""
    core = d.core

    def before_start() -> list:
        if not polite:
            return []
        out = []
        open_id = core.turns.open_client_turn_id
        if open_id is not None:
            out.append(CommitTurn(open_id, "auto"))
        if typed_busy:
            out.append("drain")
        return out

    match action:
        case ("start", k, eid):
            if polite:
                k = "fresh"
            return [*before_start(), StartTurn(ids.start(k), eid)]
        case ("commit", k, eid):
            if polite and core.turns.open_client_turn_id is None:
                return [] if ids.last_started is None else [CommitTurn(ids.last_started, eid)]  # a re-ack
            if polite:
                k = "open"
            return [CommitTurn(ids.commit(k, core), eid)]
        case ("turn", word):
            pre = before_start()
            k = ids.start("fresh")
            return [*pre, StartTurn(k, "ts"), AppendAudio(render_speech(word)), CommitTurn(k, "tc")]
        case ("append", pcm):
            return [AppendAudio(pcm)]
        case ("typed", job_id, text):
            return [RequestTypedInput(job_id, text)]
        case ("stop",):
            return [Stop()]
        case ("configure", i):
            return [Configure(PROMPTS[i])]
    raise AssertionError(action)


class _FlakySynthesizer(SimulatorSynthesizer):
    """Fails for one phrase and returns no audio for another (both must end the job with an error)."""

    def synthesize(self, text: str) -> bytes:
        if "joke" in text:
            raise RuntimeError("synthesizer down")
        if text == "ok then":
            return b""
        return super().synthesize(text)


# Simulator behaviours: well-behaved (most often) and the protocol-breaking ones that drive fatal paths.
BEHAVIOURS = st.one_of(
    st.just(SimBehaviour()),
    st.just(SimBehaviour()),
    st.just(SimBehaviour()),
    st.builds(SimBehaviour, tail_positions=st.integers(0, 5)),
    st.builds(SimBehaviour, fail_at_position=st.integers(0, 40)),
    st.builds(SimBehaviour, self_start_response_at=st.integers(0, 20)),
    st.builds(SimBehaviour, self_start_function_at=st.integers(0, 20)),
    st.builds(SimBehaviour, legacy_turn_blanks=st.integers(1, 6)),
    st.just(SimBehaviour(endless_response=True)),
    st.just(SimBehaviour(never_reach_fence=True)),
    st.just(SimBehaviour(sotc_on_eou=True)),
)


def _driver(
    max_frames: int = 12_000,
    fence: int = 3,
    prompt: SessionPrompt = PROMPTS[0],
    behaviour: SimBehaviour | None = None,
    synthesizer=None,
    typed_ready: bool = True,
) -> SyncDriver:
    core = SessionCore(
        SessionConfig(
            session_id="S",
            settlement_blank_frames=fence,
            max_session_model_frames=max_frames,
            typed_input_ready=typed_ready,
        )
    )
    synth = synthesizer if synthesizer is not None else SimulatorSynthesizer()
    d = SyncDriver(core, SimulatorModel(behaviour), synthesizer=synth, step_seconds=0.01)
    d.send(Configure(prompt))
    return d


def _is_fatal(e: NativeEvent) -> bool:
    return isinstance(e, Error) and e.fatal


# Events that the contract allows after a fatal error in the same batch: the brackets it closes, then closure.
_AFTER_FATAL_OK = (SpeechStopped, TranscriptCompleted, TextDone, AudioDone, ResponseDone, SessionClosed)


@dataclass
class _Checker:
    """Incremental protocol checker over the driver's event list (see the module docstring)."""

    max_frames: int
    seen: int = 0
    terminated: bool = False  # a fatal Error or SessionClosed has been published
    fatal_code: str | None = None
    closed_event: SessionClosed | None = None
    next_frame: int = 0
    open_response: str | None = None
    created: set = field(default_factory=set)
    finished_responses: set = field(default_factory=set)
    response_parts: dict = field(default_factory=dict)
    speech_started: set = field(default_factory=set)
    mic_turns: set = field(default_factory=set)
    committed: set = field(default_factory=set)
    requests: dict = field(default_factory=dict)  # repr(job_id) -> requests received while open
    answers: dict = field(default_factory=dict)  # repr(job_id) -> TypedAccepted + TypedRejected
    accepted: set = field(default_factory=set)
    inj_started: dict = field(default_factory=dict)
    inj_finished: dict = field(default_factory=dict)
    injecting_at_fatal: set = field(default_factory=set)

    def note_command(self, cmd, core: SessionCore) -> None:
        if core.closed:
            return
        if isinstance(cmd, RequestTypedInput):
            key = repr(cmd.job_id)
            self.requests[key] = self.requests.get(key, 0) + 1

    def check(self, d: SyncDriver) -> None:
        new = d.events[self.seen :]
        self.seen = len(d.events)
        if self.terminated:
            assert not new, f"events after the session terminated: {new[:3]!r}"
            assert d.core.closed
            return
        after_fatal = False
        for i, e in enumerate(new):
            if after_fatal:
                assert isinstance(e, _AFTER_FATAL_OK), f"{e!r} after a fatal error"
            self._event(e)
            if isinstance(e, SessionClosed):
                assert i == len(new) - 1, f"events after SessionClosed: {new[i + 1:][:3]!r}"
            if _is_fatal(e):
                after_fatal = True
        if self.terminated:
            assert d.core.closed
            if self.fatal_code == "session_position_limit":
                last = new[-1]
                assert last == SessionClosed("failed", "session_position_limit"), last
        for key, n in self.answers.items():
            assert n <= self.requests.get(key, 0), f"job {key}: {n} answers for {self.requests.get(key, 0)} requests"

    def _event(self, e: NativeEvent) -> None:
        match e:
            case PositionMetrics(frame=frame):
                if frame is not None:
                    assert frame == self.next_frame, f"metrics frame {frame}, expected {self.next_frame}"
                    assert frame < self.max_frames
                    self.next_frame += 1
            case ResponseCreated(turn_id=t, response_id=r):
                assert self.open_response is None, f"{r} created while {self.open_response} is open"
                assert r not in self.created
                if t in self.mic_turns:
                    assert t in self.committed, f"response {r} for mic turn {t} before its TurnCommitted"
                self.open_response = r
                self.created.add(r)
                self.response_parts[r] = []
            case TextDone(response_id=r) | AudioDone(response_id=r):
                assert r == self.open_response, f"{type(e).__name__} for {r}, open is {self.open_response}"
                self.response_parts[r].append(type(e).__name__)
            case ResponseDone(response_id=r):
                assert r == self.open_response, f"ResponseDone for {r}, open is {self.open_response}"
                assert self.response_parts[r] == ["TextDone", "AudioDone"], self.response_parts[r]
                self.finished_responses.add(r)
                self.open_response = None
            case AudioDelta(response_id=r) if r != self.open_response:
                raise AssertionError(f"AudioDelta for {r} while {self.open_response} is open")
            case SpeechStarted(turn_id=t, source=source):
                assert t not in self.speech_started
                self.speech_started.add(t)
                if source == "microphone":
                    self.mic_turns.add(t)
            case TurnStarted(turn_id=t):
                assert t in self.speech_started, f"TurnStarted({t}) before its SpeechStarted"
            case TurnCommitted(turn_id=t):
                assert t in self.speech_started, f"TurnCommitted({t}) before its SpeechStarted"
                self.committed.add(t)
            case TypedAccepted(job_id=j) | TypedRejected(job_id=j):
                key = repr(j)
                self.answers[key] = self.answers.get(key, 0) + 1
                if isinstance(e, TypedAccepted):
                    assert j not in self.accepted
                    self.accepted.add(j)
            case TypedInjectionStarted(job_id=j):
                assert j in self.accepted and j not in self.inj_finished
                self.inj_started[j] = self.inj_started.get(j, 0) + 1
                assert self.inj_started[j] == 1, f"job {j} started twice"
            case TypedInjectionFinished(job_id=j):
                assert j in self.accepted
                self.inj_finished[j] = self.inj_finished.get(j, 0) + 1
                assert self.inj_finished[j] == 1, f"job {j} finished twice"
            case Error(fatal=True, code=code):
                self.terminated = True
                self.fatal_code = code
                self.injecting_at_fatal = {j for j in self.inj_started if j not in self.inj_finished}
            case SessionClosed():
                self.terminated = True
                self.closed_event = e

    def finish(self, d: SyncDriver) -> None:
        assert d.core.closed
        assert self.terminated
        assert self.created >= self.finished_responses
        assert self.open_response is None, f"{self.open_response} left open at {self.closed_event!r}"
        assert self.created == self.finished_responses
        if self.fatal_code in (None, "session_position_limit", "internal_error"):
            assert self.closed_event is not None
        for key, n in self.requests.items():
            assert self.answers.get(key, 0) == n, f"job {key}: {self.answers.get(key, 0)} answers for {n} requests"
        for j in self.accepted:
            if j in self.injecting_at_fatal:
                continue  # the contract: a failure after injection_started has no injection_finished
            assert self.inj_finished.get(j, 0) == 1, f"accepted job {j} never finished"


def _play(d: SyncDriver, actions, checker: _Checker, polite: bool = False) -> None:
    ids = _Ids()
    for action in actions:
        if action[0] == "run":
            d.run(max_positions=action[1], advance_time=action[2])
            checker.check(d)
            continue
        typed_busy = bool(checker.accepted - set(checker.inj_finished))  # accepted, not yet finished
        for cmd in _commands(action, ids, d, polite, typed_busy):
            if cmd == "drain":
                d.run(max_positions=300)
                checker.check(d)
                continue
            checker.note_command(cmd, d.core)
            d.send(cmd)
            checker.check(d)
    if not d.core.closed:
        checker.note_command(Stop(), d.core)
        d.send(Stop())
        checker.check(d)
        d.run(max_positions=2000)
        checker.check(d)
    # a closed session ignores everything
    for cmd in (StartTurn(9, "x"), AppendAudio(render_speech("late")), RequestTypedInput("late", "hi"), Stop()):
        d.send(cmd)
    d.run()
    checker.check(d)
    checker.finish(d)


# =========================================================================================== 2. interleavings


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    actions=st.lists(_action, min_size=5, max_size=25),
    max_frames=st.sampled_from([60, 25, 40, 12_000]),
    fence=st.integers(1, 4),
    prompt=st.sampled_from(PROMPTS),
    polite=st.sampled_from([True, True, False]),
    behaviour=BEHAVIOURS,
    flaky_synth=st.booleans(),
    typed_ready=st.sampled_from([True, True, True, False]),
)
def test_random_client_interleavings_keep_protocol_invariants(
    actions, max_frames, fence, prompt, polite, behaviour, flaky_synth, typed_ready
):
    synth = _FlakySynthesizer() if flaky_synth else None
    d = _driver(max_frames, fence, prompt, behaviour, synth, typed_ready)
    checker = _Checker(max_frames)
    checker.check(d)
    _play(d, actions, checker, polite)
    event(f"termination: {checker.fatal_code or (checker.closed_event and checker.closed_event.reason)}")
    event(f"responses: {min(len(checker.created), 3)}{'+' if len(checker.created) >= 3 else ''}")
    event(f"typed jobs accepted: {min(len(checker.accepted), 2)}")
    event(f"positions: {'>=50' if checker.next_frame >= 50 else '<50'}")
    event(f"max frames: {max_frames}")


def test_position_guard_fails_the_session():
    """A long turn against a small guard: fatal session_position_limit, brackets closed, then SessionClosed."""
    d = _driver(max_frames=20)
    checker = _Checker(20)
    _play(
        d,
        [("start", 1, "e1"), ("append", render_speech("what time is it now")), ("commit", 1, "e2"), ("run", 1000, True)],
        checker,
    )
    assert checker.fatal_code == "session_position_limit"
    assert d.events[-1] == SessionClosed("failed", "session_position_limit")
    assert checker.next_frame == 20


# =========================================================================================== 3. chunking independence


def _view(e: NativeEvent) -> str:
    if isinstance(e, AudioDelta):
        return f"AudioDelta({e.turn_id},{e.response_id},{hashlib.sha1(e.pcm).hexdigest()[:12]})"
    return repr(e)


def _native(events) -> list[str]:
    return [_view(e) for e in events if not isinstance(e, PositionMetrics)]


def _split(pcm: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c - c % 2 for c in cuts if 0 < c < len(pcm)})
    out, prev = [], 0
    for p in points:
        out.append(pcm[prev:p])
        prev = p
    out.append(pcm[prev:])
    return out


_segment = st.tuples(
    st.sampled_from(["turn", "turn", "free", "typed"]),
    st.lists(_pcm(), min_size=1, max_size=3).map(b"".join),
    st.lists(st.integers(0, 6 * FB), max_size=10),  # cut points of the chunked stream
    st.sampled_from(["none", "end", "each"]),  # when to run positions (run(advance_time=False))
    st.booleans(),  # turn: drain the response after the commit (else the next segment barges in)
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    segments=st.lists(_segment, min_size=1, max_size=4),
    fence=st.integers(1, 4),
    prompt=st.sampled_from(PROMPTS),
)
def test_event_sequence_is_independent_of_append_sizes(segments, fence, prompt):
    """The same commands with the microphone stream cut differently give the same native events.

    Runs between appends are part of "the same commands": with ``each`` the chunked variant runs after every
    piece and the whole variant after its single append. Runs happen only while no response can be open
    (a barge-in segment runs nothing until its commit), since response silence is paced by the clock and
    legitimately interleaves differently with input that arrives at different times.
    """

    def play(chunked: bool) -> list[str]:
        d = _driver(fence=fence, prompt=prompt)
        response_may_be_open = False
        for n, (kind, pcm, cuts, run_mode, drain) in enumerate(segments, start=1):
            if kind == "typed":
                d.send(RequestTypedInput(f"j{n}", "hi there"))
                d.run()
                response_may_be_open = False
                continue
            if kind == "turn":
                d.send(StartTurn(n, f"s{n}"))
            may_run = not response_may_be_open
            for piece in _split(pcm, cuts) if chunked else [pcm]:
                d.send(AppendAudio(piece))
                if may_run and run_mode == "each":
                    d.run(advance_time=False)
            if may_run and run_mode == "end":
                d.run(advance_time=False)
            if kind == "turn":
                d.send(CommitTurn(n, f"c{n}"))
                if drain:
                    d.run()
                response_may_be_open = not drain
        d.send(Stop())
        d.run()
        assert d.core.closed
        return _native(d.events)

    whole, chunked = play(chunked=False), play(chunked=True)
    assert chunked == whole


# =========================================================================================== regressions
# Minimal reproductions of invariant violations the properties above once found (now fixed).


def _protocol(d: SyncDriver) -> list[NativeEvent]:
    return [e for e in d.events if not isinstance(e, (PositionMetrics, AudioDelta))]


def _open_responses(d: SyncDriver) -> set[str]:
    created = {e.response_id for e in d.events if isinstance(e, ResponseCreated)}
    done = {e.response_id for e in d.events if isinstance(e, ResponseDone)}
    return created - done


def _speak_and_commit(d: SyncDriver, k: int = 1, word: str = "hello") -> None:
    d.send(StartTurn(k, f"s{k}"))
    d.send(AppendAudio(render_speech(word)))
    d.send(CommitTurn(k, f"c{k}"))


def test_typed_request_after_stop_is_finished():
    d = _driver()
    d.send(Stop())
    d.send(RequestTypedInput("j1", "hi"))
    d.run()
    events = _protocol(d)
    assert d.core.closed and events[-1] == SessionClosed("completed", "client_stop")
    if TypedAccepted("j1") in events:  # accepted: it must also be finished (e.g. "cancelled") before closure
        assert [e.job_id for e in events if isinstance(e, TypedInjectionFinished)] == ["j1"]
    else:
        assert TypedRejected("j1", "typed_input_unavailable") in events


def test_fatal_model_failure_closes_response():
    core = SessionCore(SessionConfig(session_id="S", settlement_blank_frames=3))
    d = SyncDriver(core, SimulatorModel(SimBehaviour(fail_at_position=8)), synthesizer=SimulatorSynthesizer())
    d.send(Configure(SessionPrompt()))
    _speak_and_commit(d)
    d.run()
    assert d.events[-1] == SessionClosed("failed", "internal_error")
    assert any(isinstance(e, ResponseCreated) for e in d.events)
    assert _open_responses(d) == set()


def test_fatal_conflict_closes_response():
    d = _driver()
    _speak_and_commit(d)
    d.run(max_positions=8)
    assert d.core.response is not None
    d.send(CommitTurn(2, "bad"))  # no open client turn: fatal input_turn_conflict
    assert d.core.closed
    assert _open_responses(d) == set()


def test_fatal_answers_waiting_typed_request():
    d = _driver()
    d.send(RequestTypedInput("j1", "hello there"))
    d.run(max_positions=2)  # j1 is injecting
    d.send(RequestTypedInput("j2", "hi"))  # deferred: neither accepted nor rejected yet
    d.send(CommitTurn(5, "bad"))  # fatal input_turn_conflict
    assert d.core.closed
    answers = [e for e in d.events if isinstance(e, (TypedAccepted, TypedRejected)) and e.job_id == "j2"]
    assert len(answers) == 1


def test_fatal_finishes_queued_typed_job():
    d = _driver()
    d.send(RequestTypedInput("j1", "hello there"))  # accepted, queued; nothing has run
    d.send(CommitTurn(5, "bad"))  # fatal input_turn_conflict
    assert d.core.closed
    assert TypedAccepted("j1") in d.events
    assert not any(isinstance(e, TypedInjectionStarted) for e in d.events)
    assert [e.job_id for e in d.events if isinstance(e, TypedInjectionFinished)] == ["j1"]
