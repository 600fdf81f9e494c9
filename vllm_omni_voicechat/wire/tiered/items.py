"""The projected conversation: items in order, for ``previous_item_id``, retrieve, delete and truncate.

This is the client's view of the history only; the model keeps its own running context (a duplex model has heard
everything), so deleting an item never edits the model.
"""

from __future__ import annotations

import copy
from typing import Any


class ItemStore:
    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    def add(self, item: dict[str, Any]) -> str | None:
        """Append (or replace in place) an item; returns the id of the item before it."""
        item_id = item["id"]
        if item_id in self._items:
            ids = list(self._items)
            i = ids.index(item_id)
            self._items[item_id] = item
            return ids[i - 1] if i else None
        previous = self.last_id
        self._items[item_id] = item
        return previous

    def get(self, item_id: str) -> dict[str, Any] | None:
        item = self._items.get(item_id)
        return copy.deepcopy(item) if item is not None else None

    def update(self, item_id: str, **fields: Any) -> None:
        if item_id in self._items:
            self._items[item_id].update(fields)

    def delete(self, item_id: str) -> bool:
        return self._items.pop(item_id, None) is not None

    def previous_of(self, item_id: str) -> str | None:
        ids = list(self._items)
        if item_id not in self._items:
            return self.last_id
        i = ids.index(item_id)
        return ids[i - 1] if i else None
