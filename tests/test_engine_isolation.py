"""Sessions on one engine are independent: four burst-fed scripts run alone, then all four at once on the real engine
on CPU (``vllm-omni serve``, the tiny checkpoint, deploy/voicechat-cpu.yaml: the engine tick batches their positions),
and every position of each script is the same in both runs: its Stage-0 token, its evidence as the wire shows it
(agent control, RNNT blank count, boundary, the thinker's counters and edges) and a digest of its Stage-2 packet.

The packet digest also stands for the talker's codes: the codec is deterministic and the tiny codec's output depends
on the codes (``omni/tiny/script.py``), and before each session's talker drew its noise from a stream of its own
(``omni/talker``) it drew from the process's, so two sessions at once changed each other's codes and audio. The
codes themselves are compared in ``tests/test_omni_tiny_checkpoint.py`` (the talker in-process: sessions interleaved,
and a forward's rows sampled together against each row alone). Together, Stage-1 forwards carry several sessions'
rows, which on CPU our talker samples in one call (``omni/talker/rows.py``), and Stage-2 forwards several sessions'
frames, which our codec decodes in one call (``omni/codec``): the run shows both paths too.

Burst-fed: every append is sent at once and the barriers are written in order, so which position each event lands
on does not depend on timing. A tool turn waits for the client's result on the 80 ms clock (the client's reaction
time decides how many positions run meanwhile), so the tool script is compared up to the call's publication.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re

import pytest

from vllm_omni_voicechat.omni.local_server import engine_available, engine_server

_skip = engine_available()
pytestmark = [pytest.mark.engine, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

TOOLS = [{"type": "function", "name": "get_time", "description": "The local time",
          "parameters": {"type": "object", "properties": {}}}]
BATCH_FIELDS = {"tick", "tick_size", "held_ms", "stage0_batch", "perceived_with"}
"""Telemetry that says how a position was batched, which is what differs between the runs."""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from vllm_omni_voicechat.omni.tiny import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint"), seed=0)
    with engine_server(checkpoint, tmp_path_factory.mktemp("engine-log")) as srv:
        yield srv


def speech(text: str) -> bytes:
    from vllm_omni_voicechat.audio.speech import render_speech

    silence = bytes(2560)
    return silence * 3 + render_speech(text) + silence * 5


async def spoken(c) -> None:
    await c.configure("Isolation: the spoken turn.")
    turn = await c.start_turn(1)
    await c.send_audio(speech("what time is it"), paced=False)
    await c.commit(1)
    response = await c.response_for(turn, timeout=120)
    await c.response_done(response.response_id, timeout=120)


async def two_turns(c) -> None:
    await c.configure("Isolation: two turns.")
    for k, words in ((1, "good morning"), (2, "and the weather")):
        turn = await c.start_turn(k)
        await c.send_audio(speech(words), paced=False)
        await c.commit(k)
        response = await c.response_for(turn, timeout=120)
        await c.response_done(response.response_id, timeout=120)


async def barge_in(c) -> None:
    await c.configure("Isolation: a barge-in.")
    first = await c.start_turn(1)
    await c.send_audio(speech("tell me a story"), paced=False)
    _, second = await asyncio.gather(c.commit(1), c.start_turn(2))  # meets the open response: a cancel
    response = await c.response_for(first, timeout=120)
    await c.response_done(response.response_id, timeout=120)
    await c.send_audio(speech("stop"), paced=False)
    await c.commit(2)
    response = await c.response_for(second, timeout=120)
    await c.response_done(response.response_id, timeout=120)


async def tool(c) -> None:
    await c.configure("Isolation: a tool call.", tools=TOOLS)
    turn = await c.start_turn(1)
    await c.send_audio(speech("what time is it"), paced=False)
    await c.commit(1)
    response = await c.response_for(turn, timeout=120)
    await c.response_done(response.response_id, timeout=180)


SCRIPTS = {"spoken": spoken, "tool": tool, "barge_in": barge_in, "two_turns": two_turns}


async def run_script(url: str, name: str) -> tuple[list[dict], int]:
    from vllm_omni_voicechat.client import V3Client

    async def get_time(arguments):
        return json.dumps({"time": "12:00"})

    async with await V3Client.connect(url + "/v1/voicechat", tools={"get_time": get_time}) as c:
        await SCRIPTS[name](c)
        await c.stop()
        assert c.errors == [], (name, c.errors)
        events = list(c.events)
    positions, batch, perceived = [], 0, 0
    for e in events:
        if e["type"] == "response.function_call_arguments.done" and name == "tool":
            break  # the wait for the client's result runs on the clock: compared up to here
        if e["type"] == "voicechat.metrics" and e["frame"] is not None:
            state = dict(e["turn_state"])
            state.pop("late_ms", None)
            # read when the position completed: whether the commit written right behind the burst was read by then
            # is timing (a loaded machine read it a position later), not the session's evidence
            state.pop("open_client_turn_id", None)
            batch = max(batch, state["model"].get("stage0_batch") or 0)
            perceived = max(perceived, state["model"].get("perceived_with") or 0)
            state["model"] = {k: v for k, v in state["model"].items() if k not in BATCH_FIELDS}
            positions.append({"frame": e["frame"], "transport_frame": e["transport_frame"], **state})
    return positions, (batch, perceived)


def test_four_scripts_together_are_position_by_position_what_each_is_alone(engine):
    runs = {name: asyncio.run(asyncio.wait_for(run_script(engine.ws, name), 300)) for name in SCRIPTS}
    alone = {name: positions for name, (positions, _) in runs.items()}

    async def together():
        return await asyncio.gather(*(run_script(engine.ws, name) for name in SCRIPTS))

    runs_together = dict(zip(SCRIPTS, asyncio.run(asyncio.wait_for(together(), 600))))
    shared = {name: positions for name, (positions, _) in runs_together.items()}
    for name in SCRIPTS:
        assert len(alone[name]) > 20, name
        assert all(p["model"]["stage2_crc32"] is not None and p["model"]["stage0_token"] is not None
                   for p in alone[name])
        first_difference = next((i for i, (a, b) in enumerate(zip(alone[name], shared[name])) if a != b), None)
        assert first_difference is None, (name, first_difference, alone[name][first_difference],
                                          shared[name][first_difference])
        assert len(alone[name]) == len(shared[name]), name
    # the audio is not a constant: the packets carry the talker's codes
    assert len({p["model"]["stage2_crc32"] for p in alone["spoken"]}) > 3
    # alone, each position had a forward and a perception of its own; together, positions shared both
    assert {batches for _, batches in runs.values()} == {(1, 1)}
    assert max(batch for _, (batch, _) in runs_together.values()) >= 2
    assert max(perceived for _, (_, perceived) in runs_together.values()) >= 2
    log = engine.log_path.read_text(errors="replace")
    assert max(stage_forwards(log, 1)) >= 2  # rows sampled together
    assert max(codec_decodes(log)) >= 2  # sessions decoded in one codec call


def codec_decodes(log: str) -> dict[int, int]:
    """The last ``voicechat codec decodes by sessions`` counts our codec logged (omni/codec/model.py)."""
    lines = re.findall(r"voicechat codec decodes by sessions: (\{[^}]*\})", log)
    return {int(k): v for k, v in ast.literal_eval(lines[-1]).items()} if lines else {0: 0}


def stage_forwards(log: str, stage: int) -> dict[int, int]:
    """The last ``voicechat stage N forwards by requests`` counts a stage's scheduler logged (omni/scheduler.py)."""
    lines = re.findall(rf"voicechat stage {stage} forwards by requests: (\{{[^}}]*\}})", log)
    return {int(k): v for k, v in ast.literal_eval(lines[-1]).items()} if lines else {0: 0}
