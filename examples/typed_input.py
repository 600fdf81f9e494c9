"""Type to the assistant instead of speaking: each line is an ``input_text.request`` over the strict v3
protocol, synthesized and injected server-side as a user turn; the assistant answers in speech and text.

Lines come from ``--text`` (repeatable) or, with ``--interactive``, from stdin until EOF or an empty line.
Prints each turn and writes the assistant's audio to one 22,050 Hz WAV. Typed input needs a synthesizer on
the server (the simulator always has one; a real deployment needs Pocket TTS): a rejected request is reported
with its reason.

    vllm-omni-voicechat serve --port 8765 &
    python examples/typed_input.py --url ws://127.0.0.1:8765/v1/voicechat --text "Hello" --text "What time is it?"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path

from vllm_omni_voicechat.audio.wav import write_wav
from vllm_omni_voicechat.client import OUTPUT_SAMPLE_RATE, V3Client, V3ClientError
from vllm_omni_voicechat.client.talk import v3_url

DEFAULT_LINES = ["Hello, can you read this?", "What is the weather like?"]


async def type_lines(url: str, lines: Iterable[str], out: list[str]) -> bytes:
    """One typed turn per line, each played to the end of its response; returns all assistant audio."""
    audio = bytearray()
    async with await V3Client.connect(v3_url(url)) as client:
        await client.configure(instructions="You are a helpful voice assistant.")
        if not client.capabilities.get("typed_input", True):
            out.append("note: the server does not advertise typed input; requests may be rejected")
        for n, line in enumerate(lines, start=1):
            job = await client.request_typed(f"typed-{n}", line)
            if not job.accepted:
                out.append(f"you (typed): {line}  -> rejected: {job.reason}")
                continue
            finished = {"type": "input_text.injection_finished", "job_id": job.job_id}
            await client.wait_for(lambda e, want=finished: all(e.get(k) == v for k, v in want.items()))
            response = await client.response_for(job.turn_id)
            await client.response_done(response.response_id)
            heard = client.turns[job.turn_id].transcript
            out.append(f"you (typed): {line}  [heard: {heard!r}, job {job.disposition}]")
            out.append(f"assistant: {response.text}  [{response.status}]")
            audio += response.audio
    return bytes(audio)


def stdin_lines() -> Iterable[str]:
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            return
        yield line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/voicechat", help="the server's v3 endpoint")
    parser.add_argument("--text", action="append", help="a line to type (repeatable)")
    parser.add_argument("--interactive", action="store_true", help="read lines from stdin")
    parser.add_argument("--wav", default="out/typed_assistant.wav", help="where to write the assistant audio")
    args = parser.parse_args(argv)

    lines = stdin_lines() if args.interactive else (args.text or DEFAULT_LINES)
    out: list[str] = []
    try:
        audio = asyncio.run(type_lines(args.url, lines, out))
    except (V3ClientError, TimeoutError) as error:
        print("\n".join(out), f"protocol error: {error}", sep="\n", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"cannot reach {args.url}: {error}", file=sys.stderr)
        return 2
    write_wav(Path(args.wav), audio)
    print("\n".join(out))
    print(f"{len(audio) / 2 / OUTPUT_SAMPLE_RATE:.2f} s of assistant audio -> {args.wav}")
    return 1 if any("rejected" in line for line in out) else 0


if __name__ == "__main__":
    sys.exit(main())
