"""A function call answered by a real local Python function: the assistant asks for the local time in a city,
the client computes it (``local_time`` below, from a table of UTC offsets) and the assistant speaks the result.

Over the strict v3 protocol: the client advertises the tool's schema in ``session.update``, the server publishes
the call (``response.function_call_arguments.done``), ``V3Client`` runs the registered handler and sends its
output (``conversation.item.create{function_call_output}``), the server injects it and answers
``conversation.item.function_call_output.applied``, and the same response goes on to speak the result.

The simulator calls a tool when the user says ``call NAME {json}`` (``--say``, the default); a real model
decides from a spoken question (``--wav``, e.g. "What time is it in Tokyo?").

    vllm-omni-voicechat serve --port 8765 &
    python examples/tool_call.py --url ws://127.0.0.1:8765/v1/voicechat --city Tokyo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k
from vllm_omni_voicechat.client import V3Client, V3ClientError
from vllm_omni_voicechat.client.talk import v3_url

# Standard-time UTC offsets (hours); no DST rules, so the example needs no tz database.
UTC_OFFSETS = {
    "London": 0, "Paris": 1, "Berlin": 1, "Cairo": 2, "Moscow": 3, "Dubai": 4, "Mumbai": 5.5, "Bangkok": 7,
    "Beijing": 8, "Singapore": 8, "Tokyo": 9, "Sydney": 10, "Auckland": 12, "Sao Paulo": -3, "New York": -5,
    "Chicago": -6, "Denver": -7, "Los Angeles": -8, "Honolulu": -10,
}

LOCAL_TIME_TOOL = {
    "type": "function",
    "name": "local_time",
    "description": "The current local time (24-hour clock) in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "A city name, e.g. Tokyo"}},
        "required": ["city"],
    },
}


def local_time(city: str, now: datetime | None = None) -> str:
    """``"21:05 in Tokyo (UTC+09:00)"``, or an explanation when the city is unknown."""
    match = next((name for name in UTC_OFFSETS if name.lower() == city.strip().lower()), None)
    if match is None:
        return f"I do not know the time zone of {city}"
    tz = timezone(timedelta(hours=UTC_OFFSETS[match]))
    at = (now or datetime.now(UTC)).astimezone(tz)
    offset = at.strftime("%z")
    return f"{at:%H:%M} in {match} (UTC{offset[:3]}:{offset[3:]})"


async def local_time_handler(arguments: dict[str, Any]) -> str:
    """The V3Client tool handler: the published call's JSON arguments in, the tool output out."""
    return local_time(str(arguments.get("city", "")))


async def ask(url: str, utterance: bytes, paced: bool) -> tuple[V3Client, list[str]]:
    lines: list[str] = []
    async with await V3Client.connect(v3_url(url), tools={"local_time": local_time_handler}) as client:
        await client.configure(instructions="Answer time questions with the local_time tool.", tools=[LOCAL_TIME_TOOL])
        await client.start_turn(1)
        await client.send_audio(utterance, paced=paced)
        turn_id = await client.commit(1)
        response = await client.response_for(turn_id)
        lines.append(f"user: {client.turns[turn_id].transcript}")
        call = await client.wait_for("response.function_call_arguments.done", 30)
        run = await client.tool_run_done(call["call_id"])
        lines.append(f"tool call {run.name}({call['arguments']}) -> {run.output!r} [{run.outcome}]")
        await client.response_done(response.response_id, 60)
        lines.append(f"assistant: {response.text}  [{response.status}]")
    return client, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/voicechat", help="the server's v3 endpoint")
    parser.add_argument("--city", default="Tokyo", help="the city to ask about (simulator speech)")
    parser.add_argument("--wav", help="ask with this WAV instead (a real model decides to call the tool)")
    parser.add_argument("--paced", action=argparse.BooleanOptionalAction, default=True,
                        help="stream the question in real time (default) or as fast as possible")
    args = parser.parse_args(argv)

    spoken = f"call local_time {json.dumps({'city': args.city})}"
    utterance = load_wav_16k(args.wav) if args.wav else render_speech(spoken)
    try:
        client, lines = asyncio.run(ask(args.url, utterance, args.paced))
    except (V3ClientError, TimeoutError) as error:
        print(f"protocol error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"cannot reach {args.url}: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    runs = list(client.tool_runs.values())
    return 0 if runs and all(run.outcome == "applied" for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
