"""One Stage-0 forward's perception frames encoded together.

vLLM-Omni's thinker perceives each request's new 80 ms frame inside that request's ``preprocess``
(``_duplex_stable_frame``: the rolling audio window's mel, one cache-aware Conformer step, the modality adapter and
the projection), one request at a time: at four sessions that was half of Stage 0's CPU, the largest per-request
cost left on the engine. vLLM-Omni's runner offers a model a ``preprocess_batch`` hook, called with the forward's
request ids before the per-request ``preprocess``; the thinker uses it to run the Conformer step, adapter and
projection once for every row that continues its stream (NeMo's cache-aware encoder takes a batch: its caches carry
the batch in dimension 1, their lengths in dimension 0). Each row's audio window is cut per row, by the parent's own
geometry helpers, and the windows of one length go through the mel featurizer in one call. The thinker then writes
each row's results where the parent keeps them, so the per-request ``preprocess`` finds its frame already perceived
(the parent returns the stored frame for an input sequence it has seen) and fuses it unchanged.

Only the plain continuation is taken (the next input sequence of a stream that has begun): a stream's first frame,
a repeat, a gap or a reset stays the parent's, with its own errors. ``prepare`` changes nothing; ``encode`` returns
each row's new state; nothing is written until the whole batch has been encoded. ``cut`` and ``featurize`` are
``prepare`` in two steps, so a forward's windows are featurized together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm_omni.model_executor.models.nemotron_voicechat.duplex.input import decode_pcm_f32le
from vllm_omni.model_executor.models.nemotron_voicechat.nemotron_voicechat_thinker import (
    _DUPLEX_MEL_MARGIN_COLS,
    perception_chunk_geometry,
    slice_perception_streaming_mel,
)

CACHE_KEYS = ("perception_cache_last_channel", "perception_cache_last_time", "perception_cache_last_channel_len")
"""Where the parent keeps a stream's encoder caches in its per-request session."""


@dataclass
class Row:
    """One request's next frame, ready for the encoder (the session untouched)."""

    session: dict[str, Any]
    seq: int
    audio: torch.Tensor
    window_col0: int
    mel: torch.Tensor
    drop_extra: int
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

    def key(self) -> tuple:
        """Rows that go through one encoder call: the same chunk shape and dropped frames, the same cache fill."""
        return (tuple(self.mel.shape), self.drop_extra, tuple(self.caches[2].tolist()))


@dataclass
class Window:
    """One request's rolling audio window with its next frame, cut as the parent cuts it (the session untouched)."""

    session: dict[str, Any]
    seq: int
    frame_idx: int
    audio: torch.Tensor
    window_col0: int
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def cut(thinker: Any, session: dict[str, Any], duplex: dict[str, Any], device: torch.device) -> Window | None:
    """``session``'s window with the frame in ``duplex``, or None when it is not a plain continuation (the parent's)."""
    seq = int(duplex["source_input_seq"])
    audio = session.get("duplex_audio")
    if seq != int(session.get("last_input_seq", 0)) + 1 or not isinstance(audio, torch.Tensor):
        return None
    frame_idx = seq - 1 - int(session.get("duplex_seq_base", 0))
    caches = tuple(session.get(key) for key in CACHE_KEYS)
    if frame_idx <= 0 or any(not isinstance(cache, torch.Tensor) for cache in caches):
        return None
    raw = decode_pcm_f32le(duplex.get("payload"), exact_frame=True)
    frame = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy()).to(device=device, dtype=torch.float32)
    audio = torch.cat([audio, frame])
    window_col0 = int(session.get("duplex_window_col0", 0))
    # The rolling window's bound, as the parent keeps it (only the columns the chunk reads, plus a margin).
    hop = int(getattr(thinker._streaming_preprocessor.featurizer, "hop_length", 160))
    total_cols = (window_col0 * hop + int(audio.numel())) // hop + 1
    cache_start, _, _ = perception_chunk_geometry(frame_idx, total_cols, thinker.perception.encoder.streaming_cfg)
    col0 = max(0, cache_start - _DUPLEX_MEL_MARGIN_COLS)
    if col0 > window_col0:
        audio = audio[(col0 - window_col0) * hop :]
        window_col0 = col0
    return Window(session, seq, frame_idx, audio, window_col0, caches)  # type: ignore[arg-type]


def featurize(thinker: Any, windows: Sequence[Window]) -> list[Row]:
    """Each window's mel chunk, the windows of one length in one featurizer call (a batch's rows are the same bits
    as each alone: per-row STFT, filterbank and per-feature normalisation over equal lengths)."""
    groups: dict[int, list[int]] = {}
    for index, window in enumerate(windows):
        groups.setdefault(int(window.audio.numel()), []).append(index)
    rows: list[Row | None] = [None] * len(windows)
    encoder = thinker.perception.encoder
    with torch.inference_mode():
        for length, members in groups.items():
            signal = torch.stack([windows[i].audio for i in members])
            mel, _ = thinker._streaming_preprocessor(
                input_signal=signal,
                length=torch.full((len(members),), length, device=signal.device, dtype=torch.long))
            for j, i in enumerate(members):
                w = windows[i]
                chunk, drop_extra = slice_perception_streaming_mel(mel[j : j + 1], w.frame_idx, encoder.streaming_cfg,
                                                                   window_col0=w.window_col0)
                rows[i] = Row(w.session, w.seq, w.audio, w.window_col0, chunk, int(drop_extra), w.caches)
    return rows  # type: ignore[return-value]


def prepare(thinker: Any, session: dict[str, Any], duplex: dict[str, Any], device: torch.device) -> Row | None:
    """The row for ``session``'s frame in ``duplex``, or None when it is not a plain continuation (the parent's)."""
    window = cut(thinker, session, duplex, device)
    return None if window is None else featurize(thinker, [window])[0]


def encode(thinker: Any, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """One Conformer step, adapter and projection for ``rows`` (one key); each row's session updates."""
    encoder = thinker.perception.encoder
    dtype = next(encoder.parameters()).dtype
    mel = torch.cat([row.mel for row in rows]).to(dtype)
    with torch.inference_mode():
        encoded, encoded_len, channel, time, channel_len = encoder.cache_aware_stream_step(
            processed_signal=mel,
            processed_signal_length=torch.full((len(rows),), mel.shape[-1], device=mel.device, dtype=torch.long),
            cache_last_channel=torch.cat([row.caches[0] for row in rows], dim=1),
            cache_last_time=torch.cat([row.caches[1] for row in rows], dim=1),
            cache_last_channel_len=torch.cat([row.caches[2] for row in rows]),
            keep_all_outputs=True,
            drop_extra_pre_encoded=rows[0].drop_extra,
        )
        adapted, adapted_len = thinker.perception.modality_adapter(audio_signal=encoded, length=encoded_len)
        stable = thinker.perception.proj(adapted.transpose(1, 2))
    if stable.shape[1] != 1 or any(int(n) != 1 for n in adapted_len.reshape(-1).tolist()):
        raise RuntimeError("voicechat perception: a batched step must give one frame per row; got "
                           f"lengths {adapted_len.tolist()}, shape {tuple(stable.shape)}")
    updates = []
    for i, row in enumerate(rows):
        frame = stable[i].to(thinker._dtype)
        updates.append({
            "duplex_audio": row.audio,
            "duplex_window_col0": row.window_col0,
            CACHE_KEYS[0]: channel[:, i : i + 1],
            CACHE_KEYS[1]: time[:, i : i + 1],
            CACHE_KEYS[2]: channel_len[i : i + 1],
            "duplex_frame": frame,
            "last_input_seq": row.seq,
            "vc_encoder_frame": encoded[i, :, -1],
            "vc_projected_frame": frame.reshape(-1),
            "vc_perceived_with": len(rows),
        })
    return updates


def perceive_together(thinker: Any, rows: Sequence[Row]) -> list[tuple[Row, dict[str, Any]]]:
    """Every row encoded, rows of one key in one call; nothing applied."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.key(), []).append(row)
    done = []
    for group in groups.values():
        done.extend(zip(group, encode(thinker, group)))
    return done


__all__ = ["CACHE_KEYS", "Row", "Window", "cut", "encode", "featurize", "perceive_together", "prepare"]
