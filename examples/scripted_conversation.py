"""Play one scripted conversation through the runtime on the embedded simulator model.

Three user turns: a spoken turn, a typed turn, and a barge-in (a new spoken turn while the assistant speaks).
The assistant audio (22.05 kHz) goes to a WAV file; the transcript goes to stdout. Runs on a virtual clock,
so it takes well under a second.

    python examples/scripted_conversation.py --wav out/assistant.wav
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_omni_voicechat.audio.frames import INPUT_FRAME_BYTES, OUTPUT_SAMPLE_RATE
from vllm_omni_voicechat.audio.speech import decode_speech, render_speech
from vllm_omni_voicechat.audio.wav import write_wav
from vllm_omni_voicechat.model.port import SessionPrompt
from vllm_omni_voicechat.session.commands import AppendAudio, CommitTurn, Configure, RequestTypedInput, StartTurn, Stop
from vllm_omni_voicechat.session.core import SessionConfig, SessionCore
from vllm_omni_voicechat.session.events import (
    AudioDelta,
    NativeEvent,
    ResponseCreated,
    ResponseDone,
    TranscriptCompleted,
    TypedInjectionFinished,
)
from vllm_omni_voicechat.shell.sync import SyncDriver
from vllm_omni_voicechat.sim.model import SimulatorModel
from vllm_omni_voicechat.synth.simulated import SimulatorSynthesizer

CHUNK = INPUT_FRAME_BYTES  # the client streams 80 ms appends


def stream(driver: SyncDriver, pcm: bytes) -> None:
    for i in range(0, len(pcm), CHUNK):
        driver.send(AppendAudio(pcm[i : i + CHUNK]))
        driver.run(advance_time=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wav", default="out/assistant.wav", help="where to write the assistant audio")
    args = parser.parse_args(argv)

    lines: list[str] = []
    audio = bytearray()
    spoken: dict[str, bytearray] = {}

    def on_event(event: NativeEvent) -> None:
        if isinstance(event, TranscriptCompleted):
            lines.append(f"user ({event.source}): {event.transcript or '<empty>'}")
        elif isinstance(event, ResponseCreated):
            spoken[event.response_id] = bytearray()
        elif isinstance(event, AudioDelta):
            audio.extend(event.pcm)
            spoken[event.response_id].extend(event.pcm)
        elif isinstance(event, ResponseDone):
            # What the assistant said, decoded from its audio (simulator speech round-trips exactly).
            said = decode_speech(bytes(spoken.pop(event.response_id)), OUTPUT_SAMPLE_RATE)
            lines.append(f"assistant: {said}  [{event.status}: {event.reason}]")
        elif isinstance(event, TypedInjectionFinished):
            lines.append(f"typed job {event.job_id}: {event.disposition}")

    core = SessionCore(SessionConfig())
    driver = SyncDriver(core, SimulatorModel(), synthesizer=SimulatorSynthesizer(), step_seconds=0.002, on_event=on_event)
    driver.send(Configure(SessionPrompt("You are a helpful voice assistant.")))

    # 1. A spoken turn, streamed in 80 ms appends, then the client's commit.
    driver.send(StartTurn(1, "start-1"))
    stream(driver, render_speech("Hello there, can you hear me?"))
    driver.send(CommitTurn(1, "commit-1"))
    driver.run()

    # 2. A typed turn: synthesized server-side and injected through the same RNNT path.
    driver.send(RequestTypedInput("typed-1", "What is the weather like?"))
    driver.run()

    # 3. Barge-in: a new turn while the assistant is still speaking cancels its response first.
    driver.send(StartTurn(2, "start-2"))
    stream(driver, render_speech("Tell me a story about the sea"))
    driver.send(CommitTurn(2, "commit-2"))
    driver.run(advance_time=False)  # the response has just opened
    driver.run(max_positions=5)  # ... and speaks a little
    driver.send(StartTurn(3, "start-3"))
    stream(driver, render_speech("Stop, thanks"))
    driver.send(CommitTurn(3, "commit-3"))
    driver.run()
    driver.send(Stop())
    driver.run()

    out = Path(args.wav)
    write_wav(out, bytes(audio))

    print("\n".join(lines))
    print(
        f"{driver.positions} model positions, {len(audio) / 2 / OUTPUT_SAMPLE_RATE:.2f} s of assistant audio "
        f"-> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
