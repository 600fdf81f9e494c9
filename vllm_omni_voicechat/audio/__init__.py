"""Audio utilities: frame constants, PCM framing, levels, base64 and resampling."""

from .frames import (
    FRAME_MS,
    FRAME_SECONDS,
    INPUT_FRAME_BYTES,
    INPUT_FRAME_SAMPLES,
    INPUT_SAMPLE_RATE,
    OUTPUT_FRAME_BYTES,
    OUTPUT_FRAME_SAMPLES,
    OUTPUT_SAMPLE_RATE,
    SILENT_INPUT_FRAME,
    SILENT_OUTPUT_FRAME,
    FrameAssembler,
    dbfs,
)

__all__ = [
    "FRAME_MS",
    "FRAME_SECONDS",
    "INPUT_FRAME_BYTES",
    "INPUT_FRAME_SAMPLES",
    "INPUT_SAMPLE_RATE",
    "OUTPUT_FRAME_BYTES",
    "OUTPUT_FRAME_SAMPLES",
    "OUTPUT_SAMPLE_RATE",
    "SILENT_INPUT_FRAME",
    "SILENT_OUTPUT_FRAME",
    "FrameAssembler",
    "dbfs",
]
