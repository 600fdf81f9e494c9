"""The OpenAI Agents SDK (``openai-agents``) realtime session, unmodified, against this server's
OpenAI-compatible lane (``/v1/realtime?model=...``: Tier 1-2 events only), with a local function tool.

The agent gets a ``date_after`` tool computed here in Python. Each ``--say`` utterance is streamed as 24 kHz
PCM16 (the SDK's default format) followed by a second of silence, so the model's own end-of-utterance ends the
user turn (the default ``semantic_vad``). Against the simulator, utterances are rendered as simulator speech
and ``call NAME {json}`` makes it call a tool; against a real model use ``--wav``. ``--text`` sends a typed
message instead (``conversation.item.create`` + ``response.create``). Prints the conversation as the SDK
reports it and writes the assistant audio to one 24 kHz WAV.

Needs ``pip install openai-agents==0.24.0`` (it pins ``websockets<17``, so give it its own venv).

    vllm-omni-voicechat serve --port 8765 &
    python examples/openai_agents_realtime.py --url ws://127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import soxr
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k, write_wav

SDK_RATE = 24_000  # the SDK's default pcm16 rate, both directions
CHUNK_BYTES = 4_800  # 100 ms at 24 kHz
DEFAULT_SAY = 'call date_after {"start": "2026-11-30", "days": 30}'


@function_tool
def date_after(start: str, days: int) -> str:
    """The date a number of days after a start date (ISO format, e.g. 2026-11-30), with its weekday."""
    try:
        end = date.fromisoformat(start) + timedelta(days=int(days))
    except ValueError as error:
        return f"cannot compute that: {error}"
    return f"{end.isoformat()}, a {end:%A}"


def to_24k(pcm16_16k: bytes) -> bytes:
    samples = np.frombuffer(pcm16_16k, dtype="<i2")
    return soxr.resample(samples, 16_000, SDK_RATE).astype("<i2").tobytes()


def item_line(item) -> str | None:
    """One line per history item: who said what, and each tool call with its output."""
    if item.type == "function_call":
        return f"tool {item.name}({item.arguments}) -> {item.output!r}"
    text = " ".join(
        str(getattr(c, "transcript", None) or getattr(c, "text", None) or "") for c in item.content
    ).strip()
    return f"{item.role}: {text}" if text else None


def answer_ended(event) -> bool:
    """A raw ``response.done`` whose output holds no function call: the spoken answer (not a tool request)."""
    if event.type != "raw_model_event" or getattr(event.data, "type", None) != "raw_server_event":
        return False
    raw = event.data.data
    if raw.get("type") != "response.done":
        return False
    return not any(item.get("type") == "function_call" for item in raw["response"].get("output") or [])


async def converse(url: str, model: str, turns: list[tuple[str, bytes | str]], out: list[str],
                   timeout: float = 60.0) -> bytes:
    """Run each turn until its spoken answer is done; returns the assistant audio (24 kHz PCM16)."""
    agent = RealtimeAgent(name="assistant", instructions="Be brief. Use tools for dates.", tools=[date_after])
    # Explicit (empty) headers: the local server needs no OpenAI API key.
    session = await RealtimeRunner(agent).run(model_config={"url": f"{url}/v1/realtime?model={model}", "headers": {}})
    audio = bytearray()
    errors: list[str] = []
    history: list = []
    async with session:
        events = session.__aiter__()
        for kind, payload in turns:
            if kind == "text":
                await session.send_message(payload)
            else:
                pcm = payload + bytes(2 * SDK_RATE)  # a second of silence: the model ends the turn
                for i in range(0, len(pcm), CHUNK_BYTES):
                    await session.send_audio(pcm[i : i + CHUNK_BYTES])
            while True:
                event = await asyncio.wait_for(events.__anext__(), timeout)
                if event.type == "audio":
                    audio += event.audio.data
                elif event.type == "history_updated":
                    history = list(event.history)
                elif event.type == "error":
                    errors.append(str(event.error))
                elif answer_ended(event):
                    break
    out.extend(line for item in history if (line := item_line(item)) is not None)
    if errors:
        raise RuntimeError(f"the session reported errors: {errors}")
    return bytes(audio)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the server's base URL")
    parser.add_argument("--model", default="sim", help="the served model name (puts the SDK on the OpenAI lane)")
    parser.add_argument("--say", action="append", help="an utterance as simulator speech (repeatable)")
    parser.add_argument("--wav", action="append", help="an utterance from a WAV file (repeatable)")
    parser.add_argument("--text", action="append", help="a typed message (repeatable)")
    parser.add_argument("--out", default="out/agents_assistant.wav", help="where to write the assistant audio")
    args = parser.parse_args(argv)

    turns: list[tuple[str, bytes | str]] = [("audio", to_24k(render_speech(s))) for s in args.say or []]
    turns += [("audio", to_24k(load_wav_16k(w))) for w in args.wav or []]
    turns += [("text", t) for t in args.text or []]
    turns = turns or [("audio", to_24k(render_speech(DEFAULT_SAY)))]
    out: list[str] = []
    try:
        audio = asyncio.run(converse(args.url.rstrip("/"), args.model, turns, out))
    except (RuntimeError, TimeoutError, OSError) as error:
        print("\n".join(out), f"failed: {error!r}", sep="\n", file=sys.stderr)
        return 1
    path = Path(args.out)
    write_wav(path, audio, SDK_RATE)
    print("\n".join(out))
    print(f"{len(audio) / 2 / SDK_RATE:.2f} s of assistant audio -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
