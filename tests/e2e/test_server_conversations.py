"""OpenAI's Conversations API (`/v1/conversations` and its items) with the official `openai` client, on a tiny random
Llama: a response naming a conversation continues its items as the chat endpoint would the whole conversation, and
its input and output join the conversation when it finishes; items are added, listed, read and deleted; and what is
not held, bad items and a server that keeps none are 4xx answers naming the field."""
from __future__ import annotations

import httpx
import openai
import pytest

from specdecode.core.target import Target
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
