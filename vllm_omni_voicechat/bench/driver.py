"""One benchmark session over a real WebSocket: handshake, then per turn 80 ms frames paced in real time, a commit,
and the wait for that turn's ``response.done``; returns the timestamped trace and the measured turns.

Either dialect: strict v3 (``/v1/voicechat``: ``turn_start`` barrier, ``commit`` with ``client_turn_id``,
``session.stop``) or the tiered OpenAI/duplex one (``/v1/realtime?model=...``, ``/v1/duplex``: appends and a
``commit``, the model owns the turn). The clock and the sleep are injected so tests can pace on a virtual clock.
Each socket's raw events also go to the shared trace checker (``vllm_omni_voicechat.trace.TraceChecker``) when
that package is present; its violations count as errors.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from ..audio.frames import FRAME_SECONDS, INPUT_SAMPLE_RATE, SILENT_INPUT_FRAME
from ..errors import VoicechatError
from ..wire.tiered.routing import DUPLEX_PATH, REALTIME_PATH, VOICECHAT_PATH, UnknownRoute, select_route
from .metrics import AUDIO_DELTA_TYPES, TurnMeter, TurnRecord

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Checker(Protocol):
    violations: list[str]

    def client_event(self, message: Any) -> None: ...
    def server_event(self, message: Any) -> None: ...
    def transport_closed(self, code: int | None) -> None: ...


def default_checker(route: str) -> Checker | None:
    """The shared protocol trace checker for one socket (``route``: ``v3``, ``tiered`` or ``tiered-openai``)."""
    try:
        from ..trace import TraceChecker
    except ImportError:  # the checker package is optional for this module; without it nothing is checked
        return None
    return TraceChecker(dialect=route)  # type: ignore[arg-type]


def route_for(url: str, realtime_default: str = "v3") -> str:
    """What the server's routing (``wire/tiered/routing.select_route``) serves at ``url``: ``v3``, ``tiered`` (the
    full lane) or ``tiered-openai`` (Tiers 1-2, ``/v1/realtime?model=...``). ``realtime_default`` mirrors the
    server's ``--realtime-default`` for the bare ``/v1/realtime``; a path prefix (a proxy's) is allowed."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    path = next((p for p in (VOICECHAT_PATH, DUPLEX_PATH, REALTIME_PATH) if path.endswith(p)), path)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    try:
        route = select_route(path, query, {}, bare_default=realtime_default)
    except UnknownRoute:
        raise ValueError(f"{url}: not a voicechat WebSocket route (/v1/voicechat, /v1/realtime, /v1/duplex)") from None
    if route.dialect == "duplex_off":
        raise ValueError(f"{url}: duplex={query['duplex']} turns the realtime route off")
    if route.dialect == "v3":
        return "v3"
    return "tiered" if route.lane == "full" else "tiered-openai"


def dialect_for(url: str, realtime_default: str = "v3") -> str:
    """``v3`` or ``tiered`` for ``url`` (both tiered lanes speak the same events for what the benchmark does)."""
    return "v3" if route_for(url, realtime_default) == "v3" else "tiered"


def ws_url(url: str) -> str:
    """``http(s)://`` -> ``ws(s)://`` (vLLM's bench hands request functions an HTTP URL)."""
    if url.startswith("http://"):
        return "ws://" + url[len("http://"):]
    if url.startswith("https://"):
        return "wss://" + url[len("https://"):]
    return url


def slim(event: dict) -> dict:
    """The event as kept in the trace: audio payloads replaced by their decoded byte count."""
    if event.get("type") == "input_audio_buffer.append" or event.get("type") in AUDIO_DELTA_TYPES:
        key = "audio" if "audio" in event else "delta"
        if isinstance(event.get(key), str):
            out = {k: v for k, v in event.items() if k != key}
            out["audio_bytes"] = len(base64.b64decode(event[key]))
            return out
    return event


class SessionFailed(VoicechatError):
    """The session cannot go on (fatal error, close, timeout); the message says why."""


@dataclass
class SessionResult:
    url: str
    dialect: str
    started: float
    ended: float = 0.0
    trace: list[tuple[float, bool, dict]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # errors outside turns, checker violations, failures
    violations: list[str] = field(default_factory=list)
    close_code: int | None = None
    checked: bool = False  # a trace checker saw this socket

    @property
    def ok(self) -> bool:
        return not self.errors and all(t.ok for t in self.turns)

    @property
    def all_errors(self) -> list[str]:
        return [e for t in self.turns for e in t.errors] + self.errors


class _Session:
    def __init__(self, ws: Any, dialect: str, clock: Clock, result: SessionResult, checker: Checker | None) -> None:
        self.ws, self.dialect, self.clock, self.result, self.checker = ws, dialect, clock, result, checker
        self.meter = TurnMeter(dialect)
        self.events: list[dict] = []  # received, in order (slim)
        self.changed = asyncio.Condition()
        self.closed: BaseException | None = None
        self.fatal: str | None = None
        self._ids = 0

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"bench_{prefix}_{self._ids}"

    async def send(self, event: dict) -> None:
        if self.closed is not None or self.fatal is not None:
            raise SessionFailed(self.fatal or f"connection closed: {self.closed!r}")
        text = json.dumps(event)
        t = self.clock()
        if self.checker is not None:
            self.checker.client_event(event)
        kept = slim(event)
        self.result.trace.append((t, True, kept))
        self.meter.feed(t, True, kept)
        await self.ws.send(text)

    async def receive_loop(self) -> None:
        try:
            async for message in self.ws:
                t = self.clock()
                if self.checker is not None:
                    self.checker.server_event(message)
                try:
                    event = json.loads(message)
                except (TypeError, ValueError):
                    self.result.errors.append(f"non-JSON server frame: {message[:80]!r}")
                    continue
                if not isinstance(event, dict):
                    self.result.errors.append(f"non-object server event: {str(message)[:80]}")
                    continue
                kept = slim(event)
                self.result.trace.append((t, False, kept))
                self.meter.feed(t, False, kept)
                err = event.get("error")
                if event.get("type") == "error" and isinstance(err, dict) and err.get("fatal"):
                    self.fatal = f"fatal error {err.get('code')}: {err.get('message')}"
                async with self.changed:
                    self.events.append(kept)
                    self.changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - the connection dropped: recorded; waiters see self.closed
            self.closed = exc
        else:
            self.closed = ConnectionError("server closed the connection")
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, pred: Callable[[dict], bool], timeout: float, what: str, since: int = 0) -> dict:
        """The first received event from index ``since`` matching ``pred``; SessionFailed on fatal/close/timeout."""
        async def scan() -> dict:
            i = since
            async with self.changed:
                while True:
                    while i < len(self.events):
                        if pred(self.events[i]):
                            return self.events[i]
                        i += 1
                    if self.fatal is not None:
                        raise SessionFailed(f"{self.fatal} (waiting for {what})")
                    if self.closed is not None:
                        raise SessionFailed(f"connection closed while waiting for {what}")
                    await self.changed.wait()

        try:
            return await asyncio.wait_for(scan(), timeout)
        except TimeoutError:
            raise SessionFailed(f"no {what} within {timeout:g} s") from None

    async def wait_turn_closed(self, count: int, timeout: float) -> None:
        async def scan() -> None:
            async with self.changed:
                while len(self.meter.turns) < count:
                    if self.fatal is not None:
                        raise SessionFailed(f"{self.fatal} (waiting for response.done)")
                    if self.closed is not None:
                        raise SessionFailed("connection closed while waiting for response.done")
                    await self.changed.wait()

        try:
            await asyncio.wait_for(scan(), timeout)
        except TimeoutError:
            raise SessionFailed(f"no response.done within {timeout:g} s of the commit") from None


async def _open_microphone(s: _Session, turn: int, start: float, clock: Clock, sleep: Sleep) -> None:
    """Silent frames on the 80 ms grid from ``start`` until turn ``turn`` has closed (or the session failed)."""
    silence = base64.b64encode(SILENT_INPUT_FRAME).decode("ascii")
    append: dict[str, Any] = {"type": "input_audio_buffer.append", "audio": silence}
    if s.dialect == "v3":
        append.update(encoding="pcm16", sample_rate=INPUT_SAMPLE_RATE, channels=1)
    k = 0
    while True:
        delay = start + k * FRAME_SECONDS - clock()
        if delay > 0:
            await sleep(delay)
        # checked right before the send, with no await between: a frame never follows its turn's response.done
        if len(s.meter.turns) >= turn or s.closed is not None or s.fatal is not None:
            return
        await s.send(dict(append))
        k += 1


def _session_update(dialect: str, instructions: str) -> dict:
    if dialect == "v3":
        return {"protocol_version": 3, "instructions": instructions, "tools": []}
    # GA spelling; our frames are 16 kHz PCM16 (the GA format object only carries rate 24000, hence the sibling)
    return {"instructions": instructions,
            "audio": {"input": {"format": {"type": "audio/pcm"}, "sample_rate_hz": INPUT_SAMPLE_RATE}}}


async def run_session(
    url: str,
    turns: Sequence[Sequence[bytes]],
    *,
    dialect: str | None = None,
    realtime_default: str = "v3",
    instructions: str = "",
    realtime: bool = True,
    stream_silence: bool = True,
    turn_timeout_s: float = 60.0,
    connect_timeout_s: float = 30.0,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    checker_factory: Callable[[str], Checker | None] = default_checker,
    on_turn: Callable[[TurnRecord], None] | None = None,
) -> SessionResult:
    """Run one session of ``turns`` (each a list of 1,280-sample PCM16 frames) against ``url``; never raises for
    a server-side failure (it is recorded in the result's errors).

    With ``realtime`` every frame goes out on its 80 ms slot and the commit on the slot after the last one. With
    ``stream_silence`` (real time only) the microphone stays open as a full-duplex client's does: silent frames
    keep their 80 ms slots from the commit until the turn's ``response.done``, so the response's positions run on
    client frames; without it the server's synthetic positions pace the response (after a real frame the first
    one waits a half-frame grace, which shows as a ~120 ms first inter-delta gap).
    """
    from websockets.asyncio.client import connect

    url = ws_url(url)
    route = route_for(url, realtime_default)
    dialect = dialect or dialect_for(url, realtime_default)
    if dialect != dialect_for(url, realtime_default):
        raise ValueError(f"{url} serves the {route} dialect, not {dialect}")
    result = SessionResult(url=url, dialect=dialect, started=clock())
    checker = checker_factory(route)
    result.checked = checker is not None
    receiver: asyncio.Task | None = None
    try:
        ws = await asyncio.wait_for(
            connect(url, ping_interval=None, max_size=None, open_timeout=connect_timeout_s), connect_timeout_s
        )
    except Exception as exc:  # noqa: BLE001 - refused, unreachable, handshake: all the same to a benchmark
        result.errors.append(f"connect failed: {exc!r}")
        result.ended = clock()
        return result
    s = _Session(ws, dialect, clock, result, checker)
    try:
        receiver = asyncio.create_task(s.receive_loop())
        if dialect == "v3":
            await s.wait_for(lambda e: e.get("type") == "session.created", connect_timeout_s, "session.created")
        since = len(s.events)
        await s.send({"type": "session.update", "event_id": s.next_id("update"),
                      "session": _session_update(dialect, instructions)})
        await s.wait_for(lambda e: e.get("type") == "session.updated", connect_timeout_s, "session.updated", since)
        for n, frames in enumerate(turns, start=1):
            if dialect == "v3":
                since = len(s.events)
                start_id = s.next_id("turn")
                await s.send({"type": "input_audio_buffer.turn_start", "event_id": start_id, "client_turn_id": n})
                await s.wait_for(lambda e, sid=start_id: e.get("type") == "input_audio_buffer.turn_started"
                                 and e.get("client_event_id") == sid, turn_timeout_s, "turn_started", since)
            t0 = clock()
            for i, frame in enumerate(frames):
                if realtime:
                    delay = t0 + i * FRAME_SECONDS - clock()
                    if delay > 0:
                        await sleep(delay)
                append: dict[str, Any] = {"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(frame).decode("ascii")}
                if dialect == "v3":
                    append.update(encoding="pcm16", sample_rate=INPUT_SAMPLE_RATE, channels=1)
                await s.send(append)
            if realtime:  # the commit goes when the last frame has been spoken, as a live client's would
                delay = t0 + len(frames) * FRAME_SECONDS - clock()
                if delay > 0:
                    await sleep(delay)
            commit: dict[str, Any] = {"type": "input_audio_buffer.commit", "event_id": s.next_id("commit")}
            if dialect == "v3":
                commit["client_turn_id"] = n
            await s.send(commit)
            mic = (asyncio.create_task(_open_microphone(s, n, t0 + len(frames) * FRAME_SECONDS, clock, sleep))
                   if realtime and stream_silence else None)
            try:
                await s.wait_turn_closed(n, turn_timeout_s)
            finally:
                if mic is not None:
                    mic.cancel()
                    await asyncio.gather(mic, return_exceptions=True)
            if on_turn is not None:
                on_turn(s.meter.turns[-1])
        since = len(s.events)
        stop_type = "session.stop" if dialect == "v3" else "session.close"
        await s.send({"type": stop_type, "event_id": s.next_id("stop")})
        try:
            await s.wait_for(lambda e: e.get("type") == "session.closed", connect_timeout_s, "session.closed", since)
        except SessionFailed as exc:
            if s.closed is None:  # a close without session.closed is fine (the OpenAI lane); a silent server is not
                result.errors.append(str(exc))
        # let the server close first, so its close code is the one recorded and checked
        done, _ = await asyncio.wait({receiver}, timeout=min(connect_timeout_s, 10.0))
        if not done:
            result.errors.append("the server did not close the connection after the session ended")
    except SessionFailed as exc:
        result.errors.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - a client-side bug must not hide behind a hung benchmark
        result.errors.append(f"client failure: {exc!r}")
    finally:
        if s.fatal is not None and receiver is not None:  # the contract's close follows a fatal error: record it
            await asyncio.wait({receiver}, timeout=min(connect_timeout_s, 10.0))
        await ws.close()
        if receiver is not None:
            await receiver
        # the close code the server chose; None when this client closed first (the server only echoed it)
        proto = ws.protocol
        server_closed = proto.close_rcvd is not None and bool(proto.close_rcvd_then_sent)
        result.close_code = proto.close_rcvd.code if server_closed else None
        result.ended = clock()
        result.turns = s.meter.finish()
        result.errors.extend(s.meter.errors)
        if checker is not None:
            checker.transport_closed(result.close_code)
            result.violations = [f"trace: {v}" for v in checker.violations]
            result.errors.extend(result.violations)
    return result


__all__ = ["SessionFailed", "SessionResult", "default_checker", "dialect_for", "route_for", "run_session", "slim",
           "ws_url"]
