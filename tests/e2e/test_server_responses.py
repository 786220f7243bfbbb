"""OpenAI's Responses API (`POST /v1/responses`) with the official `openai` client, on a tiny random Llama whose chat
template teaches Hermes' <tool_call> format: a reply is the chat endpoint's for the same conversation (text, usage,
forced calls, a JSON schema), for every served drafter, whole and streamed; a reply that ends is complete and one
the token cap cuts incomplete; a conversation's calls and their outputs reach the template as chat's do; text and
calls come out as items in the order the model wrote them; a kept response is continued by `previous_response_id`
as the chat endpoint's whole conversation, returned by GET and removed by DELETE, and one not held is a 400 (a 404
for GET and DELETE); and what the server does not implement is a 400 naming the field."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specdecode.core.target import Target
from specdecode.server.protocol.tools import HERMES, Reading
from specdecode.server.routes.responses import ResponsesRequest, ResponseWriter
from specdecode.server.scheduling.scheduler import Finished, RequestStats, TextDelta
from specdecode.server.stores.response_store import Kept, ResponseStore
from tests.e2e.server_util import MODEL, ScriptedTicket, assert_same_logprobs, openai_client, serving, tiny_service
from tests.tiny import tool_tokenizer

ADD = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                    "b": {"type": "integer"}},
                                     "required": ["a", "b"], "additionalProperties": False}}
ASK = "What is 1 + 2?"
RULES = "Answer in one word."


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


def chat(client, **request):
    return client.chat.completions.create(model=MODEL, temperature=0, messages=[
        {"role": "system", "content": RULES}, {"role": "user", "content": ASK}], **request)


def streamed(client, **request) -> tuple[str, list, object]:
    """The stream's text deltas joined, its event types in order, and its final response (the last event's:
    `response.completed`, or `response.incomplete`, which the SDK's get_final_response() does not read)."""
    deltas, kinds = [], []
    request = {"instructions": RULES, "input": ASK, **request}
    stream = client.responses.create(model=MODEL, temperature=0, stream=True, **request)
    for event in stream:
        kinds.append(event.type)
        deltas += [event.delta] if event.type == "response.output_text.delta" else []
    return "".join(deltas), kinds, event.response


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "layer-skip"])
def test_a_reply_is_the_chat_endpoints_whole_and_streamed(client, drafter):
    speculation = {"speculation": {"drafter": drafter}}
    expected = chat(client, max_tokens=60, extra_body=speculation)
    assert expected.choices[0].finish_reason == "stop"  # the tiny model writes its EOS early here
    reply = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=60,
                                    extra_body=speculation)
    assert reply.output_text == expected.choices[0].message.content and reply.object == "response"
    assert reply.usage.input_tokens == expected.usage.prompt_tokens
    assert reply.usage.output_tokens == expected.usage.completion_tokens
    assert (reply.status, reply.incomplete_details) == ("completed", None)
    for cap, status in ((60, "completed"), (4, "incomplete")):
        text, kinds, final = streamed(client, max_output_tokens=cap, extra_body=speculation)
        assert text == final.output_text and final.status == status and final.usage.output_tokens <= cap
        assert reply.output_text.startswith(text) and (cap == 4 or text == reply.output_text)
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"]
        assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                              f"response.{status}"]
    cut = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=4)
    assert (cut.status, cut.incomplete_details.reason, cut.usage.output_tokens) == ("incomplete", "max_output_tokens",
                                                                                    4)
    as_list = client.responses.create(model=MODEL, temperature=0, max_output_tokens=60, extra_body=speculation,
                                      input=[{"role": "system", "content": RULES},
                                             {"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": ASK}]}])
    assert as_list.output_text == reply.output_text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "add"}])
def test_a_forced_call_is_the_chat_endpoints_call(client, choice):
    tools = [{"type": "function", "function": ADD}]
    chat_choice = choice if isinstance(choice, str) else {"type": "function", "function": {"name": "add"}}
    expected = chat(client, max_tokens=200, tools=tools, tool_choice=chat_choice,
                    parallel_tool_calls=False).choices[0].message.tool_calls
    reply = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=200,
                                    tools=[{"type": "function", **ADD}], tool_choice=choice, parallel_tool_calls=False)
    calls = [(item.name, item.arguments) for item in reply.output]
    assert [item.type for item in reply.output] == ["function_call"] * len(expected)
    assert calls == [(call.function.name, call.function.arguments) for call in expected]
    assert all(item.call_id.startswith("call_") for item in reply.output) and reply.status == "completed"
    _, kinds, final = streamed(client, max_output_tokens=200, tools=[{"type": "function", **ADD}], tool_choice=choice,
                               parallel_tool_calls=False)
    assert [(item.name, item.arguments) for item in final.output] == calls
    assert kinds.count("response.function_call_arguments.done") == len(calls)


def test_a_json_schema_format_is_the_chat_endpoints_response_format(client):
    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}}, "required": ["word"],
              "additionalProperties": False}
    expected = chat(client, max_tokens=60, response_format={"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema}})
    reply = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=60,
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert reply.output_text == expected.choices[0].message.content and "word" in json.loads(reply.output_text)


@pytest.mark.parametrize("asked", [{"include": ["message.output_text.logprobs"]}, {"top_logprobs": 2}])
def test_the_output_texts_logprobs_are_the_chat_endpoints(client, asked):
    """include's message.output_text.logprobs (or top_logprobs alone): each output token's logprob and top-N as the
    chat endpoint gives them, whole and streamed (each delta its tokens', the done event all of them)."""
    top = asked.get("top_logprobs", 0)
    expected = chat(client, max_tokens=8, logprobs=True, top_logprobs=top).choices[0].logprobs.model_dump()["content"]
    reply = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=8,
                                    **asked)
    assert len(expected) == 8
    assert_same_logprobs(reply.output[0].content[0].model_dump()["logprobs"], expected)
    assert reply.top_logprobs == top
    stream = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=8,
                                     stream=True, **asked)
    deltas, done = [], None
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas += [entry.model_dump() for entry in event.logprobs]
        elif event.type == "response.output_text.done":
            done = [entry.model_dump() for entry in event.logprobs]
    assert deltas == done
    assert_same_logprobs(done, expected)
    assert client.responses.create(model=MODEL, temperature=0, input=ASK, max_output_tokens=2).output[0].content[
        0].logprobs == []  # not asked: none


def test_a_conversations_calls_and_outputs_reach_the_template(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    expected = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=4, tools=[{"type": "function", "function": ADD}], messages=[
            {"role": "user", "content": ASK}, {"role": "assistant", "content": "Adding.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"}])
    reply = client.responses.create(model=MODEL, temperature=0, max_output_tokens=4,
                                    tools=[{"type": "function", **ADD}], input=[
        {"role": "user", "content": ASK}, {"role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"}])
    assert reply.usage.input_tokens == expected.usage.prompt_tokens
    assert reply.output_text == expected.choices[0].message.content


@pytest.mark.parametrize("size", [7, 1000])  # the text in pieces of 7 characters, or in one step
def test_text_and_calls_come_out_as_items_in_the_models_order(size):
    text = 'Adding. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> Done.'
    stats = RequestStats(30, 20, 20, 1.0, 0.0, "none")
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    events = [*(TextDelta(piece, (0,)) for piece in pieces), Finished("stop", stats)]
    req = ResponsesRequest.model_validate({"model": MODEL, "input": ASK})
    reading = Reading(HERMES, frozenset({"add"}))
    whole = asyncio.run(ResponseWriter(MODEL, req, reading).whole(ScriptedTicket(events)))
    shape = [(item["type"], item.get("content", [{}])[0].get("text"), item.get("arguments")) for item in
             whole["output"]]
    assert shape == [("message", "Adding.", None), ("function_call", None, '{"a": 1, "b": 2}'),
                     ("message", " Done.", None)]

    async def stream() -> list[dict]:
        return [json.loads(body.split("data: ", 1)[1]) async for body in
                ResponseWriter(MODEL, req, reading).events(ScriptedTicket(events))]
    bodies = asyncio.run(stream())
    assert [body["sequence_number"] for body in bodies] == list(range(len(bodies)))
    final = bodies[-1]["response"]
    assert bodies[-1]["type"] == "response.completed"
    assert [(item["type"], item.get("content", [{}])[0].get("text"), item.get("arguments"))
            for item in final["output"]] == shape
    done = [body["item"]["type"] for body in bodies if body["type"] == "response.output_item.done"]
    assert done == ["message", "function_call", "message"]


def test_a_follow_up_continues_the_kept_conversation_as_chat_would(client):
    """previous_response_id: the chain's input and output items, oldest first, then the new input; the earlier
    requests' instructions are not carried on (OpenAI's rule), the new one's are."""
    first = client.responses.create(model=MODEL, temperature=0, instructions=RULES, input=ASK, max_output_tokens=6)
    assert first.store and first.previous_response_id is None
    call = client.responses.create(model=MODEL, temperature=0, previous_response_id=first.id, max_output_tokens=200,
                                   input="Add them.", tools=[{"type": "function", **ADD}], tool_choice="required",
                                   parallel_tool_calls=False)
    (made,) = call.output
    text, _, last = streamed(client, previous_response_id=call.id, max_output_tokens=6,
                             tools=[{"type": "function", **ADD}],  # tools are the request's own, as instructions
                             input=[{"type": "function_call_output", "call_id": made.call_id, "output": "3"}])
    assert last.previous_response_id == call.id and last.store
    expected = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=6, messages=[
        {"role": "system", "content": RULES}, {"role": "user", "content": ASK},
        {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Add them."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": made.call_id, "type": "function", "function": {
            "name": made.name, "arguments": made.arguments}}]},
        {"role": "tool", "tool_call_id": made.call_id, "content": "3"}], tools=[{"type": "function", "function": ADD}])
    assert last.usage.input_tokens == expected.usage.prompt_tokens  # the whole conversation reached the template
    assert text == last.output_text == expected.choices[0].message.content
    again = client.responses.create(model=MODEL, temperature=0, previous_response_id=first.id, max_output_tokens=6,
                                    input="Add them.")  # the first turn's instructions are not carried on
    alone = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=6, messages=[
        {"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Add them."}])
    assert again.usage.input_tokens == alone.usage.prompt_tokens
    assert again.output_text == alone.choices[0].message.content


def test_an_item_reference_reads_the_kept_item_it_names(server, client):
    """A client that resends the conversation may name a kept item by id (Codex does): the request is then the one
    with that item written out."""
    tools = [{"type": "function", **ADD}]
    first = client.responses.create(model=MODEL, temperature=0, input=ASK, max_output_tokens=200, tools=tools,
                                    tool_choice="required", parallel_tool_calls=False)
    (made,) = first.output
    output = {"type": "function_call_output", "call_id": made.call_id, "output": "3"}
    written = client.responses.create(model=MODEL, temperature=0, max_output_tokens=6, tools=tools, input=[
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": made.call_id, "name": made.name, "arguments": made.arguments}, output])
    named = client.responses.create(model=MODEL, temperature=0, max_output_tokens=6, tools=tools, input=[
        {"role": "user", "content": ASK}, {"type": "item_reference", "id": made.id}, output])
    assert named.usage.input_tokens == written.usage.input_tokens and named.output_text == written.output_text
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": [
        {"role": "user", "content": ASK}, {"type": "item_reference", "id": "fc_nope"}]})
    error = reply.json()["error"]
    assert reply.status_code == 400 and (error["param"], error["code"]) == ("input.1.id", "item_not_found")
    continued = ResponsesRequest.model_validate({"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]})
    continued = continued.after([{"role": "user", "content": "a"}])  # a chain's items stay ahead of the references
    assert [item.text() for item in continued.referenced({"x": {"role": "assistant", "content": "b"}}.get).items()] \
        == ["a", "b"]


def test_a_kept_response_is_returned_and_deleted_and_one_not_held_is_refused(server, client):
    kept = client.responses.create(model=MODEL, temperature=0, input=ASK, max_output_tokens=4)
    assert client.responses.retrieve(kept.id).model_dump() == kept.model_dump()
    unkept = client.responses.create(model=MODEL, temperature=0, input=ASK, max_output_tokens=4, store=False)
    assert not unkept.store
    deleted = httpx.delete(f"{server.url}/v1/responses/{kept.id}")
    assert deleted.status_code == 200 and deleted.json() == {"id": kept.id, "object": "response", "deleted": True}
    for response_id in (kept.id, unkept.id, "resp_nope"):
        for method in ("GET", "DELETE"):
            reply = httpx.request(method, f"{server.url}/v1/responses/{response_id}")
            assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found", (method, reply.text)
        reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": ASK,
                                                               "previous_response_id": response_id})
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == "previous_response_id", reply.text
        assert error["code"] == "previous_response_not_found" and "\n" not in error["message"]


def test_a_kept_responses_input_items_are_listed_with_ids_and_paged(server, client):
    """OpenAI's GET /v1/responses/{id}/input_items: the response's own input (not its chain's), each item with an
    id (one given to an item sent without), newest first by default; an id given stays."""
    sent = [{"role": "user", "content": "first"}, {"type": "message", "role": "user", "content": "second"},
            {"id": "msg_mine", "type": "message", "role": "user", "content": "third"}]
    first = client.responses.create(model=MODEL, temperature=0, input="earlier", max_output_tokens=2)
    kept = client.responses.create(model=MODEL, temperature=0, input=sent, max_output_tokens=2,
                                   previous_response_id=first.id)
    listed = client.responses.input_items.list(kept.id)
    assert [item.content for item in listed.data] == ["third", "second", "first"]  # its own input only
    ids = [item.id for item in listed.data]
    assert ids[0] == "msg_mine" and all(i.startswith("msg_") for i in ids) and len(set(ids)) == 3
    oldest = client.responses.input_items.list(kept.id, order="asc", limit=2)
    assert [item.id for item in oldest.data] == ids[::-1][:2] and oldest.has_more
    rest = client.responses.input_items.list(kept.id, order="asc", after=oldest.data[-1].id)
    assert [item.id for item in rest.data] == [ids[0]] and not rest.has_more
    again = client.responses.create(model=MODEL, temperature=0, max_output_tokens=2, input=[  # ids name kept items
        {"type": "item_reference", "id": ids[1]}, {"role": "user", "content": "more"}])
    assert again.usage.input_tokens > 0
    for query, param in (("limit=101", "limit"), ("order=up", "order"), ("after=msg_none", "after"),
                         ("include=x", "include")):
        reply = httpx.get(f"{server.url}/v1/responses/{kept.id}/input_items?{query}")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
    assert httpx.get(f"{server.url}/v1/responses/resp_nope/input_items").status_code == 404


def test_the_store_keeps_the_last_responses_and_a_chain_missing_a_link_is_not_continued():
    store = ResponseStore(2)
    for name, previous in (("a", None), ("b", "a"), ("c", "b")):
        store.put(name, Kept({"id": name}, ({"role": "user", "content": name},), previous))
    assert store.get("a") is None and len(store) == 2  # the oldest went for room
    assert store.conversation("c") is None  # c continues b, which continues a: no longer whole
    store.put("d", Kept({"id": "d"}, ({"role": "user", "content": "d"},), None))  # c goes: the walk read b after it
    assert store.get("c") is None
    store.put("e", Kept({"id": "e"}, ({"role": "user", "content": "e"}, {"id": "msg_e", "role": "assistant"}), "d"))
    assert store.get("b") is None and [item.get("content") for item in store.conversation("e")] == ["d", "e", None]
    assert store.item("msg_e") == {"id": "msg_e", "role": "assistant"}
    assert store.delete("e") and store.item("msg_e") is None  # an item goes with its response


def test_the_store_is_bounded_by_bytes():
    """Kept input items hold every field they were sent with, read by the model or not: the bytes, not the count,
    bound the store. The least recently used go for room; the newest is kept whatever its size."""
    store = ResponseStore(100, max_bytes=3000)
    for name in "abc":
        store.put(name, Kept({"id": name, "output": []}, ({"role": "user", "content": name * 1000},), None, 1))
    assert store.get("a") is None and store.get("b") is not None and store.nbytes <= 3000
    store.put("d", Kept({"id": "d", "output": []}, ({"role": "user", "content": "d" * 5000},), "c", 1))
    assert len(store) == 1 and store.get("d") is not None and store.conversation("d") is None
    assert store.delete("d") and store.nbytes == 0


def test_kept_responses_are_bounded_by_bytes_and_metadata_as_openai_bounds_it(target):
    with serving(tiny_service(target, responses_bytes=20_000)) as running:
        url = running.url + "/v1/responses"
        ids = []
        for _ in range(3):
            padded = {"role": "user", "content": ASK, "unread": "x" * 8000}
            reply = httpx.post(url, json={"model": MODEL, "input": [padded], "max_output_tokens": 2}, timeout=30)
            assert reply.status_code == 200 and reply.json()["store"] is True, reply.text
            ids.append(reply.json()["id"])
        assert httpx.get(f"{url}/{ids[0]}", timeout=30).status_code == 404  # dropped for room
        assert httpx.get(f"{url}/{ids[2]}", timeout=30).status_code == 200
        follow = httpx.post(url, json={"model": MODEL, "input": ASK, "previous_response_id": ids[0]}, timeout=30)
        assert follow.status_code == 400 and "within 20000 bytes" in follow.json()["error"]["message"]
        for metadata in ({"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}):
            reply = httpx.post(url, json={"model": MODEL, "input": ASK, "metadata": metadata}, timeout=30)
            assert reply.status_code == 400 and reply.json()["error"]["param"] == "metadata", reply.text


def test_a_server_that_keeps_none_answers_store_false_and_refuses_a_follow_up(target):
    with serving(tiny_service(target, responses_kept=0)) as running:
        reply = httpx.post(running.url + "/v1/responses", json={"model": MODEL, "input": ASK, "max_output_tokens": 2})
        assert reply.status_code == 200 and reply.json()["store"] is False
        follow = httpx.post(running.url + "/v1/responses", json={"model": MODEL, "input": ASK,
                                                                 "previous_response_id": reply.json()["id"]})
        assert follow.status_code == 400 and "--responses-store" in follow.json()["error"]["message"]
        assert httpx.get(f"{running.url}/v1/responses/{reply.json()['id']}").status_code == 404


@pytest.mark.parametrize("fields,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include.0"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2, "tools": [{"type": "function", **ADD}]}, "top_logprobs"),
    ({"truncation": "auto"}, "truncation"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "add"}]}, "input.0.arguments"),
    ({"input": []}, "input"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools.0.name"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "nope"}}}}, "text.format"),
    ({"text": {"verbosity": "high"}}, "text.verbosity"),
    ({"speculation": {"drafter": "nope"}}, "speculation.drafter"),
    ({"speculation": {"trace": True}, "stream": True}, "speculation.trace"),
])
def test_what_the_server_does_not_implement_is_a_400_naming_the_field(server, fields, param):
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": ASK, **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"] and "max_completion_tokens" not in error["message"]


def test_an_empty_content_array_is_a_400_naming_the_item(server):
    """A message item of no parts was read as an empty text (OpenAI refuses it); a content of "" stays a text."""
    items = [{"type": "message", "role": "user", "content": ASK}, {"type": "message", "role": "user", "content": []}]
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": items, "max_output_tokens": 2})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "input.1.content",
                                                              "invalid_value")
    assert "empty" in error["message"] and "\n" not in error["message"]
    items[1]["content"] = ""
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": items, "max_output_tokens": 2})
    assert reply.status_code == 200, reply.text
