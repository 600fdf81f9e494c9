"""Nemotron VoiceChat serving: a sans-I/O runtime (80 ms model clock, voicechat session semantics),
a deterministic CPU simulator model, wire projectors and a vLLM-Omni adapter at the edge."""

__version__ = "0.1.0"
