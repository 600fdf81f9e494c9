"""The benchmark workload: what each user turn says, as exact 80 ms PCM16 frames at 16 kHz.

A session script is text, one user turn per line. A line that starts with ``wav:`` or ends in ``.wav`` names a WAV
file (any rate, mono or multi-channel PCM16; mixed down and resampled to 16 kHz); any other line is rendered as
simulator speech (``audio.speech.render_speech``), which the simulator model transcribes back word for word. The
same script therefore drives the simulator and a GPU deployment (where a WAV workload is the meaningful one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..audio.frames import FRAME_MS, INPUT_FRAME_BYTES
from ..audio.speech import render_speech
from ..audio.wav import load_wav_16k

WAV_PREFIX = "wav:"


@dataclass(frozen=True)
class TurnSource:
    """One user turn of a session script: simulator speech for ``text`` or the audio of ``wav``."""

    text: str | None = None
    wav: Path | None = None

    @property
    def label(self) -> str:
        return f"wav:{self.wav}" if self.wav is not None else str(self.text)


def parse_script(script: str) -> list[TurnSource]:
    """One turn per non-blank line; see the module docstring. An empty script is an error (nothing to say)."""
    turns = []
    for raw in script.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(WAV_PREFIX):
            turns.append(TurnSource(wav=Path(line[len(WAV_PREFIX):].strip()).expanduser()))
        elif line.lower().endswith(".wav"):
            turns.append(TurnSource(wav=Path(line).expanduser()))
        else:
            turns.append(TurnSource(text=line))
    if not turns:
        raise ValueError("a session script needs at least one non-blank line (one user turn per line)")
    return turns


def split_frames(pcm16: bytes) -> list[bytes]:
    """Exact 1,280-sample frames; a trailing partial frame is zero-padded (the server would pad it at commit)."""
    if len(pcm16) % 2:
        raise ValueError("PCM16 needs an even byte count")
    frames = [pcm16[i:i + INPUT_FRAME_BYTES] for i in range(0, len(pcm16), INPUT_FRAME_BYTES)]
    if frames and len(frames[-1]) < INPUT_FRAME_BYTES:
        frames[-1] = frames[-1] + bytes(INPUT_FRAME_BYTES - len(frames[-1]))
    return frames


def read_wav_16k(path: str | Path) -> bytes:
    """A 16-bit PCM WAV as 16 kHz mono PCM16 (channels averaged, resampled with soxr when the rate differs)."""
    return load_wav_16k(path, pcm16_only=True)


def turn_frames(turn: TurnSource) -> list[bytes]:
    pcm = read_wav_16k(turn.wav) if turn.wav is not None else render_speech(turn.text or "")
    frames = split_frames(pcm)
    if not frames:
        raise ValueError(f"turn {turn.label!r} has no audio")
    return frames


def script_frames(script: str) -> list[tuple[TurnSource, list[bytes]]]:
    """Each turn of ``script`` with its frames, in order."""
    return [(turn, turn_frames(turn)) for turn in parse_script(script)]


# The scripts a run uses when no --dataset-path is given: short simulator-speech turns (each line one turn).
DEFAULT_SCRIPTS = (
    "hello there\nwhat is the weather like today",
    "can you hear me\nplease tell me a joke",
    "good morning",
    "how long does it take to boil an egg",
)


def load_scripts(path: str | Path | None) -> list[str]:
    """Session scripts from a JSONL file, one ``{"prompt": "<script>"}`` per line (vLLM's ``custom`` dataset
    format, read without pandas); ``DEFAULT_SCRIPTS`` when ``path`` is None."""
    if path is None:
        return list(DEFAULT_SCRIPTS)
    import json

    scripts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path}:{n}: each line must be a JSON object with a string 'prompt'")  # noqa: TRY004
            parse_script(row["prompt"])  # fail early, before any session starts
            scripts.append(row["prompt"])
    if not scripts:
        raise ValueError(f"{path}: no prompts")
    return scripts


def pick_scripts(scripts: list[str], count: int, *, seed: int = 0, shuffle: bool = True) -> list[str]:
    """``count`` session scripts (all of them when ``count`` <= 0): the list in a seeded shuffle (or as given),
    repeated round-robin when more sessions than scripts are asked for."""
    order = list(scripts)
    if shuffle:
        import random

        random.Random(seed).shuffle(order)
    count = len(order) if count <= 0 else count
    return [order[i % len(order)] for i in range(count)]


def speech_ms(frames: list[bytes]) -> int:
    return len(frames) * FRAME_MS


__all__ = ["DEFAULT_SCRIPTS", "TurnSource", "load_scripts", "parse_script", "pick_scripts", "read_wav_16k", "script_frames", "speech_ms", "split_frames", "turn_frames"]
