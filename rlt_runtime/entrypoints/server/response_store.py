"""Stored responses of the Responses API: `previous_response_id`, GET/DELETE /v1/responses/{id} and
GET /v1/responses/{id}/input_items.

A response created with `store` (OpenAI's default: true) is kept with its own input items and its
`previous_response_id`; a later request naming it continues the conversation: the input and output
items of every response in the chain, oldest first, come before its own input (instructions are
not carried over, as OpenAI does). The store is an LRU in the server's memory, bounded by a number
of responses and by the size of their JSON; a chain whose older responses were evicted (or
deleted) can no longer be continued. Nothing survives a restart.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from .protocol import ApiError

MAX_PAGE = 100  # input items one GET /v1/responses/{id}/input_items returns at most


@dataclass
class StoredResponse:
    response: dict  # the response object as returned
    input_items: list[dict]  # this request's own input, as items with ids
    size: int  # characters of their JSON


class ResponseStore:
    """At most `max_responses` responses and `max_bytes` characters of their JSON (0: keep none).
    Safe to use from several threads."""

    def __init__(self, max_responses: int, max_bytes: int):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_responses > 0 and self.max_bytes > 0

    def put(self, response: dict, input_items: list[dict]) -> bool:
        """Keep `response` (evicting the least recently used ones); False when it cannot be kept
        (the store is off, or the response alone exceeds its size)."""
        size = len(json.dumps(response)) + len(json.dumps(input_items))
        if not self.enabled or size > self.max_bytes:
            return False
        with self._lock:
            self._drop(response["id"])
            self._entries[response["id"]] = StoredResponse(response, input_items, size)
            self._bytes += size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> Optional[StoredResponse]:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def conversation(self, response_id: str) -> Optional[list[dict]]:
        """The items of the chain ending at `response_id` (each response's input, then its output),
        oldest first; None when a response of the chain is not stored."""
        chain = []
        while response_id is not None:
            entry = self.get(response_id)
            if entry is None:
                return None
            chain.append(entry)
            response_id = entry.response.get("previous_response_id")
        return [item for entry in reversed(chain) for item in (*entry.input_items, *entry.response["output"])]

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None


def input_items_page(items: list[dict], limit: int, order: str, after: Optional[str]) -> dict:
    """OpenAI's page of a stored response's input items: `order` "desc" (the default: newest first)
    or "asc", at most `limit` (1..100) items, those after the item whose id is `after`."""
    if not 1 <= limit <= MAX_PAGE:
        raise ApiError(400, f"limit must be in 1..{MAX_PAGE}, got {limit}", "limit", "invalid_value")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order must be 'asc' or 'desc', got {order!r}", "order", "invalid_value")
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ApiError(400, f"after: the response has no input item {after!r}", "after", "invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}
