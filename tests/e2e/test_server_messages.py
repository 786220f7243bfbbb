"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) with the official `anthropic` client,
on a tiny random Llama whose chat template teaches Hermes' <tool_call> format: a reply is the chat endpoint's for the
same conversation (text, usage, stop sequences, forced tool uses, a JSON schema), for every served drafter, whole
and streamed, with Anthropic's stop reasons; a conversation's tool uses and results reach the template as chat's
calls and tool messages do; text and tool uses come out as blocks in the model's order; Anthropic's x-api-key
header authorizes; and what the server does not implement is a 400 naming the field."""
from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

from specdecode.core.target import Target
from specdecode.server.protocol.tools import HERMES, Reading
from specdecode.server.routes.messages import MessagesRequest, MessageWriter
from specdecode.server.scheduling.scheduler import Finished, RequestStats, TextDelta
from tests.e2e.server_util import MODEL, ScriptedTicket, openai_client, serving, tiny_service
from tests.tiny import tool_tokenizer

KEY = "sk-test"
ADD = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                      "b": {"type": "integer"}},
                                       "required": ["a", "b"], "additionalProperties": False}}
ASK = "What is 1 + 2?"
RULES = "Answer in one word."
GREEDY = {"temperature": 0}  # the 2026 client sends sampling settings as extra fields


@pytest.fixture(scope="module")
def target(tiny_model) -> Target:
    return Target(tiny_model, tool_tokenizer())


@pytest.fixture(scope="module")
def server(target):
    with serving(tiny_service(target, api_key=KEY)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def chat_client(server):
    return openai_client(server, KEY)


def chat(chat_client, messages=None, **request):
    return chat_client.chat.completions.create(model=MODEL, temperature=0, messages=messages or [
        {"role": "system", "content": RULES}, {"role": "user", "content": ASK}], **request)


def ask(client, stream: bool = False, extra: dict | None = None, **request):
    body = dict(model=MODEL, system=RULES, messages=[{"role": "user", "content": ASK}],
                extra_body={**GREEDY, **(extra or {})}, **request)
    if not stream:
        return client.messages.create(**body)
    kinds, texts = [], []
    with client.messages.stream(**body) as events:
        for event in events:
            kinds.append(event.type)
            texts += [event.delta.text] if event.type == "content_block_delta" and event.delta.type == "text_delta" \
                else []
        return "".join(texts), kinds, events.get_final_message()


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "layer-skip"])
def test_a_reply_is_the_chat_endpoints_whole_and_streamed(client, chat_client, drafter):
    speculation = {"speculation": {"drafter": drafter}}
    expected = chat(chat_client, max_tokens=60, extra_body=speculation)
    assert expected.choices[0].finish_reason == "stop"  # the tiny model writes its EOS early here
    reply = ask(client, max_tokens=60, extra=speculation)
    assert text_of(reply) == expected.choices[0].message.content and reply.stop_reason == "end_turn"
    assert reply.usage.input_tokens == expected.usage.prompt_tokens
    assert reply.usage.output_tokens == expected.usage.completion_tokens
    text, kinds, final = ask(client, stream=True, max_tokens=60, extra=speculation)
    assert text == text_of(final) == text_of(reply) and final.stop_reason == "end_turn"
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    cut = ask(client, max_tokens=4, extra=speculation)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 4)
    assert text_of(reply).startswith(text_of(cut))


def test_a_stop_sequence_ends_the_text_and_is_named(client, chat_client):
    full = chat(chat_client, max_tokens=60).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 2]
    expected = chat(chat_client, max_tokens=60, stop=[stop]).choices[0].message.content
    reply = ask(client, max_tokens=60, stop_sequences=["\x00", stop])
    assert text_of(reply) == expected and (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    text, _, final = ask(client, stream=True, max_tokens=60, stop_sequences=[stop])
    assert text == expected and (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"}])
def test_a_forced_tool_use_is_the_chat_endpoints_call(client, chat_client, choice):
    chat_choice = "required" if choice["type"] == "any" else {"type": "function", "function": {"name": "add"}}
    expected = chat(chat_client, max_tokens=200, tools=[{"type": "function", "function": {
        "name": "add", "parameters": ADD["input_schema"]}}], tool_choice=chat_choice, parallel_tool_calls=False)
    calls = [(call.function.name, json.loads(call.function.arguments))
             for call in expected.choices[0].message.tool_calls]
    single = {**choice, "disable_parallel_tool_use": True}
    reply = ask(client, max_tokens=200, tools=[ADD], tool_choice=single)
    assert [(block.name, block.input) for block in reply.content] == calls and reply.stop_reason == "tool_use"
    assert all(block.type == "tool_use" and block.id.startswith("toolu_") for block in reply.content)
    _, kinds, final = ask(client, stream=True, max_tokens=200, tools=[ADD], tool_choice=single)
    assert [(block.name, block.input) for block in final.content] == calls and final.stop_reason == "tool_use"


def test_an_output_format_is_the_chat_endpoints_response_format(client, chat_client):
    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"],
              "additionalProperties": False}
    expected = chat(chat_client, max_tokens=60, response_format={"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema}})
    reply = ask(client, max_tokens=60, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert text_of(reply) == expected.choices[0].message.content and "word" in json.loads(text_of(reply))


def test_a_conversations_tool_uses_and_results_reach_the_template(client, chat_client):
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    tools = [{"type": "function", "function": {"name": "add", "parameters": ADD["input_schema"]}}]
    expected = chat(chat_client, max_tokens=4, tools=tools, messages=[
        {"role": "user", "content": ASK}, {"role": "assistant", "content": "Adding.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}, {"role": "user", "content": "And 2 + 2?"}])
    conversation = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "text", "text": "Adding."},
                                          {"type": "tool_use", "id": "call_1", "name": "add",
                                           "input": {"a": 1, "b": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "3"},
                                     {"type": "text", "text": "And 2 + 2?"}]}]
    reply = client.messages.create(model=MODEL, max_tokens=4, tools=[ADD], messages=conversation, extra_body=GREEDY)
    assert reply.usage.input_tokens == expected.usage.prompt_tokens
    assert text_of(reply) == expected.choices[0].message.content
    counted = client.messages.count_tokens(model=MODEL, tools=[ADD], messages=conversation)
    assert counted.input_tokens == expected.usage.prompt_tokens


@pytest.mark.parametrize("size", [7, 1000])  # the text in pieces of 7 characters, or in one step
def test_text_and_tool_uses_come_out_as_blocks_in_the_models_order(size):
    text = 'Adding. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> Done.'
    events = [*(TextDelta(text[i:i + size], (0,)) for i in range(0, len(text), size)),
              Finished("stop", RequestStats(30, 20, 20, 1.0, 0.0, "none"))]
    req = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 20, "messages": [{"role": "user",
                                                                                         "content": ASK}]})
    reading = Reading(HERMES, frozenset({"add"}))
    whole = asyncio.run(MessageWriter(MODEL, req, reading, 30).whole(ScriptedTicket(events)))
    shape = [(block["type"], block.get("text"), block.get("input")) for block in whole["content"]]
    assert shape == [("text", "Adding.", None), ("tool_use", None, {"a": 1, "b": 2}), ("text", " Done.", None)]
    assert whole["stop_reason"] == "tool_use"

    async def stream() -> list[dict]:
        return [json.loads(body.split("data: ", 1)[1]) async for body in
                MessageWriter(MODEL, req, reading, 30).events(ScriptedTicket(events))]
    bodies = asyncio.run(stream())
    starts = [(body["index"], body["content_block"]["type"]) for body in bodies
              if body["type"] == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "text")]
    assert [body["index"] for body in bodies if body["type"] == "content_block_stop"] == [0, 1, 2]
    assert bodies[-2]["delta"]["stop_reason"] == "tool_use"


def test_the_api_key_is_read_from_either_header(server):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ASK}]}
    for headers, status in (({}, 401), ({"x-api-key": "wrong"}, 401), ({"x-api-key": KEY}, 200),
                            ({"authorization": f"Bearer {KEY}"}, 200)):
        assert httpx.post(server.url + "/v1/messages", json=body, headers=headers).status_code == status


@pytest.mark.parametrize("fields,param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
     "messages.0.content"),
    ({"messages": []}, "messages"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 10 ** 6}, "max_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"output_config": {"effort": "high"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, "output_config.format"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"tools": [{"name": "a b", "input_schema": {}}]}, "tools.0.name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [ADD], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [ADD], "tool_choice": {"type": "tool", "name": "sub"}}, "tool_choice.name"),
    ({"temperature": 1.5}, "temperature"),
    ({"speculation": {"trace": True}}, "speculation.trace"),
])
def test_what_the_server_does_not_implement_is_a_400_naming_the_field(server, fields, param):
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}], **fields}
    reply = httpx.post(server.url + "/v1/messages", json={k: v for k, v in body.items() if v is not None},
                       headers={"x-api-key": KEY})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]
    assert "max_completion_tokens" not in error["message"] and "response_format" not in error["message"]


@pytest.mark.parametrize("fields,param", [
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"stop_sequences": ["a", ""]}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": ASK}, {"role": "assistant", "content": []},
                   {"role": "user", "content": ASK}]}, "messages.1.content"),
], ids=["stop", "stop-second", "user-content", "assistant-content"])
def test_an_empty_stop_sequence_or_content_array_is_a_400_naming_the_field(server, fields, param):
    """An empty stop sequence (it matches everywhere) and a message of no blocks were each accepted, the first
    dropped without a word, the second read as an empty text; a content of "" stays a text."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ASK}], **fields}
    paths = ("/v1/messages", "/v1/messages/count_tokens") if "messages" in fields else ("/v1/messages",)
    for path in paths:
        reply = httpx.post(server.url + path, json=body, headers={"x-api-key": KEY})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, "invalid_value")
        assert "empty" in error["message"] and "\n" not in error["message"]
    if "messages" in fields:
        body["messages"] = [{**m, "content": ""} if m["content"] == [] else m for m in fields["messages"]]
        assert httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
