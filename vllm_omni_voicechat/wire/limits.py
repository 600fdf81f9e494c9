"""What one client message may be, checked before it is parsed (docs/reliability.md, "Input limits").

The transport refuses a message over its dialect's size while its header arrives, before the frame is buffered
whole (close 1009; our uvicorn protocol, ``server/uvicorn.py``; elsewhere the host checks the message it was handed).
A message within the size is counted before it is decoded: the decoder's cost grows with the objects and arrays it
builds (a 6 MB frame of empty lists takes ~0.6 s to decode), while counting their opening brackets costs ~1 ms a MB
(measured on the 2-core VM).
"""

from __future__ import annotations

V3_MAX_MESSAGE_BYTES = 1 << 20
"""A v3 client message: websockets' own default, the reference server's. The contract's largest messages are an
append (40,960 decoded bytes: ~55 KB of JSON) and ``session.update`` with its tools; the deferred FIFO is 1 MiB."""

TIERED_MAX_MESSAGE_BYTES = 16 << 20
"""A tiered client message: uvicorn's default. The dialect answers a frame over 15 MiB (OpenAI's event limit) with
``event_too_large``, so the transport must take a little more than that."""

FIRST_MESSAGE_MAX_BYTES = 1 << 20
"""A tiered socket's first message when it must send one (``autostart=0``): a ``session.update`` or
``session.resume``; a connection that has no session yet holds no more than this."""

QUEUED_MAX_MESSAGE_BYTES = 1 << 20
"""A message from a tiered client waiting in the admission queue (it has no session yet, so no more than a first
message; its messages wait in memory, up to the inbox's bounds, until it is admitted): a ``session.update`` with the
largest instructions and tools is ~200 KB, an audio append a few KB. Once admitted, the dialect's size."""

MAX_JSON_CONTAINERS = 10_000
"""Objects and arrays in one client message, counted as opening brackets (those inside strings count too: an upper
bound). 128 tools with nested schemas are ~3,000; an audio append has 1-2."""


MAX_INSTRUCTIONS_CHARS = 64 << 10
"""A session's instructions (its system prompt): the real model's prompt holds ~3,800 tokens (deploy/voicechat.yaml),
~16 KB of English, so four times that is no legitimate client's; the tools have their own bounds
(``session/tools.py``)."""

MAX_ERROR_MESSAGE_CHARS = 1_000
"""An error's ``message`` (our prose, which may quote what the client sent: an event type, a field's value): longer is
cut, so no client string is echoed back at the size it came in. Ids are bounded where they are echoed
(``transport.MAX_ECHOED_ID_CHARS``)."""


def bounded_message(message: str) -> str:
    """``message`` within :data:`MAX_ERROR_MESSAGE_CHARS` (cut, with an ellipsis, when longer)."""
    return message if len(message) <= MAX_ERROR_MESSAGE_CHARS else message[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"


def message_bytes(message: str | bytes) -> int:
    """A client frame's size in bytes (a text frame's UTF-8, encoding only when it is not ASCII)."""
    return len(message) if isinstance(message, bytes) or message.isascii() else len(message.encode())


def utf8_exceeds(data: str | bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether ``data`` is more than ``limit`` bytes in UTF-8 (encoding only when the length cannot tell)."""
    if not isinstance(data, str):
        return len(data) > limit
    if len(data) > limit:  # every character is at least one byte
        return True
    if len(data) * 4 <= limit:  # and at most four
        return False
    return len(data.encode("utf-8", "surrogatepass")) > limit


def too_many_containers(text: str) -> bool:
    """More than :data:`MAX_JSON_CONTAINERS` objects and arrays (an upper bound; no decoding)."""
    return len(text) > MAX_JSON_CONTAINERS and text.count("{") + text.count("[") > MAX_JSON_CONTAINERS
