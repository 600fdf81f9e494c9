"""v3 error contract over real WebSockets: every error code that exists without function calls.

Each test drives a real uvicorn server (``tests.server_fixture``) with the raw JSON client and asserts the exact
error envelope ``{"type":"error", event_id, session_id, "error":{code, message, fatal, client_event_id?,
...details}}`` (contract §2, §4, §11). Recoverable errors must leave the session usable (a later valid turn still
reaches ``response.done``); fatal errors must be followed by the contract's close code, with ``session.closed``
only where §11 says so.

Most tests share one module-scoped server (each test opens its own session); tests that need a special server
configuration (scripted model behaviour, small limits, no synthesizer, one slot) start their own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.server import ServerConfig
from vllm_omni_voicechat.sim.model import SimBehaviour, SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

from .server_fixture import RawClient, running_app

MISSING: Any = object()
"""A key that must be absent from an error, or a field left out of a client event."""
ANY: Any = object()
"""``client_event_id`` is not checked (the contract does not say whether this error echoes one)."""

FRAME_BYTES = 2560  # 1,280 PCM16 samples = one 80 ms model position
LOUD_FRAME = bytes([0x00, 0x40] * (FRAME_BYTES // 2))  # constant 0x4000: far above the input gate
MAX_APPEND = 40_960
FENCE = 3  # settlement fence of the test servers (keeps turns short)

CLOSE_NORMAL, CLOSE_PROTOCOL, CLOSE_INTERNAL, CLOSE_BUSY = 1000, 1002, 1011, 1013

WEATHER = {
    "type": "function",
    "function": {
        "name": "lookup_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_NORMALIZED = {
    "name": "lookup_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CLOCK = {"name": "get_time", "description": "The time."}  # NVIDIA style, default parameters
CLOCK_NORMALIZED = {"name": "get_time", "description": "The time.", "parameters": {"type": "object", "properties": {}}}


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode("ascii")


def append_msg(*, event_id: Any = "append-1", **fields: Any) -> dict:
    """A valid one-frame silent ``input_audio_buffer.append``; overrides set to MISSING are left out."""
    msg: dict[str, Any] = {
        "type": "input_audio_buffer.append",
        "event_id": event_id,
        "encoding": "pcm16",
        "sample_rate": 16000,
        "channels": 1,
        "audio": b64(bytes(FRAME_BYTES)),
    }
    msg.update(fields)
    return {k: v for k, v in msg.items() if v is not MISSING}


def turn_start(client_turn_id: Any = 1, event_id: Any = "start-1") -> dict:
    msg = {"type": "input_audio_buffer.turn_start", "event_id": event_id, "client_turn_id": client_turn_id}
    return {k: v for k, v in msg.items() if v is not MISSING}


def commit(client_turn_id: Any = 1, event_id: Any = "commit-1") -> dict:
    msg = {"type": "input_audio_buffer.commit", "event_id": event_id, "client_turn_id": client_turn_id}
    return {k: v for k, v in msg.items() if v is not MISSING}


def typed(job_id: Any, text: Any = "Hello there") -> dict:
    msg = {"type": "input_text.request", "event_id": f"typed-{job_id}", "job_id": job_id, "text": text}
    return {k: v for k, v in msg.items() if v is not MISSING}


def update(event_id: str = "update-1", **session: Any) -> dict:
    session.setdefault("protocol_version", 3)
    body = {k: v for k, v in session.items() if v is not MISSING}
    return {"type": "session.update", "event_id": event_id, "session": body}


# ================================================================ servers and clients


@dataclass
class Server:
    url: str
    models: list[SimulatorModel] = field(default_factory=list)
    """Every model the server created, in connection order (tests run one session at a time)."""
    released: threading.Event = field(default_factory=threading.Event)
    """Set whenever a session slot is freed (the app's admission reports it)."""

    def wait_released(self, timeout: float = 5.0) -> None:
        assert self.released.wait(timeout), "the session slot was not released"
        self.released.clear()

    @property
    def ws(self) -> str:
        return self.url + "/v1/realtime"

    def health(self) -> dict:
        with urllib.request.urlopen(self.url.replace("ws://", "http://", 1) + "/health", timeout=5) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def serve(config: ServerConfig) -> Iterator[Server]:
    """``running_server`` with the created models recorded (so tests can see prefills)."""
    models: list[SimulatorModel] = []
    factory = config.model_factory

    def recording_factory():
        model = factory()
        models.append(model)
        return model

    config.model_factory = recording_factory
    with running_app(config) as (url, app_server):
        srv = Server(url, models)
        app_server.admission.on_release = srv.released.set
        yield srv


QUICK = SimBehaviour(reply_template="Ok.", tail_positions=0)
"""A terse simulator: each reply is one paced position plus its end, so turns take a fraction of a second."""


def sim_config(behaviour: SimBehaviour = QUICK, **kw: Any) -> ServerConfig:
    kw.setdefault("settlement_blank_frames", FENCE)
    kw.setdefault("prefill_delay_s", 0.005)
    return ServerConfig.simulator(behaviour=behaviour, **kw)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve(sim_config(max_sessions=8)) as srv:
        yield srv


_open_clients: list[V3Client] = []


@pytest.fixture(autouse=True)
def _event_ids_unique_and_clients_closed():
    """Every server event_id is unique within its session; every client is closed after its test."""
    yield
    clients = list(_open_clients)
    _open_clients.clear()
    for c in clients:
        with contextlib.suppress(Exception):
            c.raw.close()
    for c in clients:
        ids = [e["event_id"] for e in c.raw.received]
        assert len(ids) == len(set(ids)), "duplicate server event_id"
        assert all(isinstance(i, str) and i for i in ids)


class V3Client:
    """The raw JSON client plus contract-level assertions (metrics are skipped when reading events)."""

    def __init__(self, url: str, *, expect_created: bool = True) -> None:
        self.raw = RawClient(url)
        _open_clients.append(self)
        self.session_id: str | None = None
        self.created: dict | None = None
        self._sync = 0
        if expect_created:
            self.created = self.raw.recv()
            assert self.created["type"] == "session.created"
            self.session_id = self.created["session_id"]
            assert self.created["session"]["id"] == self.session_id

    def send(self, event: dict | str | bytes) -> None:
        self.raw.send(event)

    def next(self) -> dict:
        """The next event that is not ``voicechat.metrics``."""
        while True:
            e = self.raw.recv()
            assert e.get("session_id") == self.session_id
            if e["type"] != "voicechat.metrics":
                return e

    def until(self, predicate) -> list[dict]:
        out = []
        while True:
            out.append(self.next())
            if predicate(out[-1]):
                return out

    def until_all(self, *types: str) -> list[dict]:
        """Events until each of ``types`` has been seen (in any order)."""
        missing = set(types)
        out = []
        while missing:
            out.append(self.next())
            missing.discard(out[-1]["type"])
        return out

    def expect_error(
        self, code: str, *, fatal: bool, client_event_id: Any = MISSING, details: dict | None = None
    ) -> dict:
        """The next event is exactly this error; ``details`` (when given) are all the code-specific keys."""
        e = self.next()
        assert_error(e, self.session_id, code, fatal=fatal, client_event_id=client_event_id, details=details)
        return e["error"]

    def sync(self) -> None:
        """Prove that nothing else was sent before the answer to a side-effect-free probe."""
        self._sync += 1
        probe = f"probe.{self._sync}"
        self.send({"type": probe, "event_id": f"probe-{self._sync}"})
        err = self.expect_error("unsupported_event", fatal=False, client_event_id=f"probe-{self._sync}", details={})
        assert err["message"] == f"Unsupported event: {probe}"

    def configure(self, event_id: str = "update-1", **session: Any) -> dict:
        """Send a ``session.update`` and return its ``session.updated`` (the very next event)."""
        self.send(update(event_id, **session))
        e = self.next()
        assert e["type"] == "session.updated", e
        assert e["session"]["id"] == self.session_id
        assert e["session"]["protocol_version"] == 3
        return e

    def turn(self, client_turn_id: int, text: str = "Hi") -> list[dict]:
        """A complete valid microphone turn: its events up to ``response.done`` (which must be ``completed``)."""
        self.send(turn_start(client_turn_id, f"start-{client_turn_id}"))
        self.send(append_msg(event_id=f"append-{client_turn_id}", audio=b64(render_speech(text))))
        self.send(commit(client_turn_id, f"commit-{client_turn_id}"))
        events = self.until(lambda e: e["type"] in ("response.done", "error"))
        by_type = {e["type"]: e for e in events}
        assert "error" not in by_type, by_type.get("error")
        started = by_type["input_audio_buffer.turn_started"]
        committed = by_type["input_audio_buffer.committed"]
        assert started["client_event_id"] == f"start-{client_turn_id}"
        assert committed["client_event_id"] == f"commit-{client_turn_id}"
        assert started["client_turn_id"] == committed["client_turn_id"] == client_turn_id
        assert committed["turn_id"] == started["turn_id"] == by_type["response.created"]["turn_id"]
        assert by_type["response.done"]["status"] == "completed"
        return events

    def close_code(self) -> int | None:
        return self.raw.close_code()

    def types(self) -> list[str]:
        return [e["type"] for e in self.raw.received if e["type"] != "voicechat.metrics"]


def assert_error(
    e: dict,
    session_id: str | None,
    code: str,
    *,
    fatal: bool,
    client_event_id: Any = MISSING,
    details: dict | None = None,
) -> None:
    assert e["type"] == "error", e
    assert set(e) == {"type", "event_id", "session_id", "error"}, e
    assert isinstance(e["event_id"], str) and e["event_id"]
    if session_id is not None:
        assert e["session_id"] == session_id
    err = e["error"]
    assert err["code"] == code, err
    assert err["fatal"] is fatal, err
    assert isinstance(err["message"], str) and err["message"], err
    if client_event_id is MISSING:
        assert "client_event_id" not in err, err
    elif client_event_id is not ANY:
        assert err["client_event_id"] == client_event_id, err
    if details is not None:
        extra = {k: v for k, v in err.items() if k not in ("code", "message", "fatal", "client_event_id")}
        assert extra == details, err


def connect(server: Server) -> V3Client:
    return V3Client(server.ws)


def configured(server: Server, **session: Any) -> V3Client:
    c = connect(server)
    c.configure(**session)
    return c


def model_of(server: Server) -> SimulatorModel:
    """The model of the session that just got its ``session.updated`` (sessions run one at a time here)."""
    assert server.models
    return server.models[-1]


def assert_model_aborted(server: Server) -> None:
    """Called right after the fatal error arrived: the model was aborted before it was published (§11)."""
    assert model_of(server).aborted


def assert_fatal_close(c: V3Client, code: int, *, session_closed: tuple[str, str] | None) -> None:
    """After a fatal error: the socket closes with ``code`` and the fatal error's code as its reason;
    ``session.closed`` only where §11 says so."""
    assert c.close_code() == code
    fatal_codes = [e["error"]["code"] for e in c.raw.received if e["type"] == "error" and e["error"]["fatal"]]
    assert fatal_codes and c.raw.close_reason == fatal_codes[0]
    closed = [e for e in c.raw.received if e["type"] == "session.closed"]
    if session_closed is None:
        assert closed == []
    else:
        assert [(e["status"], e["reason"]) for e in closed] == [session_closed]
        # session.closed is the last event, after the fatal error
        assert c.raw.received[-1]["type"] == "session.closed"
        fatal = [i for i, e in enumerate(c.raw.received) if e["type"] == "error" and e["error"]["fatal"]]
        assert fatal and fatal[-1] < len(c.raw.received) - 1


# ================================================================ framing (§4, §11)


def test_invalid_json_is_recoverable_before_and_after_configuration(server):
    c = connect(server)
    c.send("{not json")
    c.expect_error("invalid_json", fatal=False, details={})
    c.sync()
    c.configure()
    c.send('{"type": "session.update", ')
    c.expect_error("invalid_json", fatal=False, details={})
    c.sync()
    c.turn(1)


@pytest.mark.parametrize(
    "frame", ["[]", '[{"type": "session.update"}]', "42", "3.5", '"session.update"', "null", "true"]
)
def test_non_object_json_is_invalid_event(server, frame):
    c = configured(server)
    c.send(frame)
    c.expect_error("invalid_event", fatal=False, details={})
    c.sync()


def test_session_survives_every_non_object_frame(server):
    c = configured(server)
    for frame in ["[]", "42", '"x"', "null", "false"]:
        c.send(frame)
        c.expect_error("invalid_event", fatal=False, details={})
    c.sync()
    c.turn(1)


def test_binary_frame_is_binary_audio_unsupported(server):
    c = connect(server)
    c.send(bytes(FRAME_BYTES))
    c.expect_error("binary_audio_unsupported", fatal=False, details={})
    c.configure()
    c.send(LOUD_FRAME)
    c.expect_error("binary_audio_unsupported", fatal=False, details={})
    c.sync()
    c.turn(1)


@pytest.mark.parametrize(
    "type_",
    [
        "response.create",
        "response.cancel",
        "input_audio_buffer.clear",
        "session.close",
        "conversation.item.delete",
        "x",
    ],
)
def test_unknown_and_non_v3_types_are_unsupported_event(server, type_):
    c = configured(server)
    c.send({"type": type_, "event_id": "evt-unsupported"})
    err = c.expect_error("unsupported_event", fatal=False, client_event_id="evt-unsupported", details={})
    assert err["message"] == f"Unsupported event: {type_}"
    c.send({"type": type_})  # without event_id: nothing to echo
    err = c.expect_error("unsupported_event", fatal=False, details={})
    assert err["message"] == f"Unsupported event: {type_}"
    c.send({"type": type_, "event_id": "e" * 257})  # too long to echo: none (no amplification)
    err = c.expect_error("unsupported_event", fatal=False, details={})
    c.sync()


def test_client_created_responses_and_clears_do_nothing(server):
    c = configured(server)
    c.send(turn_start(1, "start-1"))
    c.send(append_msg(audio=b64(render_speech("Hi"))))
    not_v3 = ["response.create", "response.cancel", "input_audio_buffer.clear", "session.close"]
    for type_ in not_v3:
        c.send({"type": type_, "event_id": type_})
    c.send(commit(1, "commit-1"))
    events = c.until(lambda e: e["type"] == "response.done")
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["error"]["code"], e["error"]["client_event_id"]) for e in errors] == [
        ("unsupported_event", t) for t in not_v3
    ]
    assert events[-1]["status"] == "completed"  # nothing was cancelled, cleared or closed
    assert [e["type"] for e in events].count("response.created") == 1
    c.turn(2)


def test_event_without_type_is_unsupported_event(server):
    c = configured(server)
    c.send({"event_id": "no-type"})
    c.expect_error("unsupported_event", fatal=False, client_event_id="no-type", details={})
    c.sync()
    c.turn(1)


# ================================================================ session.update (§3.2)


@pytest.mark.parametrize(
    "version",
    [MISSING, 2, 4, "3", True, 3.0, None],
    ids=["missing", "2", "4", "string-3", "true", "float-3.0", "null"],
)
def test_first_update_with_wrong_protocol_version_is_fatal_1002_with_session_closed(server, version):
    c = connect(server)
    c.send(update("update-bad", protocol_version=version, instructions="x"))
    c.expect_error(
        "unsupported_protocol_version",
        fatal=True,
        client_event_id="update-bad",
        details={"requested_version": None if version is MISSING else version},
    )
    e = c.next()
    assert (e["type"], e["status"], e["reason"]) == ("session.closed", "failed", "unsupported_protocol_version")
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=("failed", "unsupported_protocol_version"))
    assert "session.updated" not in c.types()


@pytest.mark.parametrize("version", [2, "3", True], ids=["2", "string-3", "true"])
def test_later_update_with_wrong_protocol_version_is_recoverable(server, version):
    c = configured(server, instructions="first")
    prefills = model_of(server).prefills
    c.send(update("update-2", protocol_version=version, instructions="second"))
    c.expect_error(
        "unsupported_protocol_version", fatal=False, client_event_id="update-2", details={"requested_version": version}
    )
    # nothing changed: the identical update re-acks the first settings without a restart
    acked = c.configure("update-3", instructions="first")
    assert acked["session"]["instructions"] == "first"
    assert model_of(server).prefills == prefills
    # a later update may omit the version
    c.send({"type": "session.update", "event_id": "update-4", "session": {"instructions": "first"}})
    assert c.next()["type"] == "session.updated"
    c.turn(1)


@pytest.mark.parametrize("session", [MISSING, "x", [], None, 3], ids=["missing", "string", "list", "null", "number"])
def test_session_not_an_object_is_invalid_session_update(server, session):
    c = connect(server)
    msg: dict[str, Any] = {"type": "session.update", "event_id": "update-bad"}
    if session is not MISSING:
        msg["session"] = session
    c.send(msg)  # before the first configuration: still recoverable (rule 2 precedes the version rule)
    c.expect_error("invalid_session_update", fatal=False, client_event_id="update-bad", details={})
    c.sync()
    c.configure()
    c.send(msg)
    c.expect_error("invalid_session_update", fatal=False, client_event_id="update-bad", details={})
    c.turn(1)


@pytest.mark.parametrize("caps", ["client_authored_v1", [], 1, True], ids=["string", "list", "number", "true"])
def test_capabilities_not_an_object_is_invalid_session_capabilities(server, caps):
    c = connect(server)
    c.send(update("update-bad", capabilities=caps))
    c.expect_error("invalid_session_capabilities", fatal=False, client_event_id="update-bad", details={})
    c.sync()  # the session is still unconfigured: the rejected update was not the (fatal) first update
    c.send(append_msg())
    c.expect_error("session_not_configured", fatal=False, client_event_id="append-1", details={})
    c.configure()
    c.send(update("update-bad-2", capabilities=caps))
    c.expect_error("invalid_session_capabilities", fatal=False, client_event_id="update-bad-2", details={})
    c.turn(1)


@pytest.mark.parametrize("mode", ["other", "client_authored_v2", {"mode": "client_authored_v1"}, 1])
def test_unknown_model_output_mode_is_unsupported_session_capability(server, mode):
    c = connect(server)
    c.send(update("update-bad", capabilities={"function_output_model_output": mode}))
    c.expect_error("unsupported_session_capability", fatal=False, client_event_id="update-bad", details={})
    acked = c.configure(capabilities={"function_output_model_output": "client_authored_v1"})
    assert acked["session"]["capabilities"] == {"function_output_model_output": "client_authored_v1"}
    c.send(update("update-bad-2", capabilities={"function_output_model_output": mode}))
    c.expect_error("unsupported_session_capability", fatal=False, client_event_id="update-bad-2", details={})
    c.turn(1)


def _tools_named(*names: Any) -> list[dict]:
    return [{"name": n, "description": "", "parameters": {"type": "object", "properties": {}}} for n in names]


INVALID_TOOLS = {
    "33-tools": [dict(t) for t in _tools_named(*(f"tool_{i}" for i in range(33)))],
    "name-leading-digit": _tools_named("1lookup"),
    "name-with-space": _tools_named("lookup weather"),
    "name-with-dot": _tools_named("lookup.weather"),
    "name-empty": _tools_named(""),
    "name-129-chars": _tools_named("a" * 129),
    "name-not-string": _tools_named(5),
    "name-missing": [{"description": "no name", "parameters": {"type": "object", "properties": {}}}],
    "openai-name-invalid": [{"type": "function", "function": {"name": "bad name", "parameters": {}}}],
    "collision-after-dash-mapping": _tools_named("lookup-weather", "lookup_weather"),
    "duplicate-name": _tools_named("lookup", "lookup"),
    "parameters-string": [{"name": "lookup", "parameters": "object"}],
    "parameters-list": [{"name": "lookup", "parameters": []}],
    "parameters-number": [{"type": "function", "function": {"name": "lookup", "parameters": 1}}],
    "entry-string": ["lookup_weather"],
    "entry-number": [WEATHER, 7],
    "entry-null": [None],
    "tools-not-a-list": {"name": "lookup"},
}


@pytest.mark.parametrize("tools", list(INVALID_TOOLS.values()), ids=list(INVALID_TOOLS))
def test_invalid_tools_is_recoverable_and_changes_nothing(server, tools):
    c = configured(server, instructions="base", tools=[WEATHER])
    model = model_of(server)
    assert model.prefills == 1
    c.send(update("update-bad", instructions="changed", tools=tools))
    c.expect_error("invalid_tools", fatal=False, client_event_id="update-bad", details={})
    assert model.prefills == 1  # no restart
    # no mutation: the update identical to the first one is a pure re-ack
    acked = c.configure("update-same", instructions="base", tools=[WEATHER])
    assert acked["session"]["instructions"] == "base"
    assert acked["session"]["tools"] == [WEATHER_NORMALIZED]
    assert model.prefills == 1


def test_session_survives_every_invalid_tools_update(server):
    c = configured(server, instructions="base", tools=[WEATHER])
    model = model_of(server)
    for name, tools in INVALID_TOOLS.items():
        c.send(update(f"bad-{name}", instructions="changed", tools=tools))
        c.expect_error("invalid_tools", fatal=False, client_event_id=f"bad-{name}", details={})
    acked = c.configure("update-same", instructions="base", tools=[WEATHER])
    assert (acked["session"]["instructions"], acked["session"]["tools"]) == ("base", [WEATHER_NORMALIZED])
    assert model.prefills == 1
    c.turn(1)


def test_invalid_tools_on_first_update_leaves_session_unconfigured(server):
    c = connect(server)
    c.send(update("update-bad", tools=_tools_named("lookup-weather", "lookup_weather")))
    c.expect_error("invalid_tools", fatal=False, client_event_id="update-bad", details={})
    c.send(append_msg())
    c.expect_error("session_not_configured", fatal=False, client_event_id="append-1", details={})
    acked = c.configure(tools=_tools_named(*(f"tool_{i}" for i in range(32))))  # 32 is the maximum
    assert [t["name"] for t in acked["session"]["tools"]] == [f"tool_{i}" for i in range(32)]
    c.turn(1)


def test_tool_name_with_trailing_newline_is_invalid_tools(server):
    c = configured(server)
    c.send(update("update-bad", tools=_tools_named("lookup\n")))
    c.expect_error("invalid_tools", fatal=False, client_event_id="update-bad", details={})


def test_settings_locked_after_turn_start_without_audio(server):
    c = configured(server, instructions="base")
    c.send(turn_start(1, "start-1"))
    assert [e["type"] for e in c.until(lambda e: e["type"] == "input_audio_buffer.turn_started")] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.turn_started",
    ]
    for i, msg in enumerate(
        [
            update("u-changed", instructions="changed"),
            update("u-identical", instructions="base"),
            # the lock is checked first: an invalid or wrong-version update also gets settings_locked
            {"type": "session.update", "event_id": "u-invalid", "session": "x"},
            update("u-version", protocol_version=2),
            update("u-tools", tools=_tools_named("a-b", "a_b")),
        ]
    ):
        c.send(msg)
        c.expect_error("settings_locked", fatal=False, client_event_id=msg["event_id"], details={})
    # the open turn is unaffected
    c.send(commit(1, "commit-1"))
    events = c.until(lambda e: e["type"] == "response.done")
    assert events[0]["type"] == "input_audio_buffer.committed"
    assert events[-1]["status"] == "completed"
    # still locked once model positions have run
    c.send(update("u-after", instructions="base"))
    c.expect_error("settings_locked", fatal=False, client_event_id="u-after", details={})
    c.turn(2)


def test_settings_locked_after_typed_request(server):
    c = configured(server, instructions="base")
    c.send(typed("job-1", "Hello there"))
    c.send(update("u-locked", instructions="changed"))
    events = c.until_all("error", "input_text.injection_finished", "response.done")
    assert (events[0]["type"], events[0]["job_id"]) == ("input_text.accepted", "job-1")
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1
    assert_error(errors[0], c.session_id, "settings_locked", fatal=False, client_event_id="u-locked", details={})
    finished = [e for e in events if e["type"] == "input_text.injection_finished"]
    assert [(e["job_id"], e["disposition"]) for e in finished] == [("job-1", "completed")]
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    c.send(update("u-after", instructions="base"))
    c.expect_error("settings_locked", fatal=False, client_event_id="u-after", details={})
    c.turn(1)


def test_changing_negotiated_capability_is_settings_locked(server):
    c = configured(server, capabilities={"function_output_model_output": "client_authored_v1"})
    c.send(update("u-caps", capabilities={"function_output_model_output": None}))
    c.expect_error("settings_locked", fatal=False, client_event_id="u-caps", details={})
    acked = c.configure("u-same", capabilities={"function_output_model_output": "client_authored_v1"})
    assert acked["session"]["capabilities"] == {"function_output_model_output": "client_authored_v1"}
    c.turn(1)


def test_identical_update_reacks_without_restart(server):
    c = connect(server)
    first = c.configure("u1", instructions="Keep answers short.", tools=[WEATHER, CLOCK])
    model = model_of(server)
    assert model.prefills == 1
    again = c.configure("u2", instructions="Keep answers short.", tools=[WEATHER, CLOCK])
    assert again["session"] == first["session"]
    assert model.prefills == 1  # re-ack only
    changed = c.configure("u3", instructions="Keep answers very short.")
    assert changed["session"]["tools"] == [WEATHER_NORMALIZED, CLOCK_NORMALIZED]
    assert model.prefills == 2  # a changed effective config restarts (full prefill)
    c.turn(1)


def test_instructions_null_restores_the_server_default_and_tools_are_retained_or_cleared(server):
    c = connect(server)
    acked = c.configure("u1")  # instructions omitted on the first update: the default
    assert acked["session"]["instructions"] == ""
    assert acked["session"]["tools"] == []
    acked = c.configure("u2", instructions="custom", tools=[WEATHER, CLOCK])
    assert acked["session"]["instructions"] == "custom"
    assert acked["session"]["tools"] == [WEATHER_NORMALIZED, CLOCK_NORMALIZED]
    acked = c.configure("u3", instructions="other")  # tools omitted: retained
    assert acked["session"]["tools"] == [WEATHER_NORMALIZED, CLOCK_NORMALIZED]
    acked = c.configure("u4", instructions=None)  # null: the server's default ("" here)
    assert acked["session"]["instructions"] == ""
    assert acked["session"]["tools"] == [WEATHER_NORMALIZED, CLOCK_NORMALIZED]
    acked = c.configure("u5", tools=[])  # []: cleared; instructions omitted: retained
    assert acked["session"]["tools"] == []
    assert acked["session"]["instructions"] == ""
    c.turn(1)


def test_session_updated_is_sent_only_after_the_acked_settings_were_prefilled():
    with serve(sim_config(prefill_delay_s=0.3)) as srv:
        c = connect(srv)
        c.send(update("u-a", instructions="a"))
        c.send(update("u-b", instructions="b"))
        for _ in range(2):
            e = c.next()
            if e["type"] != "session.updated":
                break
            # the model-ready barrier: the acknowledged settings are the ones the model holds
            assert srv.models[-1].prompt.instructions == e["session"]["instructions"]
        c.raw.close()


def test_instructions_null_restores_a_configured_server_default():
    with serve(sim_config(default_instructions="You are the default assistant.")) as srv:
        c = connect(srv)
        assert c.configure("u1")["session"]["instructions"] == "You are the default assistant."
        assert c.configure("u2", instructions="custom")["session"]["instructions"] == "custom"
        assert c.configure("u3", instructions=None)["session"]["instructions"] == "You are the default assistant."
        c.raw.close()


# ================================================================ append validation (§4)


def test_append_before_configuration_is_session_not_configured(server):
    c = connect(server)
    c.send(append_msg(event_id="a-1"))
    c.expect_error("session_not_configured", fatal=False, client_event_id="a-1", details={})
    # rule 1 comes first: even a wholly invalid append only reports the missing configuration
    c.send(append_msg(event_id="a-2", encoding="wav", sample_rate=8000, channels=2, audio="abc$"))
    c.expect_error("session_not_configured", fatal=False, client_event_id="a-2", details={})
    c.send(append_msg(event_id=MISSING))
    c.expect_error("session_not_configured", fatal=False, details={})
    c.configure()
    c.turn(1)


APPEND_FAILURES = {
    "encoding-wav": ({"encoding": "wav"}, "unsupported_audio_encoding"),
    "encoding-PCM16": ({"encoding": "PCM16"}, "unsupported_audio_encoding"),
    "encoding-missing": ({"encoding": MISSING}, "unsupported_audio_encoding"),
    "rate-8000": ({"sample_rate": 8000}, "unsupported_sample_rate"),
    "rate-float": ({"sample_rate": 16000.0}, "unsupported_sample_rate"),
    "rate-string": ({"sample_rate": "16000"}, "unsupported_sample_rate"),
    "rate-missing": ({"sample_rate": MISSING}, "unsupported_sample_rate"),
    "channels-2": ({"channels": 2}, "unsupported_channel_count"),
    "channels-true": ({"channels": True}, "unsupported_channel_count"),
    "channels-string": ({"channels": "1"}, "unsupported_channel_count"),
    "channels-missing": ({"channels": MISSING}, "unsupported_channel_count"),
    "audio-missing": ({"audio": MISSING}, "empty_audio"),
    "audio-empty": ({"audio": ""}, "empty_audio"),
    "audio-dollar": ({"audio": "abc$"}, "invalid_audio"),
    "audio-no-padding": ({"audio": "AAA"}, "invalid_audio"),
    "audio-whitespace": ({"audio": "AA AA"}, "invalid_audio"),
    "audio-urlsafe": ({"audio": "AA-_"}, "invalid_audio"),
    "audio-odd-bytes": ({"audio": b64(b"\x00\x00\x00")}, "invalid_audio"),
    "audio-one-byte": ({"audio": b64(b"\x01")}, "invalid_audio"),
    "audio-not-string": ({"audio": 12}, "invalid_audio"),
    "audio-40962-bytes": ({"audio": b64(bytes(MAX_APPEND + 2))}, "audio_packet_too_large"),
    "audio-81920-bytes": ({"audio": b64(bytes(2 * MAX_APPEND))}, "audio_packet_too_large"),
}


@pytest.mark.parametrize("fields,code", list(APPEND_FAILURES.values()), ids=list(APPEND_FAILURES))
def test_invalid_append_is_recoverable(server, fields, code):
    c = configured(server)
    c.send(append_msg(event_id="bad-append", **fields))
    c.expect_error(code, fatal=False, client_event_id="bad-append", details={})
    c.sync()


def test_session_survives_every_invalid_append(server):
    c = configured(server)
    c.send(turn_start(1, "start-1"))
    for name, (fields, code) in APPEND_FAILURES.items():
        c.send(append_msg(event_id=name, **fields))
    c.send(append_msg(event_id="speech", audio=b64(render_speech("Hi"))))
    c.send(commit(1, "commit-1"))
    events = c.until(lambda e: e["type"] == "response.done")
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["error"]["code"], e["error"]["client_event_id"]) for e in errors] == [
        (code, name) for name, (fields, code) in APPEND_FAILURES.items()
    ]
    assert all(e["error"]["fatal"] is False for e in errors)
    assert events[-1]["status"] == "completed"
    # rejected appends never reached the model: the transcript is the valid speech only
    completed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert [e["transcript"] for e in completed] == ["Hi"]
    c.turn(2)


def test_append_of_exactly_40960_bytes_is_accepted(server):
    c = configured(server)
    c.send(append_msg(event_id="big", audio=b64(bytes(MAX_APPEND))))  # 16 quiet frames: held by the gate
    c.sync()  # no error (and no per-append ack)
    c.turn(1)


def test_append_validation_order_when_several_fields_are_wrong(server):
    c = connect(server)
    bad = {"encoding": "wav", "sample_rate": 8000, "channels": 2, "audio": MISSING}
    c.send(append_msg(event_id="o-0", **bad))
    c.expect_error("session_not_configured", fatal=False, client_event_id="o-0", details={})
    c.configure()
    steps = [
        ({}, "unsupported_audio_encoding"),
        ({"encoding": "pcm16"}, "unsupported_sample_rate"),
        ({"sample_rate": 16000}, "unsupported_channel_count"),
        ({"channels": 1}, "empty_audio"),
        ({"audio": "abc$"}, "invalid_audio"),
        ({"audio": b64(bytes(MAX_APPEND + 1))}, "invalid_audio"),  # odd (rule 6) although also oversize (rule 7)
        ({"audio": b64(bytes(MAX_APPEND + 2))}, "audio_packet_too_large"),
    ]
    for i, (fix, code) in enumerate(steps, start=1):
        bad.update(fix)
        c.send(append_msg(event_id=f"o-{i}", **bad))
        c.expect_error(code, fatal=False, client_event_id=f"o-{i}", details={})
    c.sync()
    c.turn(1)


@pytest.mark.parametrize(
    "audio",
    [b64(bytes(MAX_APPEND + 3)), "$" * 60_000],
    ids=["odd-40963-bytes", "oversize-non-base64"],
)
def test_invalid_audio_precedes_audio_packet_too_large(server, audio):
    c = configured(server)
    c.send(append_msg(event_id="bad-append", audio=audio))
    c.expect_error("invalid_audio", fatal=False, client_event_id="bad-append", details={})


# ================================================================ barriers (§6.3)


INVALID_EVENT_IDS = {
    "turn_start-missing": turn_start(1, MISSING),
    "turn_start-empty": turn_start(1, ""),
    "turn_start-number": turn_start(1, 7),
    "turn_start-null": turn_start(1, None),
    "commit-missing": commit(1, MISSING),
    "commit-empty": commit(1, ""),
    "both-wrong": turn_start(0, ""),  # the event_id is checked before client_turn_id
}


@pytest.mark.parametrize("msg", list(INVALID_EVENT_IDS.values()), ids=list(INVALID_EVENT_IDS))
def test_barrier_without_event_id_is_fatal_invalid_event_id(server, msg):
    c = configured(server)
    c.send(msg)
    c.expect_error("invalid_event_id", fatal=True, details={})
    assert_model_aborted(server)
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)


INVALID_TURN_IDS = {"zero": 0, "negative": -1, "string": "1", "true": True, "false": False, "float": 1.5, "null": None}


@pytest.mark.parametrize("kind", ["turn_start", "commit"])
@pytest.mark.parametrize("value", [*INVALID_TURN_IDS.values(), MISSING], ids=[*INVALID_TURN_IDS, "missing"])
def test_barrier_with_bad_client_turn_id_is_fatal_invalid_client_turn_id(server, kind, value):
    c = configured(server)
    if kind == "commit":  # the shape check precedes the conflict checks: open a valid turn first
        c.send(turn_start(1, "start-1"))
        c.until(lambda e: e["type"] == "input_audio_buffer.turn_started")
        c.send(commit(value, "bad-barrier"))
    else:
        c.send(turn_start(value, "bad-barrier"))
    c.expect_error("invalid_client_turn_id", fatal=True, client_event_id="bad-barrier", details={})
    assert_model_aborted(server)
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)


def test_turn_start_while_a_turn_is_open_is_fatal_input_turn_conflict(server):
    c = configured(server)
    c.send(turn_start(1, "start-1"))
    c.until(lambda e: e["type"] == "input_audio_buffer.turn_started")
    c.send(turn_start(2, "start-2"))
    c.expect_error(
        "input_turn_conflict",
        fatal=True,
        client_event_id="start-2",
        details={"client_turn_id": 2, "open_client_turn_id": 1},
    )
    assert_model_aborted(server)
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)


def test_commit_of_another_turn_is_fatal_input_turn_conflict(server):
    c = configured(server)
    c.send(turn_start(1, "start-1"))
    c.send(append_msg(audio=b64(render_speech("Hi"))))
    c.until(lambda e: e["type"] == "input_audio_buffer.turn_started")
    c.send(commit(2, "commit-2"))
    c.expect_error(
        "input_turn_conflict",
        fatal=True,
        client_event_id="commit-2",
        details={"client_turn_id": 2, "open_client_turn_id": 1},
    )
    assert_model_aborted(server)
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)
    assert "input_audio_buffer.committed" not in c.types()


@pytest.mark.parametrize("after_turn", [False, True], ids=["fresh-session", "after-a-completed-turn"])
def test_commit_without_an_open_turn_is_fatal_input_turn_conflict(server, after_turn):
    c = configured(server)
    if after_turn:
        c.turn(1)
    c.send(commit(5, "commit-5"))
    err = c.expect_error("input_turn_conflict", fatal=True, client_event_id="commit-5")
    assert err.get("client_turn_id", 5) == 5
    assert err.get("open_client_turn_id") is None
    assert_model_aborted(server)
    assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)


class _HeldSynthesizer(SimulatorSynthesizer):
    """Synthesizes only once the test releases it: the typed job stays active however slowly the test runs."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def synthesize(self, text: str) -> bytes:
        assert self.release.wait(30), "the test never released the synthesizer"
        return super().synthesize(text)


def test_turn_start_during_a_typed_job_is_fatal_input_turn_conflict():
    synthesizer = _HeldSynthesizer()
    try:
        with serve(sim_config(synthesizer=synthesizer)) as srv:
            c = configured(srv)
            c.send(typed("job-1", "Tell me something"))
            c.send(turn_start(1, "start-1"))
            events = c.until(lambda e: e["type"] == "error")
            assert events[0]["type"] == "input_text.accepted"
            assert "input_audio_buffer.turn_started" not in [e["type"] for e in events]
            err = events[-1]
            assert_error(err, c.session_id, "input_turn_conflict", fatal=True, client_event_id="start-1")
            assert err["error"].get("client_turn_id", 1) == 1
            assert_model_aborted(srv)
            assert_fatal_close(c, CLOSE_PROTOCOL, session_closed=None)
            synthesizer.release.set()  # the ended session's synthesis may finish now (the server waits for it)
    finally:
        synthesizer.release.set()


# ================================================================ typed input rejections (§9)


def _rejected(c: V3Client, job_id: Any, reason: str) -> None:
    e = c.next()
    assert e["type"] == "input_text.rejected", e
    assert set(e) == {"type", "event_id", "session_id", "job_id", "reason"}
    assert (e["job_id"], e["reason"]) == (job_id, reason)


def _run_typed_job(c: V3Client, job_id: str, text: str = "Hello there") -> list[dict]:
    c.send(typed(job_id, text))
    events = c.until_all("input_text.injection_finished", "response.done")
    assert "error" not in [e["type"] for e in events]
    assert (events[0]["type"], events[0]["job_id"]) == ("input_text.accepted", job_id)
    finished = [e for e in events if e["type"] == "input_text.injection_finished"]
    assert [(e["job_id"], e["disposition"]) for e in finished] == [(job_id, "completed")]
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    return events


def test_typed_request_before_configuration_is_rejected_session_not_configured(server):
    c = connect(server)
    c.send(typed("job-1", ""))  # configuration is checked before the text
    _rejected(c, "job-1", "session_not_configured")
    c.configure()
    _run_typed_job(c, "job-1")  # a rejected id was never used
    c.turn(1)


def test_typed_request_during_a_microphone_turn_is_rejected_input_turn_active(server):
    c = configured(server)
    c.send(turn_start(1, "start-1"))
    c.until(lambda e: e["type"] == "input_audio_buffer.turn_started")
    c.send(typed("job-1"))
    _rejected(c, "job-1", "input_turn_active")
    c.send(typed("", ""))  # the open turn is reported before the job id and text checks
    _rejected(c, "", "input_turn_active")
    c.send(commit(1, "commit-1"))
    assert c.until(lambda e: e["type"] == "response.done")[-1]["status"] == "completed"
    _run_typed_job(c, "job-1")


@pytest.mark.parametrize(
    "job_id", ["", "j" * 129, 5, None, ["a"], MISSING], ids=["empty", "129-chars", "number", "null", "list", "missing"]
)
def test_typed_request_with_bad_job_id_is_rejected_invalid_job_id(server, job_id):
    c = configured(server)
    c.send(typed(job_id, ""))  # the job id is checked before the text
    _rejected(c, None if job_id is MISSING else job_id, "invalid_job_id")
    c.sync()
    _run_typed_job(c, "job-1")


def test_reused_job_id_is_rejected_duplicate_job_id(server):
    c = configured(server)
    long_id = "j" * 128  # the longest valid job id
    _run_typed_job(c, long_id)
    c.send(typed(long_id, "Hello again"))
    _rejected(c, long_id, "duplicate_job_id")
    c.send(typed(long_id, ""))  # duplicate is checked before the text
    _rejected(c, long_id, "duplicate_job_id")
    c.sync()
    c.turn(1)


def test_reused_job_id_of_an_active_job_is_rejected_not_a_replacement(server):
    c = configured(server)
    c.send(typed("job-1", "Hello there"))
    c.send(typed("job-1", "Something else"))
    events = c.until_all("input_text.rejected", "input_text.injection_finished", "response.done")
    rejected = [e for e in events if e["type"] == "input_text.rejected"]
    assert [(e["job_id"], e["reason"]) for e in rejected] == [("job-1", "duplicate_job_id")]
    finished = [e for e in events if e["type"] == "input_text.injection_finished"]
    assert [(e["job_id"], e["disposition"]) for e in finished] == [("job-1", "completed")]


@pytest.mark.parametrize("text", ["", "   ", "\n\t ", MISSING], ids=["empty", "spaces", "whitespace", "missing"])
def test_blank_text_is_rejected_empty_text(server, text):
    c = configured(server)
    c.send(typed("job-1", text))
    _rejected(c, "job-1", "empty_text")
    c.sync()
    _run_typed_job(c, "job-1")  # the rejected id is still free


def test_text_over_1000_chars_is_rejected_text_too_long(server):
    c = configured(server)
    c.send(typed("job-1", "a" * 1001))
    _rejected(c, "job-1", "text_too_long")
    c.send(typed("job-2", "a" * 1000))  # the maximum is accepted
    e = c.next()
    assert (e["type"], e["job_id"]) == ("input_text.accepted", "job-2")


def test_typed_request_without_a_synthesizer_is_rejected_typed_input_unavailable():
    with serve(sim_config(synthesizer=None)) as srv:
        c = connect(srv)
        assert c.created["capabilities"]["typed_input"] is False
        c.send(typed("job-1"))
        _rejected(c, "job-1", "session_not_configured")  # rule 1 precedes rule 2
        c.configure()
        c.send(typed("job-1"))
        _rejected(c, "job-1", "typed_input_unavailable")
        c.send(typed("", ""))  # rule 2 precedes the job id and text checks
        _rejected(c, "", "typed_input_unavailable")
        c.turn(1)
        c.raw.close()


class _FailingSynthesizer:
    name = "failing"
    ready = True

    def synthesize(self, text: str) -> bytes:
        raise RuntimeError("synthesizer exploded")


def test_synthesis_failure_before_mutation_is_recoverable_typed_input_failed():
    with serve(sim_config(synthesizer=_FailingSynthesizer())) as srv:
        c = configured(srv)
        c.send(typed("job-1"))
        events = c.until(lambda e: e["type"] == "input_text.injection_finished")
        assert events[0]["type"] == "input_text.accepted"
        errors = [e for e in events if e["type"] == "error"]
        assert len(errors) == 1
        assert_error(errors[0], c.session_id, "typed_input_failed", fatal=False, client_event_id="job-1")
        assert (events[-1]["job_id"], events[-1]["disposition"]) == ("job-1", "error")
        assert "input_text.injection_started" not in [e["type"] for e in events]
        c.sync()
        c.turn(1)
        c.raw.close()


# ================================================================ conversation.item.create (§10.4)


@pytest.mark.parametrize(
    "item",
    [MISSING, "function_call_output", None, {}, {"type": "message", "call_id": "call_x", "output": "1"}],
    ids=["missing", "string", "null", "no-type", "wrong-type"],
)
def test_bad_item_is_invalid_conversation_item(server, item):
    c = configured(server, tools=[WEATHER])
    msg: dict[str, Any] = {"type": "conversation.item.create", "event_id": "item-1"}
    if item is not MISSING:
        msg["item"] = item
    c.send(msg)
    c.expect_error("invalid_conversation_item", fatal=False, client_event_id="item-1", details={})
    c.sync()
    c.turn(1)


def test_function_output_without_tools_is_tools_not_set(server):
    c = configured(server)
    item = {"type": "function_call_output", "call_id": "call_0123", "output": "sunny"}
    c.send({"type": "conversation.item.create", "event_id": "item-1", "item": item})
    c.expect_error("tools_not_set", fatal=False, client_event_id="item-1", details={})
    c.send({"type": "conversation.item.create", "event_id": "item-2", "item": {"type": "message"}})
    c.expect_error("invalid_conversation_item", fatal=False, client_event_id="item-2", details={})  # item first
    c.sync()
    c.turn(1)


def test_function_output_for_an_unknown_call_is_invalid_function_call_output(server):
    c = configured(server, tools=[WEATHER])
    item = {"type": "function_call_output", "call_id": "call_00000000000000000000000000000000", "output": "sunny"}
    c.send({"type": "conversation.item.create", "event_id": "item-1", "item": item})
    err = c.expect_error(
        "invalid_function_call_output",
        fatal=False,
        client_event_id="item-1",
        details={"call_id": "call_00000000000000000000000000000000"},
    )
    assert "unknown or completed call_id" in err["message"]
    c.sync()
    c.turn(1)


# ================================================================ model-side fatals (§7, §6.5, §9, §12.3)


def test_settlement_that_never_reaches_the_fence_is_fatal_input_turn_settle_timeout():
    with serve(sim_config(behaviour=replace(QUICK, never_reach_fence=True))) as srv:
        c = configured(srv)
        c.send(turn_start(1, "start-1"))
        c.send(append_msg(audio=b64(render_speech("Hi"))))
        c.send(commit(1, "commit-1"))
        events = c.until(lambda e: e["type"] == "error")
        err = events[-1]
        assert_error(err, c.session_id, "input_turn_settle_timeout", fatal=True, client_event_id=ANY)
        assert_model_aborted(srv)
        details = err["error"]
        assert details["settlement"]["target_blank_frames"] == FENCE
        assert details["settlement"].get("max_model_steps", 2 * FENCE) == 2 * FENCE
        assert (details["source"], details["job_id"]) == ("microphone", None)
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=None)
        assert "input_audio_buffer.committed" not in c.types()
        assert "response.created" not in c.types()
        settlement_metrics = [
            e
            for e in c.raw.received
            if e["type"] == "voicechat.metrics" and e["turn_state"].get("kind") == "settlement"
        ]
        assert len(settlement_metrics) == 2 * FENCE  # bounded at 2 x fence (fence 3: exactly 6 steps)


@pytest.mark.parametrize(
    "behaviour,code",
    [
        (replace(QUICK, self_start_response_at=0), "pre_eou_response_activity"),
        (replace(QUICK, self_start_function_at=0), "pre_eou_function_activity"),
    ],
    ids=["response", "function"],
)
def test_model_activity_during_settlement_is_fatal_and_never_published(behaviour, code):
    with serve(sim_config(behaviour=behaviour)) as srv:
        c = configured(srv)
        c.send(turn_start(1, "start-1"))  # no audio: the commit's first settlement position is model position 0
        c.send(commit(1, "commit-1"))
        events = c.until(lambda e: e["type"] == "error")
        err = events[-1]
        assert_error(err, c.session_id, code, fatal=True, client_event_id=ANY)
        assert_model_aborted(srv)
        assert err["error"]["settlement"]["target_blank_frames"] == FENCE
        assert (err["error"]["source"], err["error"]["job_id"]) == ("microphone", None)
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=None)
        types = c.types()
        assert "input_audio_buffer.committed" not in types
        assert "response.created" not in types
        assert not [e for e in c.raw.received if e["type"] == "voicechat.metrics" and e["frame"] is not None]


def test_model_failure_is_fatal_internal_error_with_session_closed():
    with serve(sim_config(behaviour=replace(QUICK, fail_at_position=1))) as srv:
        c = configured(srv)
        c.send(turn_start(1, "start-1"))
        c.send(append_msg(audio=b64(render_speech("Hello there, how are you"))))
        events = c.until(lambda e: e["type"] == "error")
        assert_error(events[-1], c.session_id, "internal_error", fatal=True, client_event_id=ANY)
        assert_model_aborted(srv)
        e = c.next()
        assert (e["type"], e["status"], e["reason"]) == ("session.closed", "failed", "internal_error")
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=("failed", "internal_error"))


def test_model_failure_after_typed_mutation_is_fatal_typed_input_failed():
    with serve(sim_config(behaviour=replace(QUICK, fail_at_position=1))) as srv:
        c = configured(srv)
        c.send(typed("job-1", "Hello there, how are you"))
        events = c.until(lambda e: e["type"] == "error")
        types = [e["type"] for e in events]
        assert types[:2] == ["input_text.accepted", "input_text.injection_started"]
        assert_error(events[-1], c.session_id, "typed_input_failed", fatal=True, client_event_id=ANY)
        assert_model_aborted(srv)
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=None)
        assert "input_text.injection_finished" not in c.types()


class _PrefillFails(SimulatorModel):
    def prefill(self, prompt):
        raise RuntimeError("out of memory")


def test_prefill_failure_is_fatal_internal_error_with_session_closed():
    with serve(ServerConfig(model_factory=_PrefillFails)) as srv:
        c = connect(srv)
        c.send(update("update-1"))
        assert_error(c.next(), c.session_id, "internal_error", fatal=True, client_event_id=ANY)
        e = c.next()
        assert (e["type"], e["status"], e["reason"]) == ("session.closed", "failed", "internal_error")
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=("failed", "internal_error"))
        assert "session.updated" not in c.types()


def test_response_that_cannot_be_cancelled_is_fatal_response_cancel_timeout():
    with serve(sim_config(behaviour=replace(QUICK, endless_response=True))) as srv:
        c = configured(srv)
        c.send(turn_start(1, "start-1"))
        c.send(append_msg(audio=b64(render_speech("Hi"))))
        c.send(commit(1, "commit-1"))
        c.until(lambda e: e["type"] == "response.output_text.delta")
        c.send(turn_start(2, "start-2"))
        events = c.until(lambda e: e["type"] == "error")
        assert_error(events[-1], c.session_id, "response_cancel_timeout", fatal=True, client_event_id=ANY)
        assert_model_aborted(srv)
        types = [e["type"] for e in events]
        assert "input_audio_buffer.turn_started" not in types
        assert "input_audio_buffer.speech_started" not in types
        # the open response still gets exactly one terminal (never "cancelled": the cancel failed)
        done = [e for e in c.raw.received if e["type"] == "response.done"]
        assert len(done) <= 1 and all(d["status"] != "cancelled" for d in done)
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=None)


@pytest.mark.parametrize("during", ["speech", "settlement"])
def test_position_limit_is_fatal_session_position_limit_with_close_1000(during):
    limit = 8
    with serve(sim_config(max_session_model_frames=limit)) as srv:
        c = configured(srv)
        assert c.created["capabilities"]["max_session_model_frames"] == limit
        c.send(turn_start(1, "start-1"))
        if during == "speech":
            c.send(append_msg(audio=b64(LOUD_FRAME * 12)))
        else:  # 6 loud frames, then the commit's settlement needs 3 more positions: the guard stops position 8
            c.send(append_msg(audio=b64(LOUD_FRAME * 6)))
            c.send(commit(1, "commit-1"))
        events = c.until(lambda e: e["type"] == "error")
        assert_error(
            events[-1],
            c.session_id,
            "session_position_limit",
            fatal=True,
            client_event_id=ANY,
            details={"model_frames": limit, "max_model_frames": limit},
        )
        assert_model_aborted(srv)
        rest = c.until(lambda e: e["type"] == "session.closed")
        assert (rest[-1]["status"], rest[-1]["reason"]) == ("failed", "session_position_limit")
        # closing brackets for the open turn come between the error and session.closed
        assert [e["type"] for e in rest[:-1]] == [
            "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed",
        ]
        assert_fatal_close(c, CLOSE_NORMAL, session_closed=("failed", "session_position_limit"))
        assert "input_audio_buffer.committed" not in c.types()
        frames = [e["frame"] for e in c.raw.received if e["type"] == "voicechat.metrics" and e["frame"] is not None]
        assert len(frames) == limit  # steps never exceed the limit


# ================================================================ admission (§1)


class _AbortFails(SimulatorModel):
    def abort(self):
        raise RuntimeError("device context lost")


def test_failed_model_cleanup_poisons_later_connections_with_model_cleanup_failed():
    config = sim_config()
    config.model_factory = lambda: _AbortFails(QUICK)
    with serve(config) as srv:
        first = configured(srv)
        first.raw.close()  # the disconnect aborts the model, which fails
        srv.wait_released()
        assert srv.health()["model"] == "cleanup_failed" and srv.health()["status"] == "degraded"
        c = connect(srv)  # session.created first
        c.raw.timeout = 2.0  # the fatal follows session.created at once
        c.expect_error("model_cleanup_failed", fatal=True, client_event_id=ANY)
        assert_fatal_close(c, CLOSE_INTERNAL, session_closed=None)


def test_second_connection_gets_server_busy_and_the_slot_is_reusable():
    with serve(sim_config(max_sessions=1)) as srv:
        first = configured(srv)
        assert srv.health()["active_client"] is True
        busy = V3Client(srv.ws, expect_created=False)
        e = busy.raw.recv()
        assert_error(e, None, "server_busy", fatal=True, details={})
        assert isinstance(e["session_id"], str) and e["session_id"]
        assert busy.close_code() == CLOSE_BUSY
        assert busy.raw.close_reason == "server_busy"
        assert busy.raw.received == [e]  # exactly one event: no session.created, no session.closed
        first.turn(1)  # the admitted session is unaffected
        first.raw.close()
        srv.wait_released()
        assert srv.health()["active_client"] is False
        again = connect(srv)  # admitted: its first event is session.created
        again.configure()
        again.turn(1)
        again.raw.close()
