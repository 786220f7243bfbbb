"""Tool calls through the server, with the official `openai` client (tiny random Llama, byte tokenizer, a chat
template that teaches Hermes' <tool_call> format): a forced call equals plain constrained decoding of the prompt
with the tools in it, streams give the calls a whole reply gives, "auto" reads calls out of the model's own text
(here made to write one by a regex structure) and keeps text that calls nothing exactly, parallel_tool_calls false
ends the reply after its first call, a conversation's calls and tool results reach the template, and requests the
server cannot serve as asked are 400s naming the field."""
from __future__ import annotations

import json

import httpx
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.tools import HERMES, Reading, forced_calls, read_calls
from tests.e2e.server_util import MODEL, SPEC, openai_client, serving, tiny_service
from tests.tiny import tool_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
                   "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SUM = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


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


def prompt_ids(target: Target, messages: list[dict], tools: list[dict] | None = TOOLS) -> list[int]:
    encoded = target.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def plain(target: Target, ids: list[int], max_tokens: int, structure: Structure | None = None) -> str:
    """The prompt decoded alone, greedy, without speculation."""
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SPEC, max_batch=1)
    return engine.generate(ids, SamplingConfig(), GenerationConfig(max_tokens, structure=structure)).text


def calls(message) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or []]


def streamed(client, **request) -> tuple[str | None, list[tuple[str, str]], str]:
    """A streamed reply's content (None when it had none), its calls (each whole in one chunk) and finish reason."""
    content, found, finish = [], {}, None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **request):
        delta = chunk.choices[0].delta
        content += [delta.content] if delta.content else []
        for call in delta.tool_calls or []:
            assert call.index == len(found) and call.id.startswith("call_") and call.type == "function"
            found[call.index] = (call.function.name, call.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content) or None, list(found.values()), finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_call_equals_plain_constrained_decoding(client, target, choice):
    """Speculation on (prompt lookup), the tools in the prompt through the template: the call is the one plain
    greedy decoding gives under the same grammar, whole and streamed."""
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=200, temperature=0)
    shown = TOOLS if choice == "required" else [ADD]
    grammar = forced_calls(HERMES, [s.Tool.model_validate(tool) for tool in shown], choice != "required", set())
    text = plain(target, prompt_ids(target, ASK), 200, Structure.grammar(grammar))
    expected = read_calls(Reading(HERMES, frozenset()), text)
    message = reply.choices[0].message
    assert expected[1] and calls(message) == [(call.name, call.arguments) for call in expected[1]]
    assert message.content == expected[0]
    assert reply.usage.prompt_tokens == len(prompt_ids(target, ASK))
    for name, arguments in calls(message):
        assert name in {"get_weather", "add"} and isinstance(json.loads(arguments), dict)
    if choice != "required":
        assert [name for name, _ in calls(message)] == ["add"] and reply.choices[0].finish_reason == "tool_calls"
    for trace in (False, True):  # a traced stream's chunks carry the same content and calls
        assert streamed(client, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=200, temperature=0,
                        extra_body={"speculation": {"trace": trace}}) == (message.content, calls(message),
                                                                          reply.choices[0].finish_reason)


def test_auto_reads_calls_from_the_models_text_and_leaves_other_text_alone(client, target):
    """A regex structure makes the tiny model write a call; "auto" reads it (whole and streamed). With no call in
    the text, the reply is plain decoding's text exactly, from the prompt with the tools in it."""
    regex = {"regex": "Adding\\. " + SUM.replace("{", "\\{").replace("}", "\\}")}
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0,
                                           extra_body={"structured_outputs": regex})
    assert reply.choices[0].message.content == "Adding."
    assert calls(reply.choices[0].message) == [("add", '{"a": 1, "b": 2}')]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert streamed(client, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0,
                    extra_body={"structured_outputs": regex}) == ("Adding.", [("add", '{"a": 1, "b": 2}')],
                                                                  "tool_calls")
    free = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0)
    assert free.choices[0].message.tool_calls is None
    assert free.choices[0].message.content == plain(target, prompt_ids(target, ASK), 40)
    assert httpx.post(str(client.base_url).replace("/v1/", "/tokenize"), json={
        "model": MODEL, "messages": ASK, "tools": TOOLS}).json()["tokens"] == prompt_ids(target, ASK)
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8,
                                          temperature=0)
    assert none.usage.prompt_tokens == len(prompt_ids(target, ASK, None))  # "none": the tools are not shown


def test_a_call_of_no_offered_tool_comes_back_as_the_model_wrote_it(client):
    """Under "auto" the model may call what was not offered, with a name OpenAI's rule would refuse in a request:
    the reply carries it as written (the client answers it), never a 500."""
    regex = {"regex": '<tool_call>\n\\{"name": "look up", "arguments": \\{\\}\\}\n</tool_call>'}
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0,
                                           extra_body={"structured_outputs": regex})
    assert calls(reply.choices[0].message) == [("look up", "{}")]


def test_parallel_tool_calls_false_ends_the_reply_after_its_first_call(client):
    regex = {"regex": (SUM + "\n" + SUM).replace("{", "\\{").replace("}", "\\}")}
    for parallel, expected in ((None, 2), (False, 1)):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200, temperature=0,
                                               extra_body={"structured_outputs": regex,
                                                           "parallel_tool_calls": parallel})
        assert len(calls(reply.choices[0].message)) == expected
        assert reply.choices[0].message.content is None and reply.choices[0].finish_reason == "tool_calls"
        assert "stop_reason" not in reply.choices[0].model_extra  # the call's end is the server's stop, not one asked
    one = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=200, temperature=0)
    assert len(calls(one.choices[0].message)) == 1


def test_a_conversations_calls_and_results_reach_the_template(client, target):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=4, temperature=0)
    as_read = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_1"}]
    assert reply.usage.prompt_tokens == len(prompt_ids(target, as_read))
    text = target.tokenizer.decode(prompt_ids(target, as_read))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text


def test_choices_each_read_their_calls(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", n=2,
                                           max_tokens=200, temperature=0)
    assert [calls(choice.message) for choice in reply.choices][0] == calls(reply.choices[1].message)
    assert all(choice.message.tool_calls for choice in reply.choices)


@pytest.mark.parametrize("fields,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice.function.name"),
    ({"tools": [ADD, ADD]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}}], "tool_choice": "required"},
     "tools.1.function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "not json"}}]},
        {"role": "user", "content": "hi"}]}, "messages.0.tool_calls.0.function.arguments"),
])
def test_requests_the_server_cannot_serve_as_asked_are_400s(server, fields, param):
    reply = httpx.post(server.url + "/v1/chat/completions",
                       json={"model": MODEL, "messages": ASK, "max_tokens": 4, **fields})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param and "\n" not in reply.json()["error"]["message"]


def test_a_template_without_a_calling_format_serves_no_tools(tiny_target):
    """The tiny default template shows no tools: a request with tools, or with calls in its conversation, is a 400
    (the model would never see them), and /openapi.json says tools must be empty."""
    with serving(tiny_service(tiny_target)) as running:
        reply = httpx.post(running.url + "/v1/chat/completions",
                           json={"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools"
        assert httpx.post(running.url + "/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [*ASK, {"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]}
        ).json()["error"]["param"] == "messages.1.tool_calls"
        assert httpx.post(running.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": ASK, "tools": [], "tool_choice": "auto", "max_tokens": 2}).status_code == 200
        schemas = httpx.get(running.url + "/openapi.json").json()["components"]["schemas"]
        assert schemas["ChatCompletionRequest"]["properties"]["tools"] == {"enum": [None, []]}
