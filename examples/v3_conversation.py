"""Hold one conversation with a running voicechat server over the strict v3 protocol.

Three user turns: a spoken turn, a typed turn (``input_text.request``) and a barge-in (a new spoken turn
started while the assistant's response is still open, which the server cancels). Prints the transcript and
what the assistant's audio says, and writes all assistant audio to a 22,050 Hz mono WAV. Exits non-zero on
any protocol error. ``--tools`` adds a fourth turn that calls a ``get_weather`` tool run by the client.

    vllm-omni-voicechat serve --model sim --port 8765 &
    python examples/v3_conversation.py --url ws://127.0.0.1:8765/v1/realtime --wav out/v3_assistant.wav
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.audio.wav import write_wav
from vllm_omni_voicechat.client import OUTPUT_SAMPLE_RATE, Response, V3Client, V3ClientError


async def spoken_turn(client: V3Client, client_turn_id: int, text: str, paced: bool) -> Response:
    """Start, stream and commit one microphone turn; returns its response as soon as it is created."""
    await client.start_turn(client_turn_id)
    await client.send_audio(render_speech(text), paced=paced)
    turn_id = await client.commit(client_turn_id)
    return await client.response_for(turn_id)


async def converse(url: str, paced: bool, tools: bool = False) -> V3Client:
    handlers = {"get_weather": get_weather} if tools else None
    async with await V3Client.connect(url, tools=handlers) as client:
        await client.configure(instructions="You are a helpful voice assistant.", tools=[WEATHER] if tools else None)

        # 1. A spoken turn, played to the end.
        first = await spoken_turn(client, 1, "Hello, can you hear me?", paced)
        await client.response_done(first.response_id)

        # 2. A typed turn: synthesized and injected server-side.
        job = await client.request_typed("typed-1", "What is the weather like?")
        if not job.accepted:
            raise V3ClientError(f"typed request rejected: {job.reason}")
        await client.wait_for(lambda e: e["type"] == "input_text.injection_finished" and e["job_id"] == job.job_id)
        typed = await client.response_for(job.turn_id)
        await client.response_done(typed.response_id)

        # 3. Barge-in: start a new turn while the assistant is still answering the previous one.
        story = await spoken_turn(client, 2, "Tell me a story about the sea", paced)
        # Let it say a word first, then barge in; the server cancels `story` before acknowledging turn 3.
        rid = story.response_id
        await client.wait_for(lambda e: e["type"] == "response.output_text.delta" and e["response_id"] == rid)
        await client.start_turn(3)
        await client.send_audio(render_speech("Stop, thanks"), paced=paced)
        last = await client.response_for(await client.commit(3))
        await client.response_done(last.response_id)
        if story.status != "cancelled":
            raise V3ClientError(f"the barged-in response ended {story.status!r}, not 'cancelled'")

        if tools:  # 4. A function call: the client runs get_weather and the answer speaks its result.
            answer = await spoken_turn(client, 4, 'call get_weather {"city": "Paris"}', paced)
            call = await client.wait_for("response.function_call_arguments.done")
            run = await client.tool_run_done(call["call_id"])
            print(f"tool {run.name}({call['arguments']}) -> {run.output!r}: {run.outcome}")
            await client.response_done(answer.response_id)
    return client


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def get_weather(arguments: dict) -> str:
    return f"sunny in {arguments.get('city', 'your city')}"


def transcript(client: V3Client) -> list[str]:
    lines = []
    for event in client.events:
        match event["type"]:
            case "conversation.item.input_audio_transcription.completed":
                lines.append(f"user ({event['source']}): {event['transcript'] or '<empty>'}")
            case "input_text.injection_finished":
                lines.append(f"typed job {event['job_id']}: {event['disposition']}")
            case "response.done":
                r = client.responses[event["response_id"]]
                lines.append(f"assistant: {r.text or '<no text>'}  [{r.status}: {r.reason}]")
                lines.append(f"  audio says: {decode_speech(bytes(r.audio), OUTPUT_SAMPLE_RATE) or '<silence>'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/realtime", help="the server's v3 endpoint")
    parser.add_argument("--wav", default="out/v3_assistant.wav", help="where to write the assistant audio")
    parser.add_argument(
        "--paced", action=argparse.BooleanOptionalAction, default=True, help="stream microphone audio in real time"
    )
    parser.add_argument("--tools", action="store_true", help="also demo a function call (get_weather)")
    args = parser.parse_args(argv)

    try:
        client = asyncio.run(converse(args.url, args.paced, args.tools))
    except (V3ClientError, TimeoutError) as error:
        print(f"protocol error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"cannot reach {args.url}: {error}", file=sys.stderr)
        return 2

    audio = b"".join(bytes(r.audio) for r in client.responses.values())
    write_wav(Path(args.wav), audio)
    print("\n".join(transcript(client)))
    closed = client.closed_event or {}
    print(f"session {closed.get('status')} ({closed.get('reason')}), close code {client.close_code}")
    print(f"{len(audio) / 2 / OUTPUT_SAMPLE_RATE:.2f} s of assistant audio -> {args.wav}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
