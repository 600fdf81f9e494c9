"""Simulator speech: a dual-tone symbol codec that turns text into audio and back, exactly.

The CPU simulator of the full-duplex model needs "speech" that a decoder can transcribe without a real
ASR: text is rendered as audio that :class:`SpeechDecoder` / :func:`decode_speech` turn back into exactly
the same text, whatever the chunking of the stream and after resampling (e.g. 22,050 -> 24,000 Hz with
soxr). Any other signal above the speech threshold is "real speech" and decodes to a placeholder
``[speech X.X s]``.

Encoding
--------
Text is UTF-8 encoded; every byte is one **symbol** lasting ``SYMBOL_SECONDS`` (20 ms):

* a dual-tone burst of ``TONE_SECONDS`` (15 ms): one tone per nibble, the high nibble picks one of
  ``HIGH_NIBBLE_HZ`` (400 Hz + 160 Hz * k, i.e. 400-2,800 Hz) and the low nibble one of ``LOW_NIBBLE_HZ``
  (3,600 Hz + 200 Hz * k, i.e. 3,600-6,600 Hz). Each tone has amplitude ``TONE_AMPLITUDE`` (0.3 full
  scale) and both start at phase 0; the burst has raised-cosine (Hann) ramps of ``RAMP_SECONDS`` (3 ms)
  at both ends;
* followed by digital silence for the rest of the symbol (5 ms), so the decoder can segment symbols
  without knowing the alignment.

At a sample rate R a symbol has ``round(SYMBOL_SECONDS * R)`` samples (441 at 22,050 Hz, so 4 symbols fill
exactly one 1,764-sample output frame; 320 at 16 kHz), the tone ``round(TONE_SECONDS * R)`` samples
(331 / 240) and the gap the rest (110 / 80). The groups are >= 800 Hz apart, so the two tones beat at
>= 800 Hz, faster than the 2 ms envelope window averages out (no false gaps inside a tone); the tone
spacing within a group is >= 2.2 DFT bins of a 14 ms window; and every tone sits well inside the
passband of a 16 kHz stream (soxr keeps it intact when resampling 22,050 Hz to 16 or 24 kHz).

Decoding
--------
* Envelope: mean square over a causal ``ENVELOPE_SECONDS`` (2 ms) window; a sample is "on" when it is
  at or above ``SPEECH_THRESHOLD_DBFS`` (-40 dBFS, i.e. mean square 1e-4 of full scale).
* "On" runs are segmented at any "off" sample. A run whose length is within ``RUN_TOLERANCE_SECONDS``
  (3 ms) of that of a clean tone (15 ms + 2 ms envelope lag - 1.5 ms of ramp ends below the threshold,
  i.e. 15.5 ms; two symbols merged would be >= 35 ms) is a candidate symbol: the ``ANALYSIS_SECONDS``
  (12 ms) in its middle are Hann-windowed and projected on the 32 tone frequencies (a DFT evaluated at
  exactly those frequencies, i.e. an infinitely zero-padded FFT). The strongest tone of each group gives
  the nibbles; the candidate is accepted only if those two tones explain at least
  ``MIN_TONE_CONCENTRATION`` (80 %) of the windowed energy and the weaker tone carries at least
  ``MIN_TONE_BALANCE`` (25 %) of the power of the stronger one. A clean symbol scores ~0.997, also
  after resampling; symbols still decode with -60 dBFS noise added and after ~20 dB of attenuation.
* Everything else that is "on" is real speech. Real-speech runs separated by gaps shorter than
  ``REAL_SPEECH_GAP_SECONDS`` (80 ms) form one region, reported as ``[speech X.X s]`` (the region's
  duration from its first to its last sample above the threshold, one decimal) once it has been
  followed by 80 ms without real speech (or when a sim symbol follows, or on flush).

Pieces (streaming)
------------------
Decoded bytes accumulate into a pending word. Decoding a space (0x20) emits the pending text as a piece
and the space starts the next pending piece; ``END_OF_UTTERANCE_SECONDS`` (40 ms) of silence after the
last symbol, the start of real speech, or ``flush()`` also emit it. So ``"Hello world"`` yields ``"Hello"``
then ``" world"``, and for pure simulator speech ``"".join(pieces) == text`` exactly.

"Silence" in these rules is measured on the envelope: it starts when the 2 ms envelope drops below the
threshold (so up to 2 ms after the signal itself). At 80 ms frames, a real-speech region that ends exactly
on a frame boundary is therefore reported in the second silent frame, not the first.
``DecodeStep.energetic`` judges the chunk's own samples only (the envelope lag never makes the chunk
after a loud one energetic).

Spacing rule around placeholders: a placeholder piece gets a leading space when any piece was emitted
before it and the last emitted piece does not end in whitespace; the first text piece after a
placeholder gets a leading space unless it already starts with whitespace. So words never glue to a
placeholder and no double spaces are introduced: ``"Hi [speech 1.2 s] there"``.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .frames import zero_bytes

__all__ = [
    "ANALYSIS_SECONDS",
    "END_OF_UTTERANCE_SECONDS",
    "ENVELOPE_SECONDS",
    "GAP_SECONDS",
    "HIGH_NIBBLE_HZ",
    "LOW_NIBBLE_HZ",
    "MIN_SAMPLE_RATE",
    "MIN_TONE_BALANCE",
    "MIN_TONE_CONCENTRATION",
    "RAMP_SECONDS",
    "REAL_SPEECH_GAP_SECONDS",
    "RUN_TOLERANCE_SECONDS",
    "SPEECH_THRESHOLD_DBFS",
    "SYMBOL_SECONDS",
    "TONE_AMPLITUDE",
    "TONE_SECONDS",
    "DecodeStep",
    "SpeechDecoder",
    "decode_speech",
    "is_speech_energy",
    "render_speech",
    "render_token_audio",
]

# --- symbol layout -------------------------------------------------------------------------------------
SYMBOL_SECONDS = 0.02
TONE_SECONDS = 0.015
GAP_SECONDS = SYMBOL_SECONDS - TONE_SECONDS  # 5 ms of digital silence after every tone
RAMP_SECONDS = 0.003
TONE_AMPLITUDE = 0.3
HIGH_NIBBLE_HZ: tuple[float, ...] = tuple(400.0 + 160.0 * k for k in range(16))  # 400 .. 2,800 Hz
LOW_NIBBLE_HZ: tuple[float, ...] = tuple(3600.0 + 200.0 * k for k in range(16))  # 3,600 .. 6,600 Hz
# Highest tone 6.6 kHz: below this rate a stream cannot carry (or resolve) it.
MIN_SAMPLE_RATE = 14_000

# --- detection -----------------------------------------------------------------------------------------
SPEECH_THRESHOLD_DBFS = -40.0
ENVELOPE_SECONDS = 0.002
ANALYSIS_SECONDS = 0.012
RUN_TOLERANCE_SECONDS = 0.003
MIN_TONE_CONCENTRATION = 0.8
MIN_TONE_BALANCE = 0.25
END_OF_UTTERANCE_SECONDS = 0.04
REAL_SPEECH_GAP_SECONDS = 0.08

_RAMP_LOSS_SECONDS = 0.0015  # measured: a clean tone's envelope run is tone + envelope - ~1.5 ms
_SPACE = 0x20
_BYTE_OBJS = tuple(bytes((i,)) for i in range(256))


def _check_rate(sample_rate: int) -> int:
    sr = int(sample_rate)
    if sr != sample_rate or sr < MIN_SAMPLE_RATE:
        raise ValueError(f"sample_rate must be an integer >= {MIN_SAMPLE_RATE}, got {sample_rate!r}")
    return sr


def _symbol_samples(sr: int) -> int:
    return int(round(SYMBOL_SECONDS * sr))


# --- rendering -----------------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def _symbol_table(sample_rate: int) -> np.ndarray:
    """PCM16 (little-endian) audio of all 256 symbols at ``sample_rate``: shape (256, symbol samples)."""
    sr = sample_rate
    sym = _symbol_samples(sr)
    tone = min(int(round(TONE_SECONDS * sr)), sym - 1)
    ramp = max(1, int(round(RAMP_SECONDS * sr)))
    env = np.ones(tone, dtype=np.float64)
    r = 0.5 - 0.5 * np.cos(np.pi * (np.arange(ramp) + 0.5) / ramp)
    env[:ramp] = r
    env[tone - ramp :] = r[::-1]
    t = np.arange(tone, dtype=np.float64) / sr
    hi = np.sin(2.0 * np.pi * np.asarray(HIGH_NIBBLE_HZ)[:, None] * t) * TONE_AMPLITUDE  # (16, tone)
    lo = np.sin(2.0 * np.pi * np.asarray(LOW_NIBBLE_HZ)[:, None] * t) * TONE_AMPLITUDE
    b = np.arange(256)
    bursts = (hi[b >> 4] + lo[b & 0x0F]) * env  # (256, tone)
    table = np.zeros((256, sym), dtype="<i2")
    table[:, :tone] = np.clip(np.round(bursts * 32767.0), -32768, 32767).astype("<i2")
    table.setflags(write=False)
    return table


def render_speech(text: str, sample_rate: int = 16000) -> bytes:
    """PCM16 little-endian mono of ``text`` as simulator speech: one 20 ms symbol per UTF-8 byte."""
    data = text.encode("utf-8")
    if not data:
        return b""
    table = _symbol_table(_check_rate(sample_rate))
    return table[np.frombuffer(data, dtype=np.uint8)].tobytes()


@lru_cache(maxsize=256)
def render_token_audio(token: str, sample_rate: int = 22050, frame_samples: int = 1764) -> bytes:
    """Audio for one model position: ``token``'s bytes as symbols, zero-padded to ``frame_samples``. Cached (at
    most 256 tokens, ~0.9 MB): the simulator's replies reuse a small vocabulary, and every speaking position of
    every session renders one."""
    sr = _check_rate(sample_rate)
    if frame_samples <= 0:
        raise ValueError("frame_samples must be positive")
    data = token.encode("utf-8")
    sym = _symbol_samples(sr)
    if len(data) * sym > frame_samples:
        raise ValueError(
            f"token {token!r} needs {len(data)} symbols of {sym} samples; "
            f"only {frame_samples // sym} fit in {frame_samples} samples"
        )
    out = np.zeros(frame_samples, dtype="<i2")
    if data:
        out[: len(data) * sym] = _symbol_table(sr)[np.frombuffer(data, dtype=np.uint8)].ravel()
    return out.tobytes()


# --- decoding ------------------------------------------------------------------------------------------


class _RateParams:
    """Per-sample-rate constants of the decoder (cached)."""

    def __init__(self, sr: int) -> None:
        self.sample_rate = sr
        self.env_len = m = max(1, int(round(ENVELOPE_SECONDS * sr)))
        # The envelope works on exact integer sums of squared PCM16 samples over m samples.
        thr_power = 10.0 ** (SPEECH_THRESHOLD_DBFS / 10.0)
        self.thr_sum = int(np.ceil(thr_power * m * 32768.0 * 32768.0))
        tone = TONE_SECONDS * sr
        tol = RUN_TOLERANCE_SECONDS * sr
        # Run lengths are measured on the causal envelope: it stays on env_len samples after the tone,
        # and the quiet ends of the ramps (~0.75 ms each) stay below the threshold.
        expected = tone + m - _RAMP_LOSS_SECONDS * sr
        self.min_run = int(np.floor(expected - tol))
        self.max_run = int(np.ceil(expected + tol))
        self.eou = int(round(END_OF_UTTERANCE_SECONDS * sr))
        self.real_gap = int(round(REAL_SPEECH_GAP_SECONDS * sr))
        win = int(round(ANALYSIS_SECONDS * sr))
        self.win_len = win
        self.win_range = np.arange(win)
        self.keep = self.max_run + 2 * m + win + 64
        self.zero_tail = np.zeros(m, dtype=np.int64)  # shared by every decoder after digital silence
        self.zero_keep = np.zeros(self.keep, dtype=np.int16)
        self.zero_tail.flags.writeable = self.zero_keep.flags.writeable = False
        w = np.hanning(win + 2)[1:-1]  # strictly positive Hann
        n = np.arange(win, dtype=np.float64)
        freqs = np.asarray(HIGH_NIBBLE_HZ + LOW_NIBBLE_HZ)
        ph = 2.0 * np.pi * freqs[None, :] * n[:, None] / sr  # (win, 32)
        # windowed DFT at the 32 tone frequencies (cos and sin parts) and the windowed energy, in one product
        basis = np.concatenate((w[:, None] * np.cos(ph), w[:, None] * np.sin(ph)), axis=1)
        self.basis = basis.astype(np.float32)  # float32 halves the cost; the scores need no more precision
        self.w2 = (w * w).astype(np.float32)
        # windowed energy explained by a tone whose windowed DFT has power P: P * tone_gain
        self.tone_gain = 2.0 * float(np.sum(w * w)) / float(np.sum(w)) ** 2


@lru_cache(maxsize=16)
def _params(sr: int) -> _RateParams:
    return _RateParams(sr)


def _analyse(p: _RateParams, segs: np.ndarray) -> list[int]:
    """Byte value of each candidate segment (rows of ``segs``), or -1 where it is not a valid symbol."""
    segs = segs.astype(np.float32)
    k = segs.shape[0]
    proj = segs @ p.basis  # (k, 64)
    proj *= proj
    power = (proj[:, :32] + proj[:, 32:]).reshape(k, 2, 16)
    arg = power.argmax(axis=2).tolist()  # (k, 2): high nibble, low nibble
    best = power.max(axis=2).tolist()
    segs *= segs
    energy = (segs @ p.w2).tolist()
    gain = p.tone_gain
    values: list[int] = []
    for (hi, lo), (ph, pl), en in zip(arg, best, energy):
        strong, weak = (ph, pl) if ph >= pl else (pl, ph)
        if en > 0.0 and (ph + pl) * gain >= MIN_TONE_CONCENTRATION * en and weak >= MIN_TONE_BALANCE * strong:
            values.append((hi << 4) | lo)
        else:
            values.append(-1)
    return values


def _pcm16(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype="<i2")


def is_speech_energy(pcm16: bytes, sample_rate: int) -> bool:
    """True when any part of ``pcm16`` has a short-envelope level at or above the speech threshold."""
    p = _params(_check_rate(sample_rate))
    n = len(pcm16) // 2
    if n == 0:
        return False
    cs = np.zeros(n + p.env_len, dtype=np.int64)
    sq = _pcm16(pcm16[: 2 * n]).astype(np.int64)
    sq *= sq
    np.cumsum(sq, out=cs[p.env_len :])
    return bool(np.any(cs[p.env_len :] - cs[:n] >= p.thr_sum))


@dataclass(frozen=True)
class DecodeStep:
    """Result of one :meth:`SpeechDecoder.feed`: transcript pieces completed during the chunk, in order,
    and whether the chunk contained any signal above the speech threshold (simulator or real speech)."""

    pieces: tuple[str, ...]
    energetic: bool


_EMPTY_STEP = DecodeStep((), False)


class SpeechDecoder:
    """Streaming decoder of simulator speech (the simulator's "RNNT"), word by word.

    Feed PCM16 chunks of any size (an odd trailing byte is carried over to the next chunk); symbols and
    regions straddling chunk boundaries decode exactly as in one piece. See the module docstring for the
    piece and placeholder rules.
    """

    quiet_fast_path = True
    """Skip the envelope of chunks that cannot reach the threshold (the same result; tests compare both)."""

    def __init__(self, sample_rate: int = 16000) -> None:
        self.sample_rate = _check_rate(sample_rate)
        self._p = _params(self.sample_rate)
        self.reset()

    def reset(self) -> None:
        """Forget everything: as freshly constructed."""
        p = self._p
        self._byte_carry = b""
        self._pos = 0  # absolute index of the next sample
        self._sq_tail = np.zeros(p.env_len, dtype=np.int64)  # squares of the last env_len samples
        self._tail_sum: int | None = 0
        self._buf = np.zeros(0, dtype=np.int16)  # recent samples, for symbols straddling chunks
        self._buf_start = 0
        self._on = False
        self._run_start = 0
        self._run_real = False
        self._pending = ""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._utf8_partial = False
        self._last_sym_end = -(1 << 62)
        self._real_start: int | None = None
        self._real_end = 0
        self._emitted_any = False
        self._last_ends_space = False
        self._after_placeholder = False
        self._loud = False  # the last chunk was energetic: the next one most likely is too

    # -- public ---------------------------------------------------------------------------------------

    def feed(self, pcm16: bytes) -> DecodeStep:
        """Decode one chunk of PCM16 little-endian mono at ``sample_rate``."""
        if not self._byte_carry and not self._on and self.quiet_fast_path:
            size = len(pcm16)
            if not size % 2 and size // 2 >= self._p.keep and pcm16 == zero_bytes(size):
                # Digital silence after an "off" window (most frames): what _process comes to, without an array
                out: list[str] = []
                self._silence(self._pos + size // 2, out)
                return DecodeStep(tuple(out), False) if out else _EMPTY_STEP
        if self._byte_carry:
            data = self._byte_carry + bytes(pcm16)
            self._byte_carry = b""
        else:
            data = pcm16
        if len(data) % 2:
            self._byte_carry = bytes(data[-1:])
            data = data[:-1]
        if not data:
            return _EMPTY_STEP
        out: list[str] = []
        energetic = self._process(_pcm16(data), out, silent=data == zero_bytes(len(data)))  # a memcmp
        return DecodeStep(tuple(out), energetic) if out or energetic else _EMPTY_STEP

    def flush(self) -> DecodeStep:
        """Emit everything pending, as if a long silence followed."""
        p = self._p
        out: list[str] = []
        self._byte_carry = b""
        self._process(np.zeros(p.real_gap + p.eou + 2 * p.env_len + 1, dtype=np.int16), out, silent=True)
        self._pending += self._utf8.decode(b"", final=True)
        self._utf8_partial = False
        self._emit_pending(out)
        self._close_region(out)
        return DecodeStep(tuple(out), False)

    # -- pieces ---------------------------------------------------------------------------------------

    def _emit_text(self, out: list[str], text: str) -> None:
        if not text:
            return
        if self._after_placeholder and not text[0].isspace():
            text = " " + text
        self._after_placeholder = False
        out.append(text)
        self._emitted_any = True
        self._last_ends_space = text[-1].isspace()

    def _emit_pending(self, out: list[str]) -> None:
        if self._pending:
            self._emit_text(out, self._pending)
            self._pending = ""

    def _close_region(self, out: list[str]) -> None:
        if self._real_start is None:
            return
        # the envelope run outlasts the signal by env_len samples
        dur = max(0, self._real_end - self._real_start - self._p.env_len) / self.sample_rate
        piece = f"[speech {dur:.1f} s]"
        if self._emitted_any and not self._last_ends_space:
            piece = " " + piece
        out.append(piece)
        self._emitted_any = True
        self._last_ends_space = False
        self._after_placeholder = True
        self._real_start = None

    def _real(self, out: list[str], s: int, e: int) -> None:
        """Real-speech activity over the envelope run [s, e)."""
        self._emit_pending(out)
        if self._real_start is not None and s - self._real_end < self._p.real_gap:
            if e > self._real_end:
                self._real_end = e
            return
        self._close_region(out)
        self._real_start = s
        self._real_end = e

    def _symbol(self, out: list[str], s: int, e: int, value: int) -> None:
        if self._real_start is not None:
            self._close_region(out)
        if self._pending and s - self._last_sym_end >= self._p.eou:
            self._emit_pending(out)
        if value < 0x80 and not self._utf8_partial:
            text = chr(value)
        else:
            text = self._utf8.decode(_BYTE_OBJS[value])
            self._utf8_partial = bool(self._utf8.getstate()[0])
        if value == _SPACE:
            self._pending += text[:-1]
            self._emit_pending(out)
            self._pending = " "
        else:
            self._pending += text
        self._last_sym_end = e

    # -- signal ---------------------------------------------------------------------------------------

    def _process(self, x: np.ndarray, out: list[str], silent: bool) -> bool:
        """Advance over int16 samples ``x`` (``silent``: all zero); append completed pieces to ``out``; return
        energetic."""
        p = self._p
        m = p.env_len
        n = x.size
        pos0 = self._pos
        pos_end = pos0 + n
        if self.quiet_fast_path and not self._on and n >= m:
            # Digital silence (pauses, synthetic positions: most frames of a conversation) after an "off" window:
            # every window ending in it sums a suffix of that window's squares, so it is off too.
            if silent:
                return self._silent_chunk(x, out, pos_end)
            if not self._loud and self._quiet(x):  # a check that fails on speech: not tried during it
                return self._quiet_chunk(x, out, pos_end)

        # envelope: exact sum of squares over the last m samples (causal), thresholded
        ext = np.empty(m + n, dtype=np.int64)
        ext[:m] = self._sq_tail
        sq = ext[m:]
        sq[:] = x
        sq *= sq
        self._sq_tail = ext[-m:].copy()
        self._tail_sum = None  # the tail's sum, computed when a quiet check needs it
        np.cumsum(ext, out=ext)
        # window sum for new sample i (ext index m + i) is sq_ext[i+1 .. m+i] = cs[m+i] - cs[i]
        on = (ext[m:] - ext[:n]) >= p.thr_sum
        # "energetic" judges this chunk's own samples: the first m - 1 windows also cover earlier samples,
        # so for them only the part of the window inside the chunk counts.
        energetic = bool(on[m - 1 :].any())
        if not energetic and n:
            head = min(m - 1, n)
            energetic = bool(((ext[m : m + head] - ext[m - 1]) >= p.thr_sum).any())

        if self._buf.size:
            buf = np.concatenate((self._buf, x))
            buf_start = self._buf_start
        else:
            buf, buf_start = x, pos0

        changes = np.flatnonzero(on[1:] != on[:-1])
        changes += 1
        first_on = bool(on[0])
        change_list = changes.tolist()
        if first_on != self._on:
            change_list.insert(0, 0)

        state_on = self._on
        run_start = self._run_start
        run_real = self._run_real
        if change_list:
            # pass 1: close runs, batch the analysis of candidate symbols
            events: list[tuple[int, int, int, int]] = []  # (kind 0=start 1=end, s, e, candidate index)
            cand_starts: list[int] = []
            min_run, max_run = p.min_run, p.max_run
            seg_off = p.win_len // 2 + buf_start
            seg_max = buf.size - p.win_len
            for i in change_list:
                a = pos0 + i
                if not state_on:
                    state_on = True
                    run_start = a
                    run_real = False
                    events.append((0, a, a, -1))
                else:
                    state_on = False
                    ci = -1
                    if not run_real and min_run <= a - run_start <= max_run:
                        # the middle of the tone: the envelope run lags the signal by m samples
                        seg0 = (run_start + a - m) // 2 - seg_off
                        if 0 <= seg0 <= seg_max:
                            ci = len(cand_starts)
                            cand_starts.append(seg0)
                    events.append((1, run_start, a, ci))
            values: list[int] = []
            if cand_starts:
                idx = np.asarray(cand_starts)[:, None] + p.win_range
                values = _analyse(p, buf[idx])

            # pass 2: events in time order
            eou, real_gap = p.eou, p.real_gap
            for kind, s, e, ci in events:
                if kind == 0:
                    if self._pending and s - self._last_sym_end >= eou:
                        self._emit_pending(out)
                    if self._real_start is not None and s - self._real_end >= real_gap:
                        self._close_region(out)
                else:
                    v = values[ci] if ci >= 0 else -1
                    if v >= 0:
                        self._symbol(out, s, e, v)
                    else:
                        self._real(out, s, e)

        # chunk end
        if state_on:
            if not run_real and pos_end - run_start > p.max_run:
                run_real = True
            if run_real:
                self._real(out, run_start, pos_end)
        else:
            self._emit_quiet(out, pos_end)

        self._on = state_on
        self._run_start = run_start
        self._run_real = run_real
        self._keep(x, buf, buf_start, pos_end)
        self._loud = energetic
        return energetic

    def _keep(self, x: np.ndarray, buf: np.ndarray, buf_start: int, pos_end: int) -> None:
        """Keep the recent samples (a symbol's analysis window may reach back into them)."""
        keep = self._p.keep
        self._pos = pos_end
        if buf.size > keep:
            self._buf = buf[-keep:].copy()
            self._buf_start = pos_end - keep
        else:
            self._buf = buf.copy() if buf is x else buf
            self._buf_start = buf_start

    def _quiet(self, x: np.ndarray) -> bool:
        """No envelope window ending in ``x`` can reach the threshold: each holds at most the previous chunk's
        last squares plus ``env_len`` of this chunk's peak square."""
        if self._tail_sum is None:
            self._tail_sum = int(self._sq_tail.sum())
        peak = max(int(x.max()), -int(x.min()))
        return self._tail_sum + self._p.env_len * peak * peak < self._p.thr_sum

    def _silent_chunk(self, x: np.ndarray, out: list[str], pos_end: int) -> bool:
        """:meth:`_quiet_chunk` for all-zero samples: the new tail squares are zeros and so are the kept samples
        when the chunk is at least as long as what is kept (shared arrays: nothing writes these in place)."""
        if x.size < self._p.keep:
            return self._quiet_chunk(x, out, pos_end)
        self._silence(pos_end, out)
        return False

    def _silence(self, pos_end: int, out: list[str]) -> None:
        """Digital silence up to ``pos_end``, at least ``keep`` samples of it, after an "off" window."""
        p = self._p
        self._sq_tail = p.zero_tail
        self._tail_sum = 0
        self._loud = False
        self._emit_quiet(out, pos_end)
        self._pos = pos_end
        self._buf = p.zero_keep
        self._buf_start = pos_end - p.keep

    def _quiet_chunk(self, x: np.ndarray, out: list[str], pos_end: int) -> bool:
        """What :meth:`_process` does for a chunk that is "off" throughout after an "off" one (no runs start
        or end): silence-based emissions, the envelope tail, the kept samples. Most frames of a conversation
        are quiet; this skips the envelope and run segmentation (~2x cheaper per frame)."""
        p = self._p
        tail = x[-p.env_len :].astype(np.int64)
        tail *= tail
        self._sq_tail = tail
        self._tail_sum = None
        self._loud = False
        self._emit_quiet(out, pos_end)
        if self._buf.size:
            self._keep(x, np.concatenate((self._buf, x)), self._buf_start, pos_end)
        else:
            self._keep(x, x, self._pos, pos_end)
        return False

    def _emit_quiet(self, out: list[str], pos_end: int) -> None:
        """What silence up to ``pos_end`` completes: a word after its end-of-utterance gap, a real-speech region."""
        p = self._p
        if self._pending and pos_end - self._last_sym_end >= p.eou:
            self._emit_pending(out)
        if self._real_start is not None and pos_end - self._real_end >= p.real_gap:
            self._close_region(out)


def decode_speech(pcm16: bytes, sample_rate: int = 22050) -> str:
    """Non-streaming decode of a whole stream: simulator text, exactly, and ``[speech X.X s]`` for every
    real-speech region, in order (spacing rule in the module docstring)."""
    dec = SpeechDecoder(sample_rate)
    pieces = dec.feed(pcm16).pieces + dec.flush().pieces
    return "".join(pieces)
