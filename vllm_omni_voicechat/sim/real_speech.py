"""Real speech for the simulator (``serve --model sim --speech real``): PocketSphinx hears the user, eSpeak NG
speaks the replies. An optional mode behind the same model port: the simulator still decides what to say (the echo,
the greeting, a ``call NAME`` said aloud, a tool's result); only its ear and its mouth change. The deterministic
simulator speech stays the default, for tests and benchmarks.

- The ear: PocketSphinx (the ``pocketsphinx`` wheel ships its en-us acoustic model, language model and dictionary)
  decodes each 80 ms position as it arrives; a frame louder than ``SPEECH_DBFS`` is speech; ``HANGOVER`` quiet
  positions end an utterance (pauses between words do not), and its words arrive then, on that quiet position, as
  the RNNT's last word does; the session's fence counts the quiet positions from the first one.
- The mouth: eSpeak NG (Debian's ``espeak-ng``) renders the whole reply at 22.05 kHz, the model's own output rate,
  when the reply starts; it goes out one 80 ms frame per position, the reply's text tokens spread over its frames,
  so a barge-in cuts the speech where it is.
- Typed input is spoken by eSpeak NG at 16 kHz (:class:`EspeakSynthesizer`) and heard by the same ear.

Without the wheel or the program the mode refuses to start, naming :data:`INSTALL`."""

from __future__ import annotations

import functools
import importlib.util
import io
import shutil
import subprocess
import wave
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..audio.frames import INPUT_SAMPLE_RATE, OUTPUT_FRAME_SAMPLES, OUTPUT_SAMPLE_RATE
from ..audio.speech import DecodeStep
from ..errors import VoicechatError

INSTALL = "pip install -e '.[voice]' and bash scripts/install_espeak.sh"
SPEECH_DBFS = -40.0
"""A position whose RMS is above this is speech (eSpeak NG speaks at about -20 dBFS; a quiet room is below -50)."""
HANGOVER = 3
"""Quiet positions (240 ms) that end an utterance: shorter pauses are between words."""
VOICE = "en-us+f2"
"""eSpeak NG's voice: of those tried (en-us, +f2, +f3, +m3, en; 120-160 words a minute), the one PocketSphinx's
en-us model recognised best: about half the words of the test sentences (tests/test_real_speech.py)."""
PREROLL = 2
"""Quiet positions before an utterance's first loud one that the ear decodes too: a soft onset is not cut off."""
WORDS_PER_MINUTE = 140
ESPEAK_TIMEOUT_S = 10.0
AHEAD = 4
"""Replies a mouth renders ahead at most (one per finished utterance of the turn so far)."""
PRIMER = "the quick brown fox jumps over the lazy dog, and then it rests in the warm sun for a while"
"""Spoken once per process to find the cepstral mean a new ear starts from: PocketSphinx's live normalisation starts
from a generic one and misheard a session's first sentence (word accuracy on the test sentences 0.52 -> 0.70)."""


class SpeechUnavailable(VoicechatError, RuntimeError):
    """The real-speech mode's packages are not installed here."""


def check_available() -> None:
    """Raise :class:`SpeechUnavailable` naming what to install, unless PocketSphinx and eSpeak NG are both here."""
    missing = [name for name, present in (("the pocketsphinx package", importlib.util.find_spec("pocketsphinx")),
                                          ("the espeak-ng program", shutil.which("espeak-ng"))) if not present]
    if missing:
        raise SpeechUnavailable(f"real speech needs {' and '.join(missing)}: {INSTALL}")


def espeak(text: str, sample_rate: int = OUTPUT_SAMPLE_RATE) -> np.ndarray:
    """``text`` spoken by eSpeak NG, int16 mono at ``sample_rate`` (its own rate is 22.05 kHz)."""
    done = subprocess.run(["espeak-ng", "--stdout", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--", text],
                          capture_output=True, check=True, timeout=ESPEAK_TIMEOUT_S)
    with wave.open(io.BytesIO(done.stdout)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if rate != sample_rate:
        import soxr

        pcm = np.clip(soxr.resample(pcm.astype(np.float32), rate, sample_rate), -32768, 32767).astype("<i2")
    return pcm


def spoken_frames(text: str) -> list[bytes]:
    """The reply's audio as 80 ms output frames (the last one padded with silence)."""
    pcm = espeak(text)
    n = -(-len(pcm) // OUTPUT_FRAME_SAMPLES)
    padded = np.zeros(n * OUTPUT_FRAME_SAMPLES, dtype="<i2")
    padded[: len(pcm)] = pcm
    return [padded[i * OUTPUT_FRAME_SAMPLES : (i + 1) * OUTPUT_FRAME_SAMPLES].tobytes() for i in range(n)]


class Mouth:
    """One session's mouth: a reply's frames, rendered by eSpeak NG. A reply known before it is due (the echo of an
    utterance the ear has finished: the turn ends at least the fence's quiet positions later) is rendered ahead on a
    thread of the mouth's own, so the position that opens it does not wait for eSpeak NG (~50 ms a start)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[str, Future[list[bytes]]] = {}

    def prepare(self, text: str) -> None:
        if text in self._ahead:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="voicechat-espeak")
        while len(self._ahead) >= AHEAD:  # a user who keeps talking: only the latest guesses are kept
            self._ahead.pop(next(iter(self._ahead))).cancel()
        self._ahead[text] = self._pool.submit(spoken_frames, text)

    def frames(self, text: str) -> list[bytes]:
        """``text``'s frames: rendered ahead, or now."""
        ahead, self._ahead = self._ahead.pop(text, None), {}
        return ahead.result() if ahead is not None else spoken_frames(text)


def token_schedule(tokens: int, frames: int) -> list[int]:
    """How many of the reply's text tokens go out with each of its audio frames: spread evenly, none held back
    (more tokens than frames: the extra ones go out with the last frames)."""
    if frames <= 0:
        return []
    return [(i + 1) * tokens // frames - i * tokens // frames for i in range(frames)]


@dataclass(frozen=True, slots=True)
class _Level:
    threshold: float

    def loud(self, pcm: np.ndarray) -> bool:
        return bool(pcm.size) and float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > self.threshold


def _decoder():
    from pocketsphinx import Decoder  # the optional extra: imported only in this mode

    # No flat-lexicon second pass: it made an utterance's last position cost 126 ms on average (max 165), 40 (max
    # 69) without it, and the test sentences' word accuracy was 0.66 with it, 0.73 without
    return Decoder(samprate=INPUT_SAMPLE_RATE, loglevel="FATAL", fwdflat=False)


@functools.cache
def _primed_cmn() -> str:
    """The cepstral mean after :data:`PRIMER` spoken by eSpeak NG (~0.3 s, once per process)."""
    decoder = _decoder()
    decoder.start_utt()
    decoder.process_raw(espeak(PRIMER, INPUT_SAMPLE_RATE).tobytes(), False, False)
    decoder.end_utt()
    return decoder.get_cmn()


class SphinxEar:
    """One session's ear: ``feed`` one position of 16 kHz PCM16, get the words completed on it and whether it was
    speech (the :class:`~vllm_omni_voicechat.audio.speech.SpeechDecoder` interface the simulator hears with)."""

    def __init__(self) -> None:
        self._decoder = _decoder()
        self._decoder.set_cmn(_primed_cmn())
        self._level = _Level(32768.0 * 10 ** (SPEECH_DBFS / 20))
        self._in_utterance = False
        self._quiet = 0
        self._preroll: deque[bytes] = deque(maxlen=PREROLL)

    def reset(self) -> None:
        """A new session, or the old one's state dropped: an utterance in progress is thrown away."""
        if self._in_utterance:
            self._decoder.end_utt()
        self._in_utterance = False
        self._quiet = 0
        self._preroll.clear()

    def feed(self, pcm16: bytes) -> DecodeStep:
        pcm = np.frombuffer(pcm16, dtype="<i2")
        loud = self._level.loud(pcm)
        if loud and not self._in_utterance:
            self._decoder.start_utt()
            self._in_utterance = True
            for quiet in self._preroll:
                self._decoder.process_raw(quiet, False, False)
            self._preroll.clear()
        if not self._in_utterance:
            self._preroll.append(pcm16)
            return DecodeStep((), False)
        self._decoder.process_raw(pcm16, False, False)
        self._quiet = 0 if loud else self._quiet + 1
        if self._quiet < HANGOVER:
            return DecodeStep((), loud)
        self._decoder.end_utt()
        self._in_utterance = False
        self._quiet = 0
        hyp = self._decoder.hyp()
        words = hyp.hypstr.strip() if hyp is not None else ""
        return DecodeStep((words,) if words else (), False)


class EspeakSynthesizer:
    """Typed input spoken by eSpeak NG (16 kHz PCM16), for the ear to hear."""

    name = "espeak-ng"

    @property
    def ready(self) -> bool:
        return shutil.which("espeak-ng") is not None

    def synthesize(self, text: str) -> bytes:
        return espeak(text, INPUT_SAMPLE_RATE).tobytes()
