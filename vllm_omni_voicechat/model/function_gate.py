"""PAD forcing and the one-token SOTC latch around a client-owned EOU (model-independent).

A function-head prediction cannot take effect before the explicit EOU has opened the assistant turn:

- on a **pre-EOU** (settlement) position every non-PAD prediction is recorded and its effective token forced to
  PAD before the function state machine sees it; a settlement SOTC is discarded;
- an SOTC on the exact **EOU-consuming** position is staged in a one-token latch (effective PAD there);
- on the **first post-BOS** position the staged SOTC is replayed once, ahead of that position's own prediction.

Model homes apply :meth:`FunctionGate.admit` to the raw function-head token of every position (the simulator
on token strings, the vLLM-Omni adapter on token ids). Telemetry exposes staged/replayed counts and the
absolute frame edges; there are deliberately no per-frame flags.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")


class FunctionGate(Generic[T]):
    def __init__(self, sotc: T, pad: T | None = None) -> None:
        self.sotc = sotc
        self.pad = pad
        self.latch_pending = False
        self.pre_eou_suppressed_tokens = 0
        self.pre_eou_last_raw_token: T | None = None
        self.pre_eou_suppressed_frame: int | None = None
        self.staged_count = 0
        self.staged_frame: int | None = None
        self.replayed_count = 0
        self.replayed_frame: int | None = None

    def admit(self, raw: T | None, *, frame: int, pre_eou: bool = False, eou_position: bool = False) -> T | None:
        """The effective function-channel token for this position (``pad`` when forced)."""
        if eou_position:
            if raw == self.sotc:
                self.latch_pending = True
                self.staged_count += 1
                self.staged_frame = frame
                return self.pad
            return self._suppress(raw, frame) if pre_eou else raw
        if self.latch_pending:
            # First post-BOS position: the staged SOTC takes this position, before its own prediction.
            self.latch_pending = False
            self.replayed_count += 1
            self.replayed_frame = frame
            return self.sotc
        if pre_eou:
            return self._suppress(raw, frame)
        return raw

    def _suppress(self, raw: T | None, frame: int) -> T | None:
        if raw is not None and raw != self.pad:
            self.pre_eou_suppressed_tokens += 1
            self.pre_eou_last_raw_token = raw
            self.pre_eou_suppressed_frame = frame
        return self.pad

    def reset(self) -> None:
        self.__init__(self.sotc, self.pad)  # type: ignore[misc]

    def telemetry(self) -> dict[str, Any]:
        return {
            "pre_eou_suppressed_tokens": self.pre_eou_suppressed_tokens,
            "pre_eou_last_raw_token": self.pre_eou_last_raw_token,
            "pre_eou_suppressed_frame": self.pre_eou_suppressed_frame,
            "client_eou_sotc_staged_count": self.staged_count,
            "client_eou_sotc_staged_frame": self.staged_frame,
            "client_eou_sotc_committed_count": self.replayed_count,
            "client_eou_sotc_committed_frame": self.replayed_frame,
            "latch_pending": self.latch_pending,
        }
