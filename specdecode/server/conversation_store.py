"""OpenAI's conversations (the Conversations API, and the Responses API's `conversation`): a conversation is a list of
items that a client adds to (`POST /v1/conversations/{id}/items`) and that every response naming it continues, its
input and output items added when it finishes. The OpenAI Agents SDK keeps a session's history this way.

Kept in memory, in this process, for the last `capacity` conversations (least recently used dropped first, as kept
responses are: one no longer held is a 404 that says so). Each item carries an id (the one it was sent with, else
one given here), by which it is read, deleted, or named by a Responses `item_reference`.
"""
from __future__ import annotations

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


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict] = field(default_factory=list)  # oldest first, each with an id

    def card(self) -> dict:
        """OpenAI's conversation object."""
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationStore:
    """The last `capacity` conversations by id. Used from the server's event loop only (no lock)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a conversation store holds at least one conversation, got {capacity}")
        self.capacity = capacity
        self._held: OrderedDict[str, Conversation] = OrderedDict()

    def create(self, items: list[dict], metadata: dict[str, str] | None) -> Conversation:
        conversation = Conversation("conv_" + uuid.uuid4().hex, int(time.time()), dict(metadata or {}),
                                    [with_id(item) for item in items])
        self._held[conversation.id] = conversation
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
        return conversation

    def get(self, conversation_id: str) -> Conversation | None:
        conversation = self._held.get(conversation_id)
        if conversation is not None:
            self._held.move_to_end(conversation_id)
        return conversation

    def delete(self, conversation_id: str) -> bool:
        return self._held.pop(conversation_id, None) is not None

    def item(self, item_id: str) -> dict | None:
        """A held item by its id, in any conversation (an item_reference's target), or None."""
        for conversation in self._held.values():
            for item in conversation.items:
                if item["id"] == item_id:
                    return item
        return None
