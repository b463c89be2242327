"""Stored responses (`store: true`, OpenAI's default), for `previous_response_id` and
GET/DELETE /v1/responses/{id}: a bounded in-memory LRU, one per frontend process. Under
`--api-server-count N` each frontend has its own store, so a follow-up request must reach the
frontend that served the first one (a response another frontend stored is unknown here)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# Responses kept per frontend process; the least recently used goes first beyond this.
MAX_STORED_RESPONSES = 1024


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response object and the conversation that led to it: the input items of
    it and of its predecessors (instructions are not carried over, as OpenAI)."""

    response: dict[str, Any]
    input_items: tuple[dict[str, Any], ...]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a follow-up's input comes after: the inputs, then this response's output."""
        return [*self.input_items, *self.response["output"]]


class ResponseStore:
    """An LRU of `StoredResponse` by response id. Event loop only; not thread-safe."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, stored: StoredResponse) -> None:
        """Keep `stored`, evicting the least recently used beyond `capacity`."""
        key = stored.response["id"]
        self._entries[key] = stored
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None."""
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        """Forget it; False if it was not stored."""
        return self._entries.pop(response_id, None) is not None
