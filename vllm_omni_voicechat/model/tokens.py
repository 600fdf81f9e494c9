"""Text -> model tokens for the simulator and as the default tool-result tokenizer of the session core.

Tokens are at most 4 UTF-8 bytes, cut at word starts: one token is what one 80 ms position speaks or injects.
The real-model adapter supplies its LLM tokenizer instead.
"""

from __future__ import annotations

import re

_WORD_RE = re.compile(r" *[^ ]+| +")


def split_tokens(text: str, max_bytes: int = 4) -> list[str]:
    """Split ``text`` into consecutive tokens of at most ``max_bytes`` UTF-8 bytes.

    Words (a run of spaces plus the following non-space characters) are cut greedily, so a token starts
    where a word starts and a character is never split: ``"You said: hello there."`` ->
    ``["You", " sai", "d:", " hel", "lo", " the", "re."]``. ``"".join(tokens) == text``.
    """
    if max_bytes < 1:
        raise ValueError("max_bytes must be >= 1")
    tokens: list[str] = []
    for word in _WORD_RE.findall(text):
        cur: list[str] = []
        size = 0
        for ch in word:
            n = len(ch.encode("utf-8"))
            if n > max_bytes:
                raise ValueError(f"character {ch!r} needs {n} bytes > max_bytes={max_bytes}")
            if size + n > max_bytes:
                tokens.append("".join(cur))
                cur, size = [], 0
            cur.append(ch)
            size += n
        if cur:
            tokens.append("".join(cur))
    return tokens
