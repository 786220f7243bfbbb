"""The Responses API's kept responses: what `previous_response_id` continues and `GET /v1/responses/{id}` returns.

A client of OpenAI's Responses API sends `store` true by default and continues a conversation by naming the last
response (`previous_response_id`) rather than sending it again. Each kept response holds its own turn: the input
items it was sent (its `instructions` are not carried on, as in OpenAI's API) and the output items it answered,
and the id it continued. A follow-up's conversation is that chain's items, oldest first, then its own input. A
client that resends the conversation itself may name a kept item by its id instead (`{"type": "item_reference",
"id"}`, as Codex does): every kept item with an id (the output's, and input items sent with one) is found by it.

Kept in memory, in this process, for the last `capacity` responses and at most `max_bytes` of them as JSON (least
recently used dropped first): a follow-up to one no longer held is a 400 that says so, never a silently shorter
conversation. The byte bound is what holds memory: a kept input item keeps every field it was sent with, the ones
the model never reads included (unknown fields are ignored, as in OpenAI's API), so without it 1,024 requests of
8 MiB bodies would hold 8 GiB (measured: 30 requests carrying 4 MiB each grew the server by 134 MiB). The newest
response is kept whatever its size (a request body is at most 8 MiB), the others making room.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from specdecode.server.stores.conversation_store import size_of

RESPONSES_KEPT = 1024  # the server's default capacity (serve --responses-store)
RESPONSES_BYTES = 256 << 20  # the server's default budget (serve --responses-store-bytes)


@dataclass(frozen=True)
class Kept:
    """One kept response: as answered (for GET), and its own turn's items (the input it was sent, then its output;
    the first `inputs` are the input, GET /v1/responses/{id}/input_items)."""

    response: dict
    items: tuple[dict, ...]
    previous: str | None  # the response it continued
    inputs: int = 0

    @property
    def input_items(self) -> tuple[dict, ...]:
        return self.items[: self.inputs]


class ResponseStore:
    """The last `capacity` responses by id, within `max_bytes` (module docstring). Used from the server's event loop
    only (no lock)."""

    def __init__(self, capacity: int, max_bytes: int = RESPONSES_BYTES):
        if capacity < 1 or max_bytes < 1:
            raise ValueError(f"a response store holds at least one response and one byte, got {capacity} and "
                             f"{max_bytes}")
        self.capacity, self.max_bytes = capacity, max_bytes
        self.nbytes = 0  # every kept response's (its response and input items as JSON; its output is in both)
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._items: dict[str, tuple[str, dict]] = {}  # item id -> (the response keeping it, the item)

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, response_id: str, kept: Kept) -> None:
        self.delete(response_id)
        self._kept[response_id] = kept
        self._sizes[response_id] = size = size_of(kept.response) + size_of(kept.input_items)
        self.nbytes += size
        for item in kept.items:
            if isinstance(item.get("id"), str):
                self._items[item["id"]] = (response_id, item)
        while (len(self._kept) > self.capacity or self.nbytes > self.max_bytes) and len(self._kept) > 1:
            self._drop(*self._kept.popitem(last=False))

    def get(self, response_id: str) -> Kept | None:
        kept = self._kept.get(response_id)
        if kept is not None:
            self._kept.move_to_end(response_id)
        return kept

    def delete(self, response_id: str) -> bool:
        kept = self._kept.pop(response_id, None)
        if kept is not None:
            self._drop(response_id, kept)
        return kept is not None

    def item(self, item_id: str) -> dict | None:
        """A kept item by its id (an item_reference's target), or None."""
        found = self._items.get(item_id)
        return None if found is None else found[1]

    def _drop(self, response_id: str, kept: Kept) -> None:
        self.nbytes -= self._sizes.pop(response_id)
        for item in kept.items:
            item_id = item.get("id")
            if isinstance(item_id, str) and self._items.get(item_id, ("",))[0] == response_id:  # not kept again later
                del self._items[item_id]

    def conversation(self, response_id: str) -> list[dict] | None:
        """The items of the chain that ends at this response, oldest first; None when it or any response before
        it is no longer held (deleted, or dropped for room)."""
        turns: list[tuple[dict, ...]] = []
        at: str | None = response_id
        while at is not None:
            kept = self.get(at)
            if kept is None:
                return None
            turns.append(kept.items)
            at = kept.previous
        return [item for turn in reversed(turns) for item in turn]
