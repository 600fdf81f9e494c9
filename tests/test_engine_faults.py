"""Engine-path faults on the real engine on CPU: each ends every affected session with its dialect's typed
fatal error and close code within a bound, frees its slot, spares the sessions the engine still can serve, and
``/health`` says what is wrong (docs/reliability.md, "Engine-path faults").

One server for the faults it survives (a raising hook, a stopped stage), then its shutdown under load; a killed stage
needs a server of its own. The fault server runs deploy/voicechat-cpu.yaml with a per-position step timeout of
``STEP_TIMEOUT_S`` (deployed: 30 s), and Stage 0 runs our thinker with a fault: a test plugin
(``tests/engine_plugins``, loaded by vLLM's plugin entry points as ours is) registers a subclass in which a session
whose instructions hold ``FAULT_MARKER`` fails in the per-position hook. Runs in the engine venv
(scripts/install_omni_cpu.sh VENV --engine); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from vllm_omni_voicechat.omni.local_server import CPU_DEPLOY, engine_available, engine_server, get_json

_skip = engine_available()
pytestmark = [pytest.mark.engine, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

STEP_TIMEOUT_S = 4.0
PLUGINS = Path(__file__).parent / "engine_plugins"
FAULTY_ARCHITECTURE = "VoiceChatFaultyThinkerForTests"  # engine_plugins/voicechat_fault_plugin.py
FAULT_MARKER = "[fault: raise in the thinker]"  # engine_plugins/voicechat_fault_thinker.py (importing it needs torch)
FRAME_BYTES = 2 * 1280  # 80 ms of 16 kHz PCM16
PROMPT_BOUND_S = 10.0
"""How soon after a stage dies or the engine is told to stop its sessions must hear it. Measured 0.01-0.1 s, once
3.8 s after SIGTERM on the loaded 2-core VM (the server logged the shutdown and both sessions' ends in the same
second); the message says the ending came from the engine's notice (``vLLM-Omni ended the session``), not from the
step timeout."""


def run(coro, timeout: float = 180.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def deploy_with(path, *, stage0_arch: str | None = None, **voicechat):
    import yaml

    deploy = yaml.safe_load(CPU_DEPLOY.read_text())
    deploy["voicechat"].update(voicechat)
    if stage0_arch is not None:
        (stage0,) = [s for s in deploy["stages"] if s["stage_id"] == 0]
        stage0["model_arch"] = stage0_arch
    path.write_text(yaml.safe_dump(deploy, sort_keys=False))
    return path


def fault_plugin_path(folder: Path) -> str:
    """A ``PYTHONPATH`` on which vLLM finds the test plugin: its modules, and a distribution's metadata naming its
    ``register`` under both plugin groups (what installing a package would write)."""
    info = folder / "voicechat_test_faults-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: voicechat-test-faults\nVersion: 0\n")
    target = "voicechat_test_faults = voicechat_fault_plugin:register\n"
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{target}\n[vllm_omni.general_plugins]\n{target}")
    return os.pathsep.join(p for p in (str(folder), str(PLUGINS), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint"), seed=0)


@pytest.fixture(scope="module")
def engine(checkpoint, tmp_path_factory):
    logs = tmp_path_factory.mktemp("engine-faults")
    deploy = deploy_with(logs / "voicechat-faults.yaml", stage0_arch=FAULTY_ARCHITECTURE, step_timeout_s=STEP_TIMEOUT_S)
    with engine_server(checkpoint, logs, deploy=deploy, extra_env={"PYTHONPATH": fault_plugin_path(logs)}) as srv:
        yield srv


def health(server) -> tuple[int, dict]:
    return get_json(server.http + "/health")


def idle(server) -> dict:
    """The server's /health once its sessions have left (bounded poll of its own account)."""
    deadline = time.monotonic() + 30
    while True:
        body = health(server)[1]
        if not body.get("active_sessions") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)  # ok: another process's HTTP state has no event to await; bounded poll


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def speech(text: str) -> bytes:
    from vllm_omni_voicechat.audio.speech import render_speech

    return render_speech(text)


class Wire:
    """One session on the raw wire (either dialect): configured, then fed real-time 80 ms appends (speech, then
    silence) until the server ends it; every event stamped on arrival, the server's close kept."""

    def __init__(self, url: str, dialect: str, instructions: str = "You are helpful.") -> None:
        self.url, self.dialect, self.instructions = url, dialect, instructions
        self.events: list[dict] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.closed_at: float | None = None
        self.configured = asyncio.Event()  # session.updated, or the server's close
        self.streaming = asyncio.Event()  # 16 appends (1.28 s of audio) sent, or the server's close

    def _event(self, kind: str, **fields) -> str:
        return json.dumps({"type": kind, "event_id": f"evt_{uuid.uuid4().hex}", **fields})

    def _append(self, chunk: bytes) -> str:
        audio = base64.b64encode(chunk).decode()
        if self.dialect == "v3":
            return self._event("input_audio_buffer.append", encoding="pcm16", sample_rate=16000, channels=1,
                               audio=audio)
        return self._event("input_audio_buffer.append", audio=audio)  # the tiered default: pcm16 at 16 kHz

    def positions(self) -> int:
        """v3: the positions the session ran (their metrics)."""
        return sum(1 for e in self.events if e["type"] == "voicechat.metrics" and e["frame"] is not None)

    def errors(self) -> list[dict]:
        return [e for e in self.events if e["type"] == "error"]

    async def run(self, seconds: float = 120.0) -> None:
        import websockets

        async with websockets.connect(self.url, ping_interval=None, max_size=None) as ws:
            async def read() -> None:
                try:
                    async for message in ws:
                        event = json.loads(message)
                        event["_at"] = time.monotonic()
                        self.events.append(event)
                        if event["type"] == "session.updated":
                            self.configured.set()
                except websockets.ConnectionClosed:
                    pass
                self.configured.set()
                self.closed_at = time.monotonic()
                self.close_code = ws.close_code
                self.close_reason = ws.close_reason

            reader = asyncio.create_task(read())
            if self.dialect == "v3":
                await ws.send(self._event("session.update", session={"protocol_version": 3, "tools": [],
                                                                      "instructions": self.instructions}))
            else:
                await ws.send(self._event("session.update", session={"instructions": self.instructions}))
            await self.configured.wait()
            if self.dialect == "v3" and not reader.done():
                await ws.send(self._event("input_audio_buffer.turn_start", client_turn_id=1))
            audio = speech("hello there") + bytes(FRAME_BYTES * int(seconds / 0.08))
            start = time.monotonic()
            sent = 0
            try:
                while not reader.done() and sent * FRAME_BYTES < len(audio):
                    await ws.send(self._append(audio[sent * FRAME_BYTES:(sent + 1) * FRAME_BYTES]))
                    sent += 1
                    if sent == 16:
                        self.streaming.set()
                    await asyncio.sleep(max(0.0, start + sent * 0.08 - time.monotonic()))  # ok: real-time pacing
            except websockets.ConnectionClosed:
                pass
            self.streaming.set()
            await reader


async def signal_mid_stream(wire: Wire, pid: int, sig: int) -> tuple[asyncio.Task, float]:
    """Start ``wire`` streaming, then send ``sig`` to a stage process: (the wire's task, when the signal went)."""
    task = asyncio.create_task(wire.run(60))
    await wire.streaming.wait()
    os.kill(pid, sig)
    return task, time.monotonic()


def assert_fatal(wire: Wire, code: str, after: float, bound_s: float, message: str = "") -> dict:
    """The session's typed fatal ending, in its dialect, within ``bound_s`` of ``after``; returns the error."""
    errors = wire.errors()
    assert len(errors) == 1, errors
    error = errors[0]
    assert error["error"]["code"] == code and message in error["error"]["message"], error
    if wire.dialect == "v3":
        assert error["error"]["fatal"] is True
        closed = [e for e in wire.events if e["type"] == "session.closed"]
        assert [(e["status"], e["reason"]) for e in closed] == [("failed", code)]
    else:
        assert error["error"]["retryable"] is False
        closed = [e for e in wire.events if e["type"] == "session.closed"]
        assert [e["reason"] for e in closed] == [code]
    assert wire.events[-1]["type"] == "session.closed"  # nothing after it
    assert (wire.close_code, wire.close_reason) == (1011, code)
    print(f"{wire.dialect}: {error['error']['message']!r} {error['_at'] - after:.2f} s after the fault, closed at "
          f"{(wire.closed_at or after) - after:.2f} s")  # the measured figures (pytest -rP shows them)
    assert error["_at"] - after < bound_s, f"{error['_at'] - after:.2f} s"
    assert wire.closed_at is not None and wire.closed_at - after < bound_s + 1.0
    return error


# ------------------------------------------------------------------------------------------------ the faults


def test_a_raising_hook_fails_only_its_session(engine):
    """Fault 3: our thinker's hook raises for one request (fault injection). That session (tiered) gets its fatal
    ``internal_error``; a concurrent v3 session goes on and gets its whole answer; the engine stays ready."""
    from vllm_omni_voicechat.client import V3Client
    from vllm_omni_voicechat.omni.tiny import script

    async def main():
        async with await V3Client.connect(engine.ws + "/v1/voicechat") as c:
            await c.configure("You are helpful.")
            turn_id = await c.start_turn(1)
            await c.send_audio(speech("what time is it"), paced=False)
            faulty = Wire(engine.ws + "/v1/duplex", "tiered", instructions=f"You are helpful. {FAULT_MARKER}")
            started = time.monotonic()
            await asyncio.wait_for(faulty.run(30), 60)
            await c.commit(1)
            response = await c.response_for(turn_id, timeout=60)
            await c.response_done(response.response_id, timeout=60)
            await c.stop()
            return faulty, started, list(c.events), c.errors

    faulty, started, events, errors = run(main())
    assert_fatal(faulty, "internal_error", started, 30.0, message="fault injected by the test plugin")
    assert errors == []
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == list(script.RESPONSE_WORDS)
    body = idle(engine)
    assert body["active_sessions"] == 0 and body["status"] == "ready" and body["engine"] == "healthy"


def test_a_stopped_stage_ends_its_session_at_the_step_timeout_and_health_says_degraded(engine):
    """Fault 2: Stage 1 (the talker) stops answering (SIGSTOP). The session's position waits out the step timeout
    (Stage-0 output, then the Stage-2 packet: at most twice it), ends with ``internal_error`` and 1011, and frees its
    slot; ``/health`` says degraded with the reason. Once the stage runs again, a new session's turn is answered and
    ``/health`` is ready again."""
    from vllm_omni_voicechat.client import V3Client

    talker = engine.stage_pids()[1]
    wire = Wire(engine.ws + "/v1/voicechat", "v3")

    async def main():
        task, stopped = await signal_mid_stream(wire, talker, signal.SIGSTOP)
        try:
            await asyncio.wait_for(task, 4 * STEP_TIMEOUT_S + 10)
            return stopped, idle(engine)
        finally:
            os.kill(talker, signal.SIGCONT)

    stopped, body = run(main())
    assert_fatal(wire, "internal_error", stopped, 2 * STEP_TIMEOUT_S + 2.0, message=f"within {STEP_TIMEOUT_S:g} s")
    assert wire.positions() >= 1  # mid-session: positions ran before the stage stopped
    assert body["active_sessions"] == 0 and body["status"] == "degraded", body
    assert "timed out" in body["reason"] and body["engine"] == "healthy"

    async def after():
        async with await V3Client.connect(engine.ws + "/v1/voicechat") as c:
            await c.configure("You are helpful.")
            turn_id = await c.start_turn(1)
            await c.send_audio(speech("are you back"), paced=False)
            await c.commit(1)
            response = await c.response_for(turn_id, timeout=60)
            done = await c.response_done(response.response_id, timeout=60)
            assert health(engine)[1]["status"] == "ready"  # a position completed since the stall
            await c.stop()
            return done, c.errors

    done, errors = run(after())
    assert errors == [] and done.status == "completed"
    assert idle(engine)["status"] == "ready"


def test_shutdown_under_load_ends_each_session_with_its_typed_error(engine):
    """Fault 4: SIGTERM to ``vllm-omni serve`` while a v3 and a tiered session stream audio. vLLM-Omni's shutdown
    closes every engine session first; each of ours ends with its typed fatal error and 1011 at once (not at the
    step timeout, not as a dropped connection), and the server exits cleanly."""
    wires = [Wire(engine.ws + "/v1/voicechat", "v3"), Wire(engine.ws + "/v1/duplex", "tiered")]

    stages = list(engine.stage_pids().values())
    assert len(stages) == 3
    assert any(p.is_socket() for p in engine.rpc_dir.iterdir())  # vLLM's sockets are in the server's own directory

    async def main():
        tasks = [asyncio.create_task(w.run(60)) for w in wires]
        for w in wires:
            await w.streaming.wait()
        assert health(engine)[1]["active_sessions"] == 2
        engine.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return signalled

    signalled = run(main())
    for wire in wires:
        assert_fatal(wire, "internal_error", signalled, PROMPT_BOUND_S,
                     message="vLLM-Omni ended the session (shutdown)")
    assert engine.process.wait(60) == 0, engine.log_tail()
    import psutil

    procs = []
    for pid in stages:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    psutil.wait_procs(procs, timeout=15)  # stage processes exit with the server
    assert not [pid for pid in stages if alive(pid)]  # no stage process outlives the server
    engine.stop()
    assert not engine.rpc_dir.exists()  # nor do its sockets


@pytest.fixture
def killable(engine, checkpoint, tmp_path_factory):
    """A server of its own (the deployed YAML: its 30 s step timeout), started once the fault server is gone."""
    engine.stop()
    with engine_server(checkpoint, tmp_path_factory.mktemp("engine-kill")) as srv:
        yield srv


def test_a_killed_stage_fails_its_session_at_once_and_health_says_failed(killable):
    """Fault 1: Stage 1's engine-core process is killed (SIGKILL) mid-session. vLLM-Omni evicts the dead replica
    and closes the session's engine side; ours ends with ``internal_error`` and 1011 within ``PROMPT_BOUND_S``
    (the step timeout is 30 s), frees its slot, and ``/health`` answers 503 ``failed`` naming the stage. A new
    session is refused with its typed error at once."""
    server = killable
    talker = server.stage_pids()[1]
    wire = Wire(server.ws + "/v1/voicechat", "v3")

    async def main():
        task, killed = await signal_mid_stream(wire, talker, signal.SIGKILL)
        await asyncio.wait_for(task, 60)
        return killed

    killed = run(main())
    assert_fatal(wire, "internal_error", killed, PROMPT_BOUND_S,
                 message="vLLM-Omni ended the session (request_cleanup)")
    status, body = health(server)
    assert status == 503 and body["status"] == "failed" and body["engine"] == "dead", body
    assert body["reason"] == "vLLM-Omni's engine is not healthy: Stage-1 has no live replica"
    assert body["active_sessions"] == 0

    late = Wire(server.ws + "/v1/voicechat", "v3")
    asked = time.monotonic()
    run(late.run(5), timeout=60)
    assert_fatal(late, "internal_error", asked, 5.0, message="vLLM-Omni refused the session")
    assert health(server)[1]["active_sessions"] == 0
