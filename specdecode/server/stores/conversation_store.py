"""OpenAI's conversations (the Conversations API, and the Responses API's `conversation`): a conversation is a list of
items that a client adds to (`POST /v1/conversations/{id}/items`) and that every response naming it continues, its
input and output items added when it finishes. The OpenAI Agents SDK keeps a session's history this way.

Kept in memory, in this process, for the last `capacity` conversations and at most `max_bytes` of their items and
metadata as JSON (least recently used dropped first, as kept responses are: one no longer held is a 404 that says
so). Items added through the API come from a client with no model in the loop, so without the byte bound a client
adding items request after request (up to 8 MiB each) would grow the server until it is killed; an add that would take
one conversation past `max_bytes` is refused whole (TooLarge), and others make room by dropping the least recently
used conversations. A finished response's input and output join its conversation whatever its size (they fit the
model's context, and were answered), the others making room for them. Each item carries an id (the one it was
sent with, else one given here), by which it is read, deleted, or named by a Responses `item_reference`; an index
finds it without a walk through every conversation (the newest item wins an id that several share).
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}  # an item's id, by its type


def with_id(item: dict) -> dict:
    """The item with an id: the one it has, else a new one by its type (OpenAI gives every item an id)."""
    if isinstance(item.get("id"), str):
        return item
    return {"id": PREFIX.get(item.get("type", "message"), "item_") + uuid.uuid4().hex, **item}


CONVERSATION_BYTES = 256 << 20  # the server's default budget (serve --conversation-store)
ITEMS_PER_REQUEST = 20  # items one create or add may carry (OpenAI's limit: "up to 20 items at a time")


def size_of(value: object) -> int:
    """What `value` takes as compact JSON, in bytes: the measure of a conversation's share of the budget."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


class TooLarge(Exception):
    """An add that would take one conversation past the store's budget: refused whole."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size} bytes, over {limit}")
        self.size, self.limit = size, limit


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict] = field(default_factory=list)  # oldest first, each with an id
    nbytes: int = 0  # its items and metadata as JSON (size_of)

    def card(self) -> dict:
        """OpenAI's conversation object."""
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationStore:
    """The last `capacity` conversations by id, within `max_bytes` (module docstring). Used from the server's
    event loop only (no lock)."""

    def __init__(self, capacity: int, max_bytes: int = CONVERSATION_BYTES):
        if capacity < 1 or max_bytes < 1:
            raise ValueError(f"a conversation store holds at least one conversation and one byte, got {capacity} "
                             f"and {max_bytes}")
        self.capacity, self.max_bytes = capacity, max_bytes
        self.nbytes = 0  # every held conversation's
        self._held: OrderedDict[str, Conversation] = OrderedDict()
        self._items: dict[str, tuple[str, dict]] = {}  # item id -> (the conversation holding it, the item)

    def create(self, items: list[dict], metadata: dict[str, str] | None) -> Conversation:
        """A new conversation holding `items`; TooLarge (nothing made) when they and the metadata pass the budget."""
        conversation = Conversation("conv_" + uuid.uuid4().hex, int(time.time()), dict(metadata or {}))
        conversation.nbytes = size_of(conversation.metadata)
        if conversation.nbytes > self.max_bytes:
            raise TooLarge(conversation.nbytes, self.max_bytes)
        self._held[conversation.id] = conversation
        self.nbytes += conversation.nbytes
        try:
            self.add(conversation, items)
        except TooLarge:
            self.delete(conversation.id)
            raise
        self._trim(conversation)
        return conversation

    def check_room(self, conversation: Conversation, items: list[dict]) -> None:
        """TooLarge where `items` (given ids) would take the conversation past the budget."""
        self._fit(conversation, sum(size_of(with_id(item)) for item in items))

    def add(self, conversation: Conversation, items: list[dict], strict: bool = True) -> list[dict]:
        """Append `items` (each given an id: with_id) to a held conversation; -> them as added. strict: TooLarge,
        nothing added, when the conversation would pass the budget (a finished response's items join unchecked:
        its input was checked when it was admitted, check_room, and its output is bounded by its tokens)."""
        added = [with_id(item) for item in items]
        size = sum(size_of(item) for item in added)
        if strict:
            self._fit(conversation, size)
        conversation.items += added
        conversation.nbytes += size
        self.nbytes += size
        for item in added:
            self._items[item["id"]] = (conversation.id, item)
        self._trim(conversation)
        return added

    def set_metadata(self, conversation: Conversation, metadata: dict[str, str]) -> None:
        size = size_of(metadata) - size_of(conversation.metadata)
        conversation.metadata = dict(metadata)
        conversation.nbytes += size
        self.nbytes += size
        self._trim(conversation)

    def remove_item(self, conversation: Conversation, item: dict) -> None:
        """Remove `item` (this very object: another may be equal to it) from the conversation."""
        del conversation.items[next(i for i, held in enumerate(conversation.items) if held is item)]
        self._unindex(conversation.id, item)
        twin = next((held for held in reversed(conversation.items) if held["id"] == item["id"]), None)
        if twin is not None and item["id"] not in self._items:  # another item of it with that id: found by it now
            self._items[item["id"]] = (conversation.id, twin)
        size = size_of(item)
        conversation.nbytes -= size
        self.nbytes -= size

    def get(self, conversation_id: str) -> Conversation | None:
        conversation = self._held.get(conversation_id)
        if conversation is not None:
            self._held.move_to_end(conversation_id)
        return conversation

    def delete(self, conversation_id: str) -> bool:
        conversation = self._held.pop(conversation_id, None)
        if conversation is None:
            return False
        self.nbytes -= conversation.nbytes
        for item in conversation.items:
            self._unindex(conversation_id, item)
        return True

    def item(self, item_id: str) -> dict | None:
        """A held item by its id, in any conversation (an item_reference's target), or None."""
        found = self._items.get(item_id)
        return None if found is None else found[1]

    def item_in(self, conversation: Conversation, item_id: str) -> dict | None:
        """The conversation's item with this id, or None: through the index, and by a walk of the conversation only
        where a newer item elsewhere took the id."""
        found = self._items.get(item_id)
        if found is not None and found[0] == conversation.id:
            return found[1]
        return next((item for item in conversation.items if item["id"] == item_id), None)

    def _fit(self, conversation: Conversation, size: int) -> None:
        if conversation.nbytes + size > self.max_bytes:
            raise TooLarge(conversation.nbytes + size, self.max_bytes)

    def _trim(self, keep: Conversation) -> None:
        """Drop the least recently used conversations other than `keep` while the store is past its count or
        bytes."""
        self._held.move_to_end(keep.id)
        while (len(self._held) > self.capacity or self.nbytes > self.max_bytes) and len(self._held) > 1:
            self.delete(next(iter(self._held)))

    def _unindex(self, conversation_id: str, item: dict) -> None:
        found = self._items.get(item["id"])
        if found is not None and found[0] == conversation_id and found[1] is item:  # not an id kept again since
            del self._items[item["id"]]
