"""The tiered dialect over real WebSockets (docs/tiered-dialect.md §1, §3.7, §6): dialect routing, the handshake,
shared admission, ``config_timeout``, a spoken turn's sequencing, and resume (journal replay, token rotation,
takeover, grace expiry), against the uvicorn fixture and the simulator.

Synchronisation is never a sleep: tests wait on the admission ``on_release`` hook, on receives with a timeout, or
on a gated model whose positions the test holds and releases.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.model.port import PositionInput, SessionPrompt, StepResult
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel

from .server_fixture import RawClient, running_app

V3_PROTOCOL = {"name": "voicechat.realtime", "version": 3}
DUPLEX_OFF = {"type": "error", "error": "Realtime API is not available", "code": "unsupported"}
UPDATE = {"type": "session.update", "event_id": "u1", "session": {"instructions": "Be brief."}}
SILENCE = bytes(12 * INPUT_FRAME_BYTES)  # 12 silent 80 ms frames: the simulator's model-owned EOU fires on its own
LONG = "please tell me a very long story about the sea and the sky"
TERMINAL = ("session.closed", "session.expired")


# ---------------------------------------------------------------------------------------------------- helpers


class HeaderClient(RawClient):
    """A RawClient that sends extra upgrade headers."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float = 10.0) -> None:
        self.ws = connect(url, additional_headers=headers, open_timeout=timeout, ping_interval=None, max_size=None,
                          proxy=None, legacy=True)
        self.timeout = timeout
        self.received = []


def append(pcm: bytes) -> dict:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}


def resume(created: dict, last_seq: int, token: str | None = None, **extra) -> dict:
    return {"type": "session.resume", "session_id": created["session"]["id"],
            "resume_token": token or created["resume_token"], "last_received_server_event_seq": last_seq, **extra}


def open_full(url: str, path: str = "/v1/duplex") -> tuple[RawClient, dict]:
    """A full-lane session through the first-message handshake: (client, session.created)."""
    c = RawClient(url + path)
    c.send(UPDATE)
    created = c.recv()
    assert created["type"] == "session.created"
    assert c.recv()["type"] == "session.updated"
    return c, created


def closed(c: RawClient) -> tuple[int | None, str]:
    """Drain until the server closes; (code, reason) of the server's close frame."""
    try:
        while True:
            c.recv()
    except ConnectionClosed as exc:
        return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")


def close_session(c: RawClient, *, full: bool = True) -> None:
    """session.close → (full lane) session.closed{client_close} → close 1000."""
    c.send({"type": "session.close"})
    if full:
        done = c.recv_type("session.closed")
        assert done["reason"] == "client_close" and isinstance(done["server_event_seq"], int)
        assert closed(c) == (1000, "client_close")  # the close frame carries the session.closed reason
    else:
        assert closed(c)[0] == 1000


def quietly_close(c: RawClient) -> None:
    """Cleanup for a session whose state is unknown (an xfail): end it so the server can shut down promptly."""
    with contextlib.suppress(Exception):
        c.send({"type": "session.close"})
        closed(c)
    with contextlib.suppress(Exception):
        c.close()


def refusal(c: RawClient, code: str) -> dict:
    """A seq-less handshake error (§3.7, §6.4) followed by close 1000."""
    e = c.recv()
    assert e["type"] == "error" and e["error"]["code"] == code, e
    assert e["error"]["type"] == "invalid_request_error"
    assert "server_event_seq" not in e
    assert closed(c) == (1000, code)  # the close frame carries the refusal's code
    return e


def seqs(events: list[dict]) -> list[int]:
    return [e["server_event_seq"] for e in events if "server_event_seq" in e]


def audio_text(events: list[dict]) -> str:
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert deltas and len({(e["format"], e["sample_rate_hz"]) for e in deltas}) == 1
    pcm = b"".join(base64.b64decode(e["delta"], validate=True) for e in deltas)
    return decode_speech(pcm, deltas[0]["sample_rate_hz"])


def events_within(c: RawClient, seconds: float) -> tuple[list[dict], tuple[int | None, str] | None]:
    """Everything the server sends in the next ``seconds`` (receives with a deadline, no sleep); the close frame's
    (code, reason) if the server closed meanwhile."""
    out: list[dict] = []
    deadline = time.monotonic() + seconds
    saved = c.timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            c.timeout = left
            try:
                out.append(c.recv())
            except TimeoutError:
                break
            except ConnectionClosed as exc:
                return out, (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")
    finally:
        c.timeout = saved
    return out, None


def watch_releases(app) -> threading.Semaphore:
    """One permit per admission release (the hook runs on the server thread)."""
    released = threading.Semaphore(0)
    app.admission.on_release = released.release
    return released


def watch_detach(app, session_id: str) -> threading.Event:
    """Set once the server has noticed that the session's socket went away (its attachment is empty)."""
    att = app.live[session_id].attachment
    gone = threading.Event()
    inner = att.detach

    def detach(ws) -> None:
        inner(ws)
        if att.socket is None:
            gone.set()

    att.detach = detach
    return gone


class GatedModel:
    """The simulator behind a gate the test holds: after ``run_for(n)`` the model runs until ``n`` more positions
    have produced agent text, then the next position blocks (``held`` is set) until ``run_for`` or ``release``."""

    def __init__(self) -> None:
        self.inner = SimulatorModel(SimBehaviour(prefill_delay_s=0.05))
        self.held = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self._budget: int | None = None
        self._lock = threading.Lock()

    def run_for(self, text_positions: int) -> None:
        with self._lock:
            self._budget = text_positions
            self.held.clear()
            self._gate.set()

    def release(self) -> None:
        with self._lock:
            self._budget = None
            self._gate.set()

    def prefill(self, prompt: SessionPrompt) -> None:
        self.inner.prefill(prompt)

    def step(self, position: PositionInput) -> StepResult:
        with self._lock:
            hold = self._budget == 0
            if hold:
                self._gate.clear()
                self.held.set()
        if hold:
            self._gate.wait(30)
        result = self.inner.step(position)
        if result.agent.delta:
            with self._lock:
                if self._budget:
                    self._budget -= 1
        return result

    def abort(self) -> None:
        self.release()
        self.inner.abort()


@contextlib.contextmanager
def gated_app(**config) -> Iterator[tuple[str, object, list[GatedModel]]]:
    models: list[GatedModel] = []

    def factory() -> GatedModel:
        models.append(GatedModel())
        return models[-1]

    cfg = ServerConfig.simulator(**config)
    cfg.model_factory = factory
    with running_app(cfg) as (url, app):
        try:
            yield url, app, models
        finally:
            for m in models:
                m.release()


def mid_response(url: str, app, models: list[GatedModel]) -> tuple[RawClient, dict, GatedModel]:
    """A full-lane session whose long answer is held after a few positions, its first socket aborted (no close
    handshake) and the drop noticed by the server: (first client, session.created, model)."""
    a, created = open_full(url)
    model = models[-1]
    model.run_for(3)
    a.send(append(render_speech(LONG)))
    a.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    a.send(append(bytes(48 * INPUT_FRAME_BYTES)))  # silence: positions run on input frames, not paced
    a.recv_type("response.output_audio.delta")
    assert model.held.wait(10)
    gone = watch_detach(app, created["session"]["id"])
    a.ws.socket.close()  # abort the TCP transport
    assert gone.wait(10)
    return a, created, model


# ---------------------------------------------------------------------------------------------------- routing


@pytest.fixture(scope="module")
def url():
    with running_app(ServerConfig.simulator(max_sessions=8, disconnect_grace_s=2.0)) as (base, _):
        yield base


ROUTES = [
    # (path, headers, expected): v3 | off | full | openai, "+auto" when session.created comes unasked
    ("/v1/realtime", {}, "v3"),
    ("/v1/voicechat", {}, "v3"),
    ("/v1/voicechat?model=sim", {}, "v3"),
    ("/v1/realtime?duplex=1", {}, "full"),
    ("/v1/realtime?duplex=TRUE", {}, "full"),
    ("/v1/duplex", {}, "full"),
    ("/v1/duplex?duplex=0", {}, "full"),
    ("/v1/duplex?model=sim", {}, "full+auto"),
    ("/v1/realtime?duplex=1&model=sim", {}, "full+auto"),
    ("/v1/realtime?duplex=1&model=sim&autostart=0", {}, "full"),  # DuplexClient's URL
    ("/v1/realtime?model=sim", {}, "openai+auto"),
    ("/v1/realtime?model=sim&resume=1", {}, "openai"),
    ("/v1/realtime", {"OpenAI-Beta": "realtime=v1"}, "openai"),
    ("/v1/realtime?model=sim", {"openai-beta": "realtime=v1"}, "openai+auto"),
    ("/v1/realtime?duplex=0", {}, "off"),
    ("/v1/realtime?duplex=off&model=sim", {}, "off"),
]


def check_route(url: str, path: str, headers: dict, expected: str) -> None:
    c = HeaderClient(url + path, headers) if headers else RawClient(url + path)
    if expected == "v3":
        first = c.recv()
        assert first["type"] == "session.created" and first["protocol"] == V3_PROTOCOL
        c.close()
        return
    if expected == "off":
        assert c.recv() == DUPLEX_OFF  # the seed's flat answer, byte for byte
        assert closed(c) == (1000, "unsupported")
        return
    lane, _, auto = expected.partition("+")
    if not auto:
        c.send(UPDATE)  # nothing is sent before the first message: session.created is the first event back
    created = c.recv()
    assert created["type"] == "session.created" and "protocol" not in created
    assert "server_event_seq" not in created  # transport-level (§3.7)
    session = created["session"]
    assert session["object"] == "realtime.session"
    # the full lane's ids are the seed's duplex-<id>; the OpenAI lane keeps every id within OpenAI's 32 characters
    assert session["id"].startswith("duplex-") if lane == "full" else (
        session["id"].startswith("sess_") and len(session["id"]) <= 32)
    assert session["capabilities"]["supports_session_resume"] is (lane == "full")
    if lane == "full":
        assert created["attachment_generation"] == 1 and created["resume_token"].startswith("rt_")
    else:
        assert "resume_token" not in created and "attachment_generation" not in created
    if not auto:
        updated = c.recv()
        assert updated["type"] == "session.updated" and updated["server_event_seq"] == 1
        assert updated["session"]["instructions"] == "Be brief."
    close_session(c, full=lane == "full")  # the OpenAI lane never sees the Tier 3 session.closed


@pytest.mark.parametrize(("path", "headers", "expected"), ROUTES,
                         ids=[f"{p}{'+hdr' if h else ''}" for p, h, _ in ROUTES])
def test_routing_matrix(url, path, headers, expected):
    check_route(url, path, headers, expected)


@pytest.mark.parametrize(("default", "expected"), [("tiered", "full"), ("tiered-openai", "openai")])
def test_realtime_default_reroutes_only_the_bare_realtime_path(default, expected):
    with running_app(ServerConfig.simulator(realtime_default=default, disconnect_grace_s=0.5)) as (base, _):
        check_route(base, "/v1/realtime", {}, expected)
        check_route(base, "/v1/voicechat", {}, "v3")
        check_route(base, "/v1/realtime?duplex=1", {}, "full")
        check_route(base, "/v1/realtime?model=sim", {}, "openai+auto")


# ---------------------------------------------------------------------------------------------------- admission


def test_admission_is_shared_by_both_dialects_and_close_frees_the_slot():
    with running_app(ServerConfig.simulator(max_sessions=1, disconnect_grace_s=0.5)) as (base, app):
        released = watch_releases(app)
        v3 = RawClient(base + "/v1/voicechat")
        assert v3.recv()["protocol"] == V3_PROTOCOL

        # an autostart open is refused at accept; a first-message open after its first message (§1.4)
        for path, first in (("/v1/realtime?model=sim", None), ("/v1/duplex", UPDATE)):
            t = RawClient(base + path)
            if first is not None:
                t.send(first)
            e = t.recv()
            assert e == {"type": "error", "event_id": e["event_id"],
                         "error": {"type": "rate_limit_error", "code": "resource_exhausted",
                                   "message": "duplex_session_capacity_exhausted: limit=1", "retryable": True}}
            assert closed(t) == (1013, "resource_exhausted")
        assert app.admission.active == 1

        v3.close()
        assert released.acquire(timeout=10)
        t, _ = open_full(base)  # the freed slot goes to a tiered session
        busy = RawClient(base + "/v1/realtime")  # ... and v3 is now the one turned away
        assert busy.recv()["error"]["code"] == "server_busy"
        assert closed(busy) == (1013, "server_busy")

        close_session(t)  # session.close → session.closed → close 1000
        assert released.acquire(timeout=10)
        assert app.admission.active == 0
        again = RawClient(base + "/v1/voicechat")
        assert again.recv()["type"] == "session.created"
        again.close()


def test_config_timeout_closes_a_silent_handshake_that_holds_no_slot():
    with running_app(ServerConfig.simulator(max_sessions=1, handshake_timeout_s=0.3)) as (base, app):
        silent = RawClient(base + "/v1/duplex")
        v3 = RawClient(base + "/v1/voicechat")  # the silent socket holds no slot
        assert v3.recv()["type"] == "session.created"
        e = silent.recv()
        assert e["type"] == "error" and "server_event_seq" not in e
        assert (e["error"]["type"], e["error"]["code"]) == ("invalid_request_error", "config_timeout")
        assert closed(silent)[0] == 1000
        assert app.admission.active == 1
        v3.close()


def test_openai_lane_drop_frees_the_slot_at_once():
    grace = 10.0
    with running_app(ServerConfig.simulator(max_sessions=1, disconnect_grace_s=grace)) as (base, app):
        released = watch_releases(app)
        c = RawClient(base + "/v1/realtime?model=sim")
        assert c.recv()["type"] == "session.created"
        assert app.admission.active == 1
        t0 = time.monotonic()
        c.ws.socket.close()  # abort: an OpenAI-lane session has no resume, so no grace either
        assert released.acquire(timeout=5)
        assert time.monotonic() - t0 < grace and app.admission.active == 0 and not app.live


# ---------------------------------------------------------------------------------------------------- a spoken turn


def test_spoken_turn_over_duplex_without_commit(url):
    c, created = open_full(url)
    c.send(append(render_speech("hello") + SILENCE))  # no commit: the model-owned EOU answers
    events = c.recv_until(lambda e: e["type"] == "response.done")
    events.append(c.recv_type("rate_limits.updated"))
    done = events[-2]
    assert done["response"]["status"] == "completed"
    assert [e["transcript"] for e in events
            if e["type"] == "conversation.item.input_audio_transcription.completed"] == ["hello"]
    transcript = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert transcript == ["You said: hello."]
    assert audio_text(events) == "You said: hello."
    assert len([e for e in events if e["type"] == "response.created"]) == 1
    # every journaled event carries the next server_event_seq; only session.created is seq-less
    assert all("server_event_seq" in e for e in c.received[1:])
    assert seqs(c.received) == list(range(1, len(c.received)))
    ids = [e["event_id"] for e in c.received]
    assert len(ids) == len(set(ids))
    close_session(c)


# ---------------------------------------------------------------------------------------------------- resume


def test_resume_mid_response_replays_the_gap_then_continues_live():
    with gated_app(max_sessions=2, disconnect_grace_s=10.0) as (base, app, models):
        a, created, model = mid_response(base, app, models)
        model.run_for(1)  # one more text position while detached: journaled, sent nowhere
        assert model.held.wait(10)
        last = a.received[-1]["server_event_seq"]  # the client's cursor: the last event it actually read

        b = RawClient(base + "/v1/duplex?autostart=0")
        b.send(resume(created, last, event_id="r1"))
        resumed = b.recv()
        assert resumed["type"] == "session.resumed" and "server_event_seq" not in resumed
        assert resumed["session_id"] == created["session"]["id"] and resumed["attachment_generation"] == 2
        assert resumed["resume_token"].startswith("rt_") and resumed["resume_token"] != created["resume_token"]
        model.release()
        rest = b.recv_until(lambda e: e["type"] == "response.done")
        rest.append(b.recv_type("rate_limits.updated"))

        # contiguous and duplicate-free across both sockets: the replay starts right after the cursor
        first_seqs, second_seqs = seqs(a.received), seqs(b.received)
        assert second_seqs[0] == last + 1
        assert first_seqs + second_seqs == list(range(1, second_seqs[-1] + 1))
        everything = a.received + b.received
        assert rest[-2]["response"]["status"] == "completed"
        expected = f"You said: {LONG}."
        assert [e["transcript"] for e in everything if e["type"] == "response.output_audio_transcript.done"] == [
            expected]
        assert audio_text(everything) == expected
        assert len([e for e in everything if e["type"] == "response.created"]) == 1

        # the rotated-out token is refused; the resumed socket is unaffected and the new token is the valid one
        old = RawClient(base + "/v1/duplex?autostart=0")
        old.send(resume(created, second_seqs[-1]))
        refusal(old, "invalid_resume_token")
        b.send({"type": "session.heartbeat"})
        ack = b.recv_type("session.heartbeat_ack")
        assert ack["server_event_seq"] == second_seqs[-1] + 1
        close_session(b)


def test_a_resume_takes_in_what_the_dropped_socket_delivered_before_it_answers_the_input_receipt():
    """§6.5: frames the server read from the old socket but had not handed to the session yet (its model was inside
    a step) are taken in before ``session.resumed`` reports the input receipt: a client resends exactly the rest."""
    with gated_app(max_sessions=2, disconnect_grace_s=10.0) as (base, app, models):
        a, created = open_full(base)
        sid = created["session"]["id"]
        model = models[-1]
        model.run_for(1)
        speech, silence = render_speech(LONG), bytes(48 * INPUT_FRAME_BYTES)
        a.send({**append(speech), "event_id": "s1"})
        a.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
        a.send({**append(silence), "event_id": "s2"})
        a.recv_type("response.output_audio.delta")
        assert model.held.wait(10)  # the shell waits for a step: what a sends now stays in its inbox
        att = app.live[sid].attachment
        offered = threading.Semaphore(0)
        inner_offer = att.shell.offer_nowait  # both read paths hand frames over through it

        def offer_nowait(message):
            taken = inner_offer(message)
            if taken is not None:
                offered.release()
            return taken

        att.shell.offer_nowait = offer_nowait
        for i in range(3):
            a.send({**append(bytes(2560)), "event_id": f"x{i}"})
        assert all(offered.acquire(timeout=10) for _ in range(3))
        assert att.shell.inbox_messages == 3
        gone = watch_detach(app, sid)
        a.ws.socket.close()
        assert gone.wait(10)

        settling = threading.Event()
        inner_settled = att.settled

        async def settled():
            settling.set()
            await inner_settled()

        att.settled = settled
        b = RawClient(base + "/v1/duplex?autostart=0")
        b.send(resume(created, a.received[-1]["server_event_seq"]))
        assert settling.wait(10)
        model.release()  # the step returns; the three frames reach the session; only then the answer
        resumed = b.recv()
        assert resumed["type"] == "session.resumed"
        assert resumed["input_received"] == {"audio_bytes": len(speech) + len(silence) + 3 * 2560, "appends": 5,
                                             "last_append_event_id": "x2"}
        close_session(b)


def test_takeover_while_attached_replaces_the_old_socket(url):
    a, created = open_full(url)
    b = RawClient(url + "/v1/duplex?autostart=0")
    b.send(resume(created, 1))  # seq 1 = session.updated, the last event a read
    resumed = b.recv()
    assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 2
    replaced = a.recv()
    assert replaced == {"type": "session.replaced", "event_id": replaced["event_id"],
                        "session_id": created["session"]["id"], "attachment_generation": 1}
    assert closed(a) == (1000, "session_replaced")
    # the session lives on through b, seqs continuing after the cursor
    b.send(append(render_speech("hello") + SILENCE))
    events = b.recv_until(lambda e: e["type"] == "response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert seqs(events) == list(range(2, 2 + len(events)))
    close_session(b)


def test_an_openai_lane_url_cannot_resume_a_full_lane_session(url):
    """The OpenAI lane has no resume (§13): a first-message session.resume on its URL is refused, and the full-lane
    session it named is untouched."""
    a, created = open_full(url)
    b = RawClient(url + "/v1/realtime?model=sim&resume=1")
    b.send({**resume(created, 1), "event_id": "r1"})
    err = refusal(b, "unsupported_session_resume")["error"]
    assert err["event_id"] == "r1"
    a.send({"type": "session.heartbeat"})
    assert a.recv_type("session.heartbeat_ack")["server_event_seq"] == 2  # still attached to a
    close_session(a)


def test_a_wrong_token_is_refused_without_waiting_for_the_session():
    """A resume settles the session's input before it answers (its receipt counts what the old socket sent), but a
    token that is not the session's is refused first: a wrong-token storm never pauses a live session."""
    with gated_app(max_sessions=2) as (base, app, models):
        a, created = open_full(base)
        model = models[-1]
        model.run_for(0)  # the session's next position blocks at the gate
        a.send(append(render_speech("hello") + SILENCE))
        assert model.held.wait(10)
        a.send({"type": "session.heartbeat"})  # a frame the held session has not taken in
        b = RawClient(base + "/v1/duplex?autostart=0")
        b.send(resume(created, 1, token="rt_not_the_token"))
        refusal(b, "invalid_resume_token")
        assert model.held.is_set()  # answered while the session could take nothing in
        model.release()
        close_session(a)


def test_resume_refusals_are_seq_less_and_close(url):
    unknown = RawClient(url + "/v1/duplex?autostart=0")
    unknown.send({"type": "session.resume", "event_id": "r9", "session_id": "duplex-nope", "resume_token": "rt_x"})
    assert refusal(unknown, "session_resume_expired")["error"]["event_id"] == "r9"

    a, created = open_full(url)
    # journal_gap: the client acked past its own cursor (a heartbeat round trip orders the ack before the resume)
    a.send({"type": "session.heartbeat"})
    a.send({"type": "session.heartbeat"})
    assert [a.recv_type("session.heartbeat_ack")["server_event_seq"] for _ in range(2)] == [2, 3]
    a.send({"type": "session.event_ack", "server_event_seq": 3})
    a.send({"type": "session.heartbeat"})
    assert a.recv_type("session.heartbeat_ack")["server_event_seq"] == 4
    gap = RawClient(url + "/v1/duplex?autostart=0")
    gap.send(resume(created, 1))
    e = gap.recv()
    assert e == {"type": "session.resync_required", "event_id": e["event_id"],
                 "session_id": created["session"]["id"], "reason": "journal_gap"}
    assert closed(gap)[0] == 1000

    ahead = RawClient(url + "/v1/duplex?autostart=0")
    ahead.send(resume(created, 99))
    refusal(ahead, "session_resume_conflict")
    forged = RawClient(url + "/v1/duplex?autostart=0")
    forged.send(resume(created, 4, token="rt_forged"))
    refusal(forged, "invalid_resume_token")

    # a later session.resume is a non-fatal, journaled error; the attached socket never noticed any of the above
    a.send(resume(created, 4, event_id="late"))
    late = a.recv_type("error")
    assert (late["error"]["code"], late["error"]["event_id"], late["server_event_seq"]) == (
        "unsupported_session_resume", "late", 5)
    close_session(a)

    o = RawClient(url + "/v1/realtime?model=sim")
    o_created = o.recv()
    other = RawClient(url + "/v1/duplex?autostart=0")
    other.send({"type": "session.resume", "session_id": o_created["session"]["id"], "resume_token": "rt_x"})
    refusal(other, "unsupported_session_resume")
    close_session(o, full=False)


def test_grace_expiry_releases_the_slot_and_a_late_resume_is_expired():
    grace = 0.5
    with running_app(ServerConfig.simulator(max_sessions=1, disconnect_grace_s=grace)) as (base, app):
        released = watch_releases(app)
        a, created = open_full(base)
        t0 = time.monotonic()
        a.ws.socket.close()  # abort; nobody resumes
        assert released.acquire(timeout=10)
        assert time.monotonic() - t0 >= grace  # the detached session kept its slot through the grace period
        assert app.admission.active == 0 and not app.live
        late = RawClient(base + "/v1/duplex?autostart=0")
        late.send(resume(created, 1))
        refusal(late, "session_resume_expired")


def test_journal_overflow_is_announced_once_live_and_refuses_resume():
    with running_app(ServerConfig.simulator(journal_max_bytes=4096, disconnect_grace_s=0.5)) as (base, app):
        a, created = open_full(base)
        a.send(append(render_speech("hello") + SILENCE))
        events = a.recv_until(lambda e: e["type"] == "response.done")
        notices = [e for e in events if e["type"] == "session.resync_required"]
        assert len(notices) == 1 and notices[0]["reason"] == "journal_overflow"
        assert "server_event_seq" not in notices[0]
        assert seqs(a.received) == list(range(1, len(a.received) - 1))  # seqs keep counting past the overflow
        last = a.received[-1]["server_event_seq"]
        gone = watch_detach(app, created["session"]["id"])
        a.ws.socket.close()
        assert gone.wait(10)
        b = RawClient(base + "/v1/duplex?autostart=0")
        b.send(resume(created, last))
        e = b.recv()
        assert (e["type"], e["reason"]) == ("session.resync_required", "journal_overflow")
        assert "server_event_seq" not in e
        assert closed(b)[0] == 1000


# ---------------------------------------------------------------------------------------------------- regressions (bugs found while writing these tests)


def test_resume_while_the_drop_is_still_queued_keeps_the_session_attached():
    grace = 0.3
    with gated_app(max_sessions=2, disconnect_grace_s=grace) as (base, app, models):
        a, created, model = mid_response(base, app, models)  # the shell is blocked in a position: Detached waits
        b = RawClient(base + "/v1/duplex?autostart=0")
        try:
            b.send(resume(created, a.received[-1]["server_event_seq"]))
            assert b.recv()["type"] == "session.resumed"
            model.release()
            end = b.recv_until(lambda e: e["type"] in ("response.done", *TERMINAL))[-1]
            assert end["type"] == "response.done" and end["response"]["status"] == "completed", end
            later, close = events_within(b, 4 * grace)
            assert [e["type"] for e in later if e["type"] in TERMINAL] == [] and close is None
            b.send({"type": "session.heartbeat"})
            assert b.recv_type("session.heartbeat_ack")
        finally:
            quietly_close(b)


def test_invalid_first_resume_is_refused_without_opening_a_session():
    with running_app(ServerConfig.simulator(max_sessions=1, disconnect_grace_s=0.5)) as (base, app):
        c = RawClient(base + "/v1/duplex?autostart=0", timeout=3)
        try:
            c.send({"type": "session.resume", "event_id": "r1", "session_id": "duplex-x"})  # no resume_token
            refusal(c, "invalid_session_resume")
        finally:
            quietly_close(c)


def test_any_other_first_message_opens_a_default_session():
    with running_app(ServerConfig.simulator(disconnect_grace_s=0.5)) as (base, app):
        c = RawClient(base + "/v1/duplex", timeout=3)
        try:
            c.send({"type": "session.heartbeat"})
            first = c.recv()
            assert first["type"] == "session.created" and first["resume_token"].startswith("rt_")
            assert c.recv_type("session.heartbeat_ack")["server_event_seq"] >= 1
        finally:
            quietly_close(c)


def test_server_shutdown_ends_a_dropped_session_instead_of_waiting_out_its_grace():
    """uvicorn's graceful shutdown waits for every ASGI task; a detached session lives in one for its grace."""
    released = threading.Event()
    with running_app(ServerConfig.simulator(settlement_blank_frames=2, disconnect_grace_s=600.0)) as (base, server):
        server.admission.on_release = released.set
        c = RawClient(base + "/v1/duplex")
        c.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        c.recv_until(lambda e: e["type"] == "session.updated")
        c.ws.close_socket()  # a drop: the session waits for a resume
    # the fixture joined the server thread (30 s at most): it only returns early if the session was ended
    assert released.is_set() and not server.live



class _Order:
    """A trace observer that logs when the server writes a close frame, beside the admission's releases."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def client_event(self, message) -> None:
        pass

    def server_event(self, message) -> None:
        pass

    def transport_closed(self, code) -> None:
        if code is not None:
            self.log.append(f"close {code}")


def test_a_session_s_slot_is_free_before_its_close_frame_is_written():
    """The slot is released when the session has ended (its model released), before the socket's close
    handshake: a client that has seen the close frame can open its next session at once (no window in which
    /health still counts it, or a reconnect is refused as busy). Both dialects, stop and close."""
    log: list[str] = []
    config = ServerConfig.simulator(max_sessions=1, trace_factory=lambda dialect: _Order(log))
    with running_app(config) as (base, app):
        app.admission.on_release = lambda: log.append("release")
        v3 = RawClient(base + "/v1/voicechat")
        assert v3.recv()["type"] == "session.created"
        v3.send({"type": "session.stop", "event_id": "stop-1"})
        assert closed(v3)[0] == 1000
        assert app.admission.active == 0
        t, _ = open_full(base)
        close_session(t)
        assert app.admission.active == 0
    assert log == ["release", "close 1000", "release", "close 1000"]
