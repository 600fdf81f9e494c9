"""The projected conversation: items in order, for ``previous_item_id``, retrieve, delete and truncate.

This is the client's view of the history only; the model keeps its own running context (a duplex model has heard
everything), so deleting an item never edits the model. It is bounded: the last ``MAX_ITEMS`` items, and of the
clients' own items (``conversation.item.create``) at most ``MAX_CLIENT_ITEM_BYTES`` in all; older ones are forgotten
(a retrieve answers ``item_not_found``), as a long session's history would otherwise grow without end.
"""

from __future__ import annotations

import copy
from typing import Any

MAX_ITEMS = 1_000
"""Items kept (a 10-minute session of short turns makes a few hundred)."""
MAX_CLIENT_ITEM_BYTES = 4 << 20
"""The JSON bytes of the client items kept, all together."""
MAX_ITEM_CONTENT_BYTES = 256 << 10
"""One client item's ``content`` as JSON: a larger ``conversation.item.create`` is refused (``event_too_large``)."""


class ItemStore:
    def __init__(self, *, max_items: int = MAX_ITEMS, max_client_bytes: int = MAX_CLIENT_ITEM_BYTES) -> None:
        self._items: dict[str, dict[str, Any]] = {}
        self._sizes: dict[str, int] = {}  # the client items' JSON bytes
        self._client_bytes = 0
        self.max_items = max_items
        self.max_client_bytes = max_client_bytes

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    def add(self, item: dict[str, Any], *, client_bytes: int = 0) -> str | None:
        """Append (or replace in place) an item; returns the id of the item before it. ``client_bytes``: a client
        item's JSON size (it counts against the client items' budget)."""
        item_id = item["id"]
        self._forget_size(item_id)
        if client_bytes:
            self._sizes[item_id] = client_bytes
            self._client_bytes += client_bytes
        if item_id in self._items:
            ids = list(self._items)
            i = ids.index(item_id)
            self._items[item_id] = item
            previous = ids[i - 1] if i else None
        else:
            previous = self.last_id
            self._items[item_id] = item
        self._bound(keep=item_id)
        return previous

    def _bound(self, keep: str) -> None:
        """Forget the oldest items beyond the count, and the oldest client items beyond the byte budget."""
        while len(self._items) > self.max_items:
            self.delete(next(iter(self._items)))
        if self._client_bytes > self.max_client_bytes:
            for item_id in [i for i in self._sizes if i != keep]:
                if self._client_bytes <= self.max_client_bytes:
                    break
                self.delete(item_id)

    def _forget_size(self, item_id: str) -> None:
        self._client_bytes -= self._sizes.pop(item_id, 0)

    def get(self, item_id: str) -> dict[str, Any] | None:
        item = self._items.get(item_id)
        return copy.deepcopy(item) if item is not None else None

    def update(self, item_id: str, **fields: Any) -> None:
        if item_id in self._items:
            self._items[item_id].update(fields)

    def delete(self, item_id: str) -> bool:
        self._forget_size(item_id)
        return self._items.pop(item_id, None) is not None

    def previous_of(self, item_id: str) -> str | None:
        ids = list(self._items)
        if item_id not in self._items:
            return self.last_id
        i = ids.index(item_id)
        return ids[i - 1] if i else None
