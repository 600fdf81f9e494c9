"""Ask a question, interrupt the answer mid-stream, and write one WAV per response, with vLLM-Omni's own
``DuplexClient`` over the tiered duplex dialect (``/v1/realtime?duplex=1``) and our session preset.

Needs ``vllm-omni`` (``vllm_omni.clients.duplex``). Input WAVs should be mono 16 kHz PCM16 (others are converted);
without them the question and the interruption are rendered as simulator speech, which the simulator server
transcribes. ``--barge-in`` picks who ends the first answer:

* ``vad`` (default): ``server_vad`` turn detection; the interruption's speech onset cancels the answer
  (``overlap.decision{action:"barge_in"}``).
* ``model``: model-owned turn-taking (``turn_detection: null``); the answer goes on while the user speaks and
  the interruption's end of utterance replaces it.
* ``cancel``: client-forced: ``response.cancel``, then the interruption.

    vllm-omni-voicechat serve --port 8765 &
    python examples/duplex_barge_in.py --url ws://127.0.0.1:8765/v1/realtime --output-dir out/duplex
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.clients.duplex import DuplexClient, DuplexClientError, ResponseHandle, write_pcm16_wav

from vllm_omni_voicechat.audio.speech import render_speech
from vllm_omni_voicechat.audio.wav import load_wav_16k
from vllm_omni_voicechat.omni.client_preset import SIMULATOR_MODEL, create_duplex_session_config, stream_pcm16

QUESTION = "Tell me a long story about the sea and the sky"
INTERRUPTION = "Stop, what time is it?"
TURN_DETECTION = {"vad": {"type": "server_vad", "interrupt_response": True}, "model": None, "cancel": None}


@dataclass
class Answer:
    index: int
    response_id: str
    status: str
    reason: str | None
    transcript: str
    audio_s: float
    wav: Path


async def collect(client: DuplexClient, output_dir: Path, answers: list[Answer], heard: asyncio.Event,
                  interrupt_after_ms: float, count: int) -> None:
    """Drain responses in order: one WAV each; ``heard`` is set once the first answer played enough audio."""
    async for handle in client.responses():
        if handle.response_id is None:  # a standalone listen decision, not a response
            continue
        audio = bytearray()
        async for chunk in handle.audio():
            audio += chunk
            if handle.played_ms >= interrupt_after_ms:
                heard.set()
        heard.set()  # an answer shorter than interrupt_after_ms still lets the interruption go
        answers.append(finish(handle, bytes(audio), client.config.output_audio.sample_rate_hz, output_dir,
                              len(answers) + 1))
        if len(answers) == count:
            return


def finish(handle: ResponseHandle, audio: bytes, rate: int, output_dir: Path, index: int) -> Answer:
    response = (handle.done_event.raw.get("response") or {}) if handle.done_event else {}
    details = response.get("status_details") or {}
    path = output_dir / f"response_{index:02d}.wav"
    write_pcm16_wav(path, audio, sample_rate_hz=rate)
    return Answer(index, handle.response_id, response.get("status", "?"), details.get("reason"),
                  handle.transcript, round(len(audio) / 2 / rate, 3), path)


async def until(event: asyncio.Event, collector: asyncio.Task, timeout: float) -> None:
    """Wait for ``event``; a collector that failed first raises its error instead of a timeout."""
    waiter = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait({waiter, collector}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if collector in done:
        collector.result()
    if not done:
        raise TimeoutError(f"no answer audio within {timeout} s")


async def barge_in(url: str, model: str, question: bytes, interruption: bytes, *, policy: str,
                   interrupt_after_ms: float, realtime: bool, output_dir: Path, timeout: float = 60.0) -> list[Answer]:
    output_dir.mkdir(parents=True, exist_ok=True)
    config = create_duplex_session_config(instructions="You are a helpful voice assistant.",
                                          turn_detection=TURN_DETECTION[policy])
    answers: list[Answer] = []
    heard = asyncio.Event()
    async with DuplexClient(url, model=model, config=config, reconnect=None) as client:
        collector = asyncio.create_task(collect(client, output_dir, answers, heard, interrupt_after_ms, 2))
        try:
            await stream_pcm16(client, question, realtime=realtime)
            await client.commit()
            await until(heard, collector, timeout)  # the answer is playing: interrupt it now
            if policy == "cancel":
                await client.cancel_response()
            await stream_pcm16(client, interruption, realtime=realtime)
            await client.commit()
            await asyncio.wait_for(asyncio.shield(collector), timeout)
        finally:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/realtime", help="the server's realtime endpoint")
    parser.add_argument("--model", default=SIMULATOR_MODEL, help="the served model name")
    parser.add_argument("--question-wav", help="the question (mono 16 kHz PCM16 WAV)")
    parser.add_argument("--interrupt-wav", help="the interruption (mono 16 kHz PCM16 WAV)")
    parser.add_argument("--question", default=QUESTION, help="the question as simulator speech (no --question-wav)")
    parser.add_argument("--interrupt", default=INTERRUPTION, help="the interruption as simulator speech")
    parser.add_argument("--barge-in", choices=sorted(TURN_DETECTION), default="vad", help="who ends the first answer")
    parser.add_argument("--interrupt-after-ms", type=float, default=400.0,
                        help="interrupt once this much of the answer's audio has arrived")
    parser.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                        help="stream input in real time (default) or as fast as possible")
    parser.add_argument("--output-dir", default="out/duplex", help="one WAV per response goes here")
    args = parser.parse_args(argv)

    question = load_wav_16k(args.question_wav) if args.question_wav else render_speech(args.question)
    interruption = load_wav_16k(args.interrupt_wav) if args.interrupt_wav else render_speech(args.interrupt)
    try:
        answers = asyncio.run(barge_in(args.url, args.model, question, interruption, policy=args.barge_in,
                                       interrupt_after_ms=args.interrupt_after_ms, realtime=args.realtime,
                                       output_dir=Path(args.output_dir)))
    except (DuplexClientError, TimeoutError) as error:
        print(f"duplex error: {error!r}", file=sys.stderr)
        return 1
    for a in answers:
        reason = f" ({a.reason})" if a.reason else ""
        print(f"response {a.index} {a.response_id}: {a.status}{reason} {a.transcript!r} {a.audio_s:.2f} s -> {a.wav}")
    interrupted = len(answers) == 2 and answers[0].status == "cancelled" and answers[1].status == "completed"
    print("barge-in " + ("ok: the first answer was cut off, the second completed" if interrupted else "FAILED"))
    return 0 if interrupted else 1


if __name__ == "__main__":
    sys.exit(main())
