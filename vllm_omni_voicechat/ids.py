"""Where identifiers and secrets come from: the system's randomness by default, a seeded generator for
deterministic tests and fuzz replays (session ids, resume tokens, client event ids)."""

from __future__ import annotations

import base64
import random
import secrets
import uuid
from typing import Protocol


class Ids(Protocol):
    def hex(self, nbytes: int) -> str:
        """``2 * nbytes`` lowercase hex digits."""
        ...

    def token(self, nbytes: int) -> str:
        """``nbytes`` random bytes, URL-safe base64 without padding (as ``secrets.token_urlsafe``)."""
        ...

    def uuid(self) -> str:
        """A random (version 4) UUID string."""
        ...


class SystemIds:
    """Cryptographically strong: what servers and clients use."""

    def hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)

    def token(self, nbytes: int) -> str:
        return secrets.token_urlsafe(nbytes)

    def uuid(self) -> str:
        return str(uuid.uuid4())


class SeededIds:
    """Reproducible from ``seed``: never for real credentials."""

    def __init__(self, seed: int | str = 0) -> None:
        self._rng = random.Random(seed)

    def hex(self, nbytes: int) -> str:
        return self._rng.randbytes(nbytes).hex()

    def token(self, nbytes: int) -> str:
        return base64.urlsafe_b64encode(self._rng.randbytes(nbytes)).rstrip(b"=").decode("ascii")

    def uuid(self) -> str:
        return str(uuid.UUID(bytes=self._rng.randbytes(16), version=4))


SYSTEM_IDS: Ids = SystemIds()
