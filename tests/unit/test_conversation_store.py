"""The conversation store's accounting: its bytes are its conversations' items and metadata as JSON after every
change, the least recently used conversations go first when it is past its bytes or count (never the one being
added to), a refused add changes nothing, and an item's id finds it until it is deleted or dropped."""
from __future__ import annotations

import pytest

from specdecode.server.stores.conversation_store import ConversationStore, TooLarge, size_of


def _item(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "user", "content": text}
    return item if item_id is None else {"id": item_id, **item}


def _bytes_of(store: ConversationStore, *ids: str) -> int:
    held = [store.get(i) for i in ids]
    return sum(size_of(c.metadata) + sum(size_of(item) for item in c.items) for c in held if c is not None)


def test_bytes_follow_every_change():
    store = ConversationStore(10, 10_000)
    a = store.create([_item("x" * 100, "msg_a")], {"k": "v"})
    assert a.nbytes == store.nbytes == _bytes_of(store, a.id)
    store.add(a, [_item("y" * 50), _item("z")])
    store.set_metadata(a, {"key": "a longer value"})
    assert a.nbytes == store.nbytes == _bytes_of(store, a.id)
    store.remove_item(a, store.item("msg_a"))
    assert a.nbytes == store.nbytes == _bytes_of(store, a.id) and store.item("msg_a") is None
    store.delete(a.id)
    assert store.nbytes == 0


def test_the_least_recently_used_go_for_room_and_a_refused_add_changes_nothing():
    store = ConversationStore(10, 1000)
    old = store.create([_item("o" * 300, "msg_old")], None)
    new = store.create([_item("n" * 300)], None)
    with pytest.raises(TooLarge):
        store.add(new, [_item("big" * 300)])
    assert len(new.items) == 1 and store.nbytes == _bytes_of(store, old.id, new.id)
    store.add(new, [_item("m" * 300)])  # past the store's 1000 with `old`: it goes, not `new`
    assert store.get(old.id) is None and store.item("msg_old") is None and store.get(new.id) is new
    assert store.nbytes == _bytes_of(store, new.id) <= 1000
    store.add(new, [_item("r" * 900)], strict=False)  # a finished response's items join whatever their size
    assert store.get(new.id) is new and store.nbytes == new.nbytes > 1000


def test_count_bounds_too_and_ids_find_the_newest():
    store = ConversationStore(2, 10_000)
    first = store.create([_item("1", "msg_same")], None)
    second = store.create([_item("2", "msg_same")], None)
    assert store.item("msg_same")["content"] == "2"
    store.create([], None)
    assert store.get(first.id) is None and store.item("msg_same")["content"] == "2"
    store.delete(second.id)
    assert store.item("msg_same") is None


def test_an_item_is_found_in_its_conversation_even_when_a_newer_one_took_its_id():
    store = ConversationStore(10, 10_000)
    first = store.create([_item("1", "msg_same"), _item("x", "msg_twin"), _item("x", "msg_twin")], None)
    second = store.create([_item("2", "msg_same")], None)
    assert store.item_in(first, "msg_same")["content"] == "1" and store.item_in(second, "msg_same")["content"] == "2"
    assert store.item_in(second, "msg_none") is None
    last_twin = first.items[2]
    store.remove_item(first, last_twin)  # that very item, not the equal one before it
    assert len(first.items) == 2 and first.items[1] is not last_twin and first.nbytes == _bytes_of(store, first.id)
    assert store.item("msg_twin") is first.items[1]  # the id still finds the item that is left
