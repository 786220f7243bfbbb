"""OpenAI's Conversations API (`/v1/conversations` and its items) with the official `openai` client, on a tiny random
Llama: a response naming a conversation continues its items as the chat endpoint would the whole conversation, and
its input and output join the conversation when it finishes; items are added, listed, read and deleted; and what is
not held, bad items and a server that keeps none are 4xx answers naming the field."""
from __future__ import annotations

import httpx
import openai
import pytest

from specdecode.cli.main import build_parser, main
from specdecode.cli.serve import conversation_bytes
from specdecode.core.target import Target
from specdecode.server.stores.conversation_store import CONVERSATION_BYTES
from tests.e2e.server_util import MODEL, openai_client, serving, tiny_service
from tests.tiny import tool_tokenizer


@pytest.fixture(scope="module")
def target(tiny_model) -> Target:
    return Target(tiny_model, tool_tokenizer())


@pytest.fixture(scope="module")
def server(target):
    with serving(tiny_service(target)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _chat(client, messages: list[dict], max_tokens: int):
    return client.chat.completions.create(model=MODEL, temperature=0, messages=messages, max_tokens=max_tokens)


def test_responses_continue_a_conversation_as_chat_would_and_join_it(client):
    """The Agents SDK's session: a conversation made with an item, then responses naming it, each seeing every
    earlier item (its own input and output joined it), as the chat endpoint sees the whole conversation."""
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}],
                                               metadata={"user": "u1"})
    assert conversation.object == "conversation" and conversation.metadata == {"user": "u1"}
    first = client.responses.create(model=MODEL, temperature=0, conversation=conversation.id, input="How are you?",
                                    max_output_tokens=6)
    assert first.conversation.id == conversation.id
    said = first.output_text
    expected = _chat(client, [{"role": "user", "content": "Hello."}, {"role": "user", "content": "How are you?"}], 6)
    assert said == expected.choices[0].message.content and first.usage.input_tokens == expected.usage.prompt_tokens
    second = client.responses.create(model=MODEL, temperature=0, conversation={"id": conversation.id},
                                     input="And then?", max_output_tokens=5)
    whole = _chat(client, [{"role": "user", "content": "Hello."}, {"role": "user", "content": "How are you?"},
                           {"role": "assistant", "content": said}, {"role": "user", "content": "And then?"}], 5)
    assert second.output_text == whole.choices[0].message.content
    assert second.usage.input_tokens == whole.usage.prompt_tokens
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(item.type, item.role) for item in items] == [("message", "user"), ("message", "user"),
                                                          ("message", "assistant"), ("message", "user"),
                                                          ("message", "assistant")]
    assert items[2].id == first.output[0].id and items[4].id == second.output[0].id
    assert len({item.id for item in items}) == 5


def test_items_are_added_listed_read_and_deleted(client):
    conversation = client.conversations.create()
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "user", "content": "one"}, {"role": "user", "content": "two"},
        {"id": "msg_three", "type": "message", "role": "user", "content": "three"}])
    ids = [item.id for item in added.data]
    assert ids[2] == "msg_three" and all(i.startswith("msg_") for i in ids)
    newest = client.conversations.items.list(conversation.id, limit=2)
    assert [item.id for item in newest.data] == ids[::-1][:2] and newest.has_more
    assert client.conversations.items.retrieve(ids[1], conversation_id=conversation.id).content == "two"
    left = client.conversations.items.delete(ids[1], conversation_id=conversation.id)
    assert left.id == conversation.id
    assert [item.id for item in client.conversations.items.list(conversation.id, order="asc").data] == [ids[0], ids[2]]
    referenced = client.responses.create(model=MODEL, temperature=0, max_output_tokens=2, input=[
        {"type": "item_reference", "id": ids[0]}, {"role": "user", "content": "more"}])
    assert referenced.status in ("completed", "incomplete")  # a conversation's item is found by its id
    updated = client.conversations.update(conversation.id, metadata={"topic": "counting"})
    assert updated.metadata == {"topic": "counting"} and client.conversations.retrieve(conversation.id).metadata == \
        {"topic": "counting"}
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", conversation=conversation.id, max_output_tokens=2)


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/conversations", {"items": [{"type": "reasoning", "summary": []}]}, 400, "items.0.type"),
    ("/v1/conversations", {"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     400, "items.0.content"),
    ("/v1/conversations", {"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
    ("/v1/conversations", {"name": "x"}, 400, "name"),
    ("/v1/conversations", {"items": [{"role": "user", "content": "a", "id": "msg_x"},  # paging by it looped
                                     {"role": "user", "content": "b", "id": "msg_x"}]}, 400, "items.1.id"),
    ("/v1/conversations/conv_none/items", {"items": [{"role": "user", "content": "x"}]}, 404, "conversation_id"),
    ("/v1/responses", {"model": MODEL, "input": "x", "conversation": "conv_none"}, 404, "conversation"),
])
def test_bad_requests_are_4xx_naming_the_field(server, path, body, status, param):
    reply = httpx.post(server.url + path, json=body, timeout=30)
    assert reply.status_code == status and reply.json()["error"]["param"] == param, reply.text


def test_a_server_that_keeps_no_responses_keeps_no_conversations(target):
    with serving(tiny_service(target, responses_kept=0)) as running:
        client = openai_client(running)
        with pytest.raises(openai.BadRequestError, match="keeps no conversations"):
            client.conversations.create()
        with pytest.raises(openai.BadRequestError, match="keeps none"):
            client.responses.create(model=MODEL, input="x", conversation="conv_x", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve("conv_x")


def _text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_conversations_are_bounded_by_bytes(target):
    """Items added through the API come with no model in the loop: without a bound in bytes a client could add
    items until the server is killed. An add that would take one conversation past the store is a 413 and adds
    nothing; otherwise the least recently used conversations are dropped for room (a 404 then says so)."""
    budget = 3000
    with serving(tiny_service(target, conversation_bytes=budget)) as running:
        url = running.url + "/v1/conversations"
        old = httpx.post(url, json={"items": [_text_item("a" * 1000)]}, timeout=30).json()["id"]
        kept = httpx.post(url, json={"items": [_text_item("b" * 1000)]}, timeout=30).json()["id"]
        assert httpx.get(f"{url}/{old}", timeout=30).status_code == 200  # now the more recently used
        over = httpx.post(f"{url}/{kept}/items", json={"items": [_text_item("c" * 2000)]}, timeout=30)
        error = over.json()["error"]
        assert over.status_code == 413 and error["param"] == "items" and error["code"] == "conversation_too_large"
        assert "--conversation-store" in error["message"]
        listed = httpx.get(f"{url}/{kept}/items", timeout=30).json()["data"]
        assert [item["content"] for item in listed] == ["b" * 1000]  # nothing of the refused add
        fits = httpx.post(f"{url}/{kept}/items", json={"items": [_text_item("d" * 900)]}, timeout=30)
        assert fits.status_code == 200
        assert httpx.get(f"{url}/{old}", timeout=30).status_code == 404  # dropped for room, least recently used
        assert len(httpx.get(f"{url}/{kept}/items", timeout=30).json()["data"]) == 2
        too_big = httpx.post(url, json={"items": [_text_item("e" * 4000)]}, timeout=30)
        assert too_big.status_code == 413 and too_big.json()["error"]["param"] == "items"
        assert httpx.get(f"{url}/{kept}", timeout=30).status_code == 200  # a refused create drops nothing


def test_a_response_cannot_take_its_conversation_past_the_store(target):
    """A Responses request's input joins the conversation it names when it finishes, and the model reads none of an
    item's unknown fields, so the context does not bound them: input that would take the conversation past the
    store is a 413 before anything runs, and the conversation is left as it was."""
    budget = 3000
    with serving(tiny_service(target, conversation_bytes=budget)) as running:
        made = httpx.post(running.url + "/v1/conversations", json={"items": [_text_item("a " * 300)]}, timeout=30)
        conversation = made.json()["id"]
        padded = {**_text_item("hi"), "unread": "x" * 2600}
        over = httpx.post(running.url + "/v1/responses", json={
            "model": MODEL, "input": [padded], "max_output_tokens": 2, "conversation": conversation}, timeout=30)
        error = over.json()["error"]
        assert over.status_code == 413 and error["param"] == "input" and error["code"] == "conversation_too_large"
        listed = httpx.get(f"{running.url}/v1/conversations/{conversation}/items", timeout=30).json()["data"]
        assert [item["content"] for item in listed] == ["a " * 300]
        fits = httpx.post(running.url + "/v1/responses", json={"model": MODEL, "input": [_text_item("hi")],
                                                               "max_output_tokens": 2, "conversation": conversation},
                          timeout=30)
        assert fits.status_code == 200, fits.text
        listed = httpx.get(f"{running.url}/v1/conversations/{conversation}/items", timeout=30).json()["data"]
        assert len(listed) == 3  # its input and output joined


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/conversations/{id}/items"])
def test_at_most_20_items_a_request(server, path):
    """OpenAI's limit: items are added up to 20 at a time."""
    made = httpx.post(server.url + "/v1/conversations", json={}, timeout=30).json()["id"]
    url = server.url + path.format(id=made)
    reply = httpx.post(url, json={"items": [_text_item(str(i)) for i in range(21)]}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "items", reply.text
    assert httpx.post(url, json={"items": [_text_item(str(i)) for i in range(20)]}, timeout=30).status_code == 200


def test_the_conversation_store_flag(capsys):
    """Replicas share no memory, so a conversation made on one could not be continued on another."""
    parse = build_parser().parse_args
    assert conversation_bytes(parse(["serve"])) == CONVERSATION_BYTES
    assert conversation_bytes(parse(["serve", "--conversation-store", "1MiB"])) == 1 << 20
    assert conversation_bytes(parse(["serve", "--replicas", "2"])) == 0
    assert main(["serve", "--replicas", "2", "--conversation-store", "1MiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--conversation-store needs a single server" in err and "\n" not in err


def test_a_server_with_no_conversation_store_keeps_no_conversations(target):
    with serving(tiny_service(target, conversation_bytes=0)) as running:
        with pytest.raises(openai.BadRequestError, match="--conversation-store"):
            openai_client(running).conversations.create()
        with pytest.raises(openai.BadRequestError, match="keeps none .*--conversation-store"):
            openai_client(running).responses.create(model=MODEL, input="x", conversation="conv_x",
                                                    max_output_tokens=2)


def test_an_added_item_may_not_take_an_id_the_conversation_holds(server):
    """An id already in the conversation is a 400 naming it: listing after that id named two items, and a client
    paging through the conversation got the second one forever."""
    first = {"role": "user", "content": "a", "id": "msg_x"}
    made = httpx.post(server.url + "/v1/conversations", json={"items": [first]}, timeout=30).json()
    items = [{"role": "user", "content": "b"}, {"role": "user", "content": "c", "id": "msg_x"}]
    again = httpx.post(server.url + f"/v1/conversations/{made['id']}/items", json={"items": items}, timeout=30)
    assert again.status_code == 400 and again.json()["error"]["param"] == "items.1.id", again.text
    listed = httpx.get(server.url + f"/v1/conversations/{made['id']}/items", timeout=30).json()
    assert [item["id"] for item in listed["data"]] == ["msg_x"]  # nothing of the refused request was added

